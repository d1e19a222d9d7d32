"""The series in `patches/` apply to the releases they claim and behave exactly like the monkeypatch.

For each release: its sdist (downloaded by scripts/setup.sh) becomes a git repo, the matching series
goes in with `git am`, and the patched accelerate is installed into a temporary folder. Everything
then runs in `.venv-upstream` (scripts/setup.sh), a venv that does not have this package at all, with
ACCELERATE_INORDER_FIX=0 for good measure and the patched accelerate first on PYTHONPATH:

(a) the scenario suite must give the same verdicts as the monkeypatch on the same release. This is
    the one source of truth: the patch files and `_inorder.py` are two spellings of one behaviour,
    and the scenarios (the contract of issue 2) decide whether they still agree;
(b) accelerate's own tests/test_logging.py (where the release has it) and the series' regression
    test must pass, and the same regression test must fail on the unpatched sdist.
"""

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import CACHE, RELEASES, REPO, accelerate_dir, release_line

from accelerate_inorder_fix.tools import launch as _launch
from accelerate_inorder_fix.tools import scenarios


PATCHES = REPO / "patches"
# Upstream release line (conftest.release_line) -> the series written for it.
SERIES = {"0.20": "v0.21-v0.30", "0.31": "v0.31-v1.12", "1.13": "main"}
REGRESSION_TEST = "tests/test_logging_in_order.py"
# Which regression tests the unpatched release fails: 1.13+ only lost the rank-dependent levels case.
UNPATCHED_FAILURES = {
    "0.20": {"test_in_order_default", "test_in_order_main_process_only_false", "test_in_order_rank_dependent_levels"},
    "0.31": {"test_in_order_default", "test_in_order_main_process_only_false", "test_in_order_rank_dependent_levels"},
    "1.13": {"test_in_order_rank_dependent_levels"},
}
NPROC = 2
GIT_ID = {
    "GIT_AUTHOR_NAME": "aif-test",
    "GIT_AUTHOR_EMAIL": "aif-test@localhost",
    "GIT_COMMITTER_NAME": "aif-test",
    "GIT_COMMITTER_EMAIL": "aif-test@localhost",
}


def upstream_python():
    """The interpreter of the venv without this package (scripts/setup.sh creates it)."""
    venv = Path(os.environ.get("AIF_UPSTREAM_VENV", REPO / ".venv-upstream"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{venv} is not set up: run scripts/setup.sh")
    return str(python)


def upstream_env(accelerate_path):
    """Environment for a run without this package: only `accelerate_path` added to sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(accelerate_path), ACCELERATE_INORDER_FIX="0", PYTHONNOUSERSITE="1", OMP_NUM_THREADS="1")
    return env


def series_files(series):
    return sorted((PATCHES / series).glob("*.patch"))


def git(tree, *args):
    # A developer's global config (signed commits) must not change what this throw-away repo does.
    subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=tree,
        env={**os.environ, **GIT_ID},
        check=True,
        capture_output=True,
        text=True,
    )


def checkout_sdist(version, dest):
    """Unpack the release's sdist into a git repo whose one commit, tagged `sdist`, is the sdist."""
    sdist = CACHE / "sdist" / f"accelerate-{version}.tar.gz"
    if not sdist.exists():
        pytest.fail(f"{sdist} is missing: run scripts/setup.sh")
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.12 without the backported filters; our own cached sdist
            tar.extractall(dest)
    tree = dest / f"accelerate-{version}"
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", f"accelerate {version} sdist")
    git(tree, "tag", "sdist")
    return tree


def install(tree, dest):
    """pip-install the tree (no deps) into `dest`, with the interpreter that will run it."""
    subprocess.run(
        [
            upstream_python(),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(dest),
            str(tree),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return dest


def run_pytest(tree, accelerate_path, tests):
    """Run accelerate's own pytest files from `tree` against `accelerate_path`; returns the Job."""
    cmd = [upstream_python(), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *tests]
    return _launch.run(cmd, env=upstream_env(accelerate_path), timeout=240, cwd=str(tree))


def verdicts(job):
    return {name: scenarios.check(name, NPROC, job.lines)[0] for name in scenarios.SCENARIOS}


class Release:
    """One release, patched and unpatched, each installed once for all the checks below."""

    def __init__(self, version, root):
        self.version, self.line = version, release_line(version)
        self.series = SERIES[self.line]
        self.tree = checkout_sdist(version, root)
        git(self.tree, "am", "-q", *map(str, series_files(self.series)))
        git(self.tree, "tag", "patched")
        self.patched = install(self.tree, root / "patched")
        # The unpatched code with the series' tests: the regression test must catch the bug there.
        git(self.tree, "checkout", "-q", "-b", "unpatched", "sdist")
        git(self.tree, "checkout", "-q", "patched", "--", "tests")
        self.unpatched = install(self.tree, root / "unpatched")


@pytest.fixture(scope="module", params=RELEASES)
def release(request, tmp_path_factory):
    return Release(request.param, tmp_path_factory.mktemp(f"accelerate-{request.param}"))


def test_runs_without_this_package(release):
    """The 'upstream' runs really are without this package, and on the patched accelerate.

    Seen from where those runs start: the sdist tree (pytest) and the folder of scenarios.py (its
    workers). Not from this repository's root, where `accelerate_inorder_fix/` is importable.
    """
    code = (
        f"import importlib.util, sys; sys.path.insert(0, {os.path.dirname(_launch.SCENARIO_SCRIPT)!r}); "
        "import accelerate; print(importlib.util.find_spec('accelerate_inorder_fix') is None, "
        "accelerate.__version__, accelerate.__file__)"
    )
    out = subprocess.run(
        [upstream_python(), "-c", code],
        env=upstream_env(release.patched),
        cwd=release.tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out[:2] == ["True", release.version]
    assert Path(out[2]).is_relative_to(release.patched)


def test_scenarios_match_the_monkeypatch(release):
    """(a) Source-patched accelerate, no package: the same verdicts as the monkeypatch, all ordered."""
    names = list(scenarios.SCENARIOS)
    cmd = _launch.launch_command([_launch.SCENARIO_SCRIPT, ",".join(names)], NPROC, python=upstream_python())
    env = _launch.scenario_env(patched=False, base=upstream_env(release.patched))
    # Every scenario must pass here, so a hang is only caught by the deadline; the stall limit is loose
    # because a loaded machine can take seconds to tear a finished job down.
    source = _launch.run(cmd, env=env, timeout=180, stall=30.0, cwd=str(release.tree))
    monkey = _launch.run_scenarios(
        names, NPROC, patched=True, pythonpath=[accelerate_dir(release.version), str(REPO)], timeout=180, stall=30.0
    )
    assert verdicts(source) == verdicts(monkey) == dict.fromkeys(names, "ordered"), (source, source.stderr[-3000:])
    assert source.returncode == 0 and source.killed is None, (source, source.stderr[-3000:])


def test_accelerate_tests_pass_when_patched(release):
    """(b) The release's own test_logging.py and the series' regression test pass on the patched code."""
    tests = [t for t in ("tests/test_logging.py", REGRESSION_TEST) if (release.tree / t).exists()]
    assert REGRESSION_TEST in tests
    job = run_pytest(release.tree, release.patched, tests)
    assert job.returncode == 0 and job.killed is None, "\n".join(job.lines[-60:])
    assert not re.search(r"\d+ (skipped|deselected|xfailed)", job.lines[-1]), job.lines[-1]  # all really ran


def test_regression_test_fails_unpatched(release):
    """(b) The regression test catches the bug on the unpatched sdist, by failing, not by hanging."""
    job = run_pytest(release.tree, release.unpatched, [REGRESSION_TEST])
    failed = set(re.findall(r"^FAILED \S+::(\w+)", "\n".join(job.lines), re.M))
    assert job.killed is None, job
    assert failed == UNPATCHED_FAILURES[release.line], "\n".join(job.lines[-60:])
    assert not any(line.startswith("ERROR") for line in job.lines), "\n".join(job.lines[-60:])


# ---------------------------------------------------------------------------------------------
# No network, no launch: the layout of patches/ itself
# ---------------------------------------------------------------------------------------------


def test_every_patch_file_is_tested():
    """Every file in patches/ is a series the release tests above apply, or the README."""
    tested = {SERIES[release_line(v)] for v in RELEASES}
    for path in PATCHES.rglob("*"):
        if path.is_dir():
            continue
        rel = path.relative_to(PATCHES)
        if rel == Path("README.md"):
            continue
        assert len(rel.parts) == 2 and rel.suffix == ".patch", f"patches/{rel}: not part of any series"
        assert rel.parts[0] in tested, f"patches/{rel}: no release in {RELEASES} applies this series"
    assert tested == set(SERIES.values()) == {p.name for p in PATCHES.iterdir() if p.is_dir()}


def _added_file(patch_text, path):
    """The content a patch gives to the new file `path`, or None."""
    match = re.search(
        rf"^\+\+\+ b/{re.escape(path)}\n@@[^\n]*\n(.*?)(?=^diff --git|^-- \n|\Z)", patch_text, re.M | re.S
    )
    if not match:
        return None
    return "".join(line[1:] + "\n" for line in match.group(1).splitlines() if line.startswith("+"))


def test_series_share_one_regression_test():
    """The regression test is the same file in every series: one test, not three that can drift."""
    bodies = {}
    for series in SERIES.values():
        found = [_added_file(p.read_text(), REGRESSION_TEST) for p in series_files(series)]
        bodies[series] = [b for b in found if b is not None]
        assert len(bodies[series]) == 1, f"{series}: {REGRESSION_TEST} is added {len(bodies[series])} times"
    assert len({b[0] for b in bodies.values()}) == 1


def test_series_are_git_am_ready():
    """Each patch has what `git am` and a reviewer need: From line, author, date, subject, a message."""
    for series in SERIES.values():
        files = series_files(series)
        assert files, series
        for number, path in enumerate(files, 1):
            text = path.read_text()
            assert re.match(r"From [0-9a-f]{40} ", text), path
            for header in ("From: ", "Date: ", f"Subject: [PATCH {number}/{len(files)}] "):
                assert f"\n{header}" in text, (path, header)
            message = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
            assert len(message.split()) > 40, f"{path}: the commit message must explain the change"


def test_series_share_one_fix():
    """The patched `log` body is the same in every series: one fix in three contexts, not three fixes.

    Compared on the patches' post-image from `if not in_order:` to the last barrier; 0.20-0.30 also
    gains upstream's `stacklevel` default, checked on its own.
    """
    bodies = {}
    for series in SERIES.values():
        fix = series_files(series)[0].read_text()
        after = [line[1:] for line in fix.splitlines() if line[:1] in " +" and not line.startswith("+++")]
        first = after.index("        if not in_order:")
        last = after.index("            state.wait_for_everyone()", first)
        bodies[series] = after[first : last + 1]
    assert len({tuple(body) for body in bodies.values()}) == 1, bodies
    backport = series_files(SERIES["0.20"])[0].read_text()
    assert '\n+        kwargs.setdefault("stacklevel", 2)\n' in backport
