"""The series in `patches/` apply to the releases they claim and behave exactly like the monkeypatch.

For each release: its sdist (downloaded by scripts/setup.sh) becomes a git repo, the matching series
goes in with `git am`, and the patched accelerate is installed into a temporary folder. Everything
then runs in `.venv-upstream` (scripts/setup.sh), a venv that does not have this package at all, with
ACCELERATE_INORDER_FIX=0 for good measure and the patched accelerate first on PYTHONPATH:

(a) the scenario suite must give the same verdicts as the monkeypatch on the same release. This is
    the one source of truth: the patch files and `_wrapper.py` are two spellings of one behaviour,
    and the scenarios (the contract `check` judges) decide whether they still agree;
(b) accelerate's own tests/test_logging.py (where the release has it) and the series' regression
    test must pass, and the same regression test must fail on the unpatched sdist, each failing test
    within REGRESSION_BOUND seconds (its gloo timeout, not a deadline of ours, ends it);
(c) the touched Python files pass ruff 0.13.1 (check and format) under the release's own
    pyproject.toml, as `make quality` runs it upstream, on every release that pins that ruff.

Sdists carry no docs/: a series' docs commits (patches touching only docs/) are not applied to them.
Without network, such a patch is checked for form only: docs/ paths, and `git am` onto a fixture
rebuilt from its own context lines. Its check against a real accelerate checkout is manual and
recorded in patches/README.md.
"""

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import CACHE, RELEASES, REPO, accelerate_dir, release_line

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import scenarios


PATCHES = REPO / "patches"
# Upstream release line (conftest.release_line) -> the series written for it.
SERIES = {"0.20": "v0.21-v0.30", "0.31": "v0.31-v1.12", "1.13": "main"}
# The newest tested release of each series' line: every series is proven on a release it targets (each
# tag in its range was checked with `git apply --check` when the series was written; patches/README.md).
PATCH_RELEASES = [
    max((v for v in RELEASES if release_line(v) == line), key=lambda v: tuple(map(int, v.split("."))))
    for line in SERIES
    if any(release_line(v) == line for v in RELEASES)
]
REGRESSION_TEST = "tests/test_logging_in_order.py"
REGRESSION_SCRIPT = "src/accelerate/test_utils/scripts/test_logging_in_order.py"  # run by the test with torchrun
REGRESSION_FILES = (REGRESSION_TEST, REGRESSION_SCRIPT)
# The cheap single-process test goes into the release's own test file (the 0.20-0.30 series creates it).
SINGLE_PROCESS_TEST = "tests/test_logging.py"
HIDDEN_LEVEL_TEST = "test_in_order_hidden_level_still_takes_its_turn"
# 0.20-0.30 lacks `stacklevel` (#2730) and `test_log_stack`: its series, which adds `stacklevel`, also adds a test of
# the call site. From 0.31 on upstream's `test_log_stack` covers it, so the other series do not repeat it.
CALL_SITE_TEST = "test_in_order_logs_once_at_the_call_site"
SINGLE_PROCESS_TESTS = {
    "0.20": {CALL_SITE_TEST, HIDDEN_LEVEL_TEST},
    "0.31": {HIDDEN_LEVEL_TEST},
    "1.13": {HIDDEN_LEVEL_TEST},
}
# Where the series' block of single-process tests starts in tests/test_logging.py (main's block ends every series').
SINGLE_PROCESS_BLOCK = '@pytest.mark.usefixtures("accelerator")\ndef test_in_order_'
# The multi-process test: every scenario in one torchrun launch. It fails on every unpatched release (since #3280,
# 1.13, through the rank-local scenarios only), and so does the single-process one, and on 0.20-0.30 the call site.
ALL_REGRESSION_TESTS = {"test_in_order_logging"}
NEW_TESTS = {line: ALL_REGRESSION_TESTS | tests for line, tests in SINGLE_PROCESS_TESTS.items()}
UNPATCHED_FAILURES = NEW_TESTS
# The multi-process scenarios of the worker script, run in this order by the one launch.
REGRESSION_SCENARIOS = [
    "in_order_default",
    "in_order_main_process_only_false",
    "in_order_rank_dependent_levels",
    "in_order_logging_disabled",
]
# What a call made on some processes only does, in the words of the review (0001, the docs, the PR text).
HANG_OR_DESYNC = "hangs, or desynchronises with the other processes' next collective"
# The worker script's process-group timeout (its COLLECTIVE_TIMEOUT): what ends a deadlock in the regression test.
COLLECTIVE_TIMEOUT = 30
STARTUP = 50  # seconds left to pytest's and torchrun's start-up and teardown around that timeout, on a loaded machine
REGRESSION_BOUND = COLLECTIVE_TIMEOUT + STARTUP  # seconds: an unpatched failing test must fail (not hang) within this
PASS_BOUND = 60  # seconds: the series' new tests, patched, in all
# What upstream sees (the patches, ISSUE.md, PULL_REQUEST.md) holds nothing of ours: no blank, note, link or identity.
INTERNAL = ("____", "(link", "<!--", "users.noreply", "accelerate-inorder-fix", "benchmarks/", "upper bound")
# The one thing the submitter fills in (patches/README.md): the number GitHub gives the issue opened from ISSUE.md.
ISSUE_NUMBER = "#NNNN"
# The patches' author: a reserved domain, never a GitHub account; the submitter applies them as themselves (README).
PATCH_AUTHOR = re.compile(r"^From: [^<\n]+<[^@>]+@[\w.-]+\.invalid>$", re.M)
# The older series carry main's regression files with the helpers their releases lack replaced:
# (file, main's text, the fork's text). Nothing else may differ (test_series_share_one_regression_test).
FORK_SUBSTITUTIONS = {
    "v0.31-v1.12": [
        (REGRESSION_SCRIPT, "    state.destroy_process_group()\n", "    torch.distributed.destroy_process_group()\n"),
    ],
    "v0.21-v0.30": [
        (REGRESSION_SCRIPT, "    state.destroy_process_group()\n", "    torch.distributed.destroy_process_group()\n"),
        (
            REGRESSION_TEST,
            "from accelerate.test_utils import execute_subprocess_async, path_in_accelerate_package, require_cpu\n",
            "from accelerate.test_utils import execute_subprocess_async, require_cpu\n"
            "from accelerate.test_utils.scripts import test_logging_in_order\n",
        ),
        (
            REGRESSION_TEST,
            '    test_file_path = path_in_accelerate_package("test_utils", "scripts", "test_logging_in_order.py")\n',
            "    test_file_path = test_logging_in_order.__file__\n",
        ),
    ],
}
# Releases whose setup.py pins the ruff of upstream's `make quality` today (older ones pinned ruff 0.2 / black).
RUFF = "ruff == 0.13.1"
RUFF_RELEASES = ["1.12.0", "1.13.0", "1.16.0"]
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


def patched_paths(patch):
    """The paths a patch file touches (its `diff --git a/X b/X` lines)."""
    return re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), re.M)


def is_docs_patch(patch):
    return all(path.startswith("docs/") for path in patched_paths(patch))


def code_patches(series):
    """The patches of a series that an sdist (which has no docs/) takes: the fix and its test."""
    return [p for p in series_files(series) if not is_docs_patch(p)]


def docs_patches(series):
    return [p for p in series_files(series) if is_docs_patch(p)]


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
    """Run accelerate's own pytest files from `tree` against `accelerate_path`; returns the Job.

    The hard timeout SIGKILLs the whole job, torchrun's workers included (they run in sessions of
    their own, and `_launch.run` finds them by the marker in their environment).
    """
    cmd = [
        upstream_python(),
        "-m",
        "pytest",
        "-q",
        "-rA",
        "--durations=0",
        "--durations-min=0",
        "-p",
        "no:cacheprovider",
        *tests,
    ]
    # Room for the regression test to fail at its bound, plus test_logging.py and start-up.
    timeout = len(ALL_REGRESSION_TESTS) * REGRESSION_BOUND + 60
    return _launch.run(cmd, env=upstream_env(accelerate_path), timeout=timeout, cwd=str(tree))


def durations(job):
    """{test name: seconds} of the `call` phase, from pytest's --durations report."""
    return {
        name: float(secs) for secs, name in re.findall(r"^([\d.]+)s call\s+\S+::(\w+)$", "\n".join(job.lines), re.M)
    }


def verdicts(job):
    return {name: scenarios.check(name, NPROC, job.lines)[0] for name in scenarios.SCENARIOS}


class Release:
    """One release, patched and unpatched, each installed once for all the checks below."""

    def __init__(self, version, root):
        self.version, self.line = version, release_line(version)
        self.series = SERIES[self.line]
        self.tree = checkout_sdist(version, root)
        git(self.tree, "am", "-q", *map(str, code_patches(self.series)))
        git(self.tree, "tag", "patched")
        self.patched = install(self.tree, root / "patched")
        # The unpatched code with the series' tests: the regression test must catch the bug there.
        git(self.tree, "checkout", "-q", "-b", "unpatched", "sdist")
        git(self.tree, "checkout", "-q", "patched", "--", "tests", REGRESSION_SCRIPT)
        self.unpatched = install(self.tree, root / "unpatched")


@pytest.fixture(scope="module", params=PATCH_RELEASES)
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
    job = run_pytest(release.tree, release.patched, [SINGLE_PROCESS_TEST, REGRESSION_TEST])
    assert job.returncode == 0 and job.killed is None, "\n".join(job.lines[-60:])
    assert not re.search(r"\d+ (skipped|deselected|xfailed)", job.lines[-1]), job.lines[-1]  # all really ran
    passed = set(re.findall(r"^PASSED \S+::(\w+)$", "\n".join(job.lines), re.M))
    assert NEW_TESTS[release.line] <= passed, "\n".join(job.lines[-60:])  # @require_cpu skipped none
    # One launch for every scenario: the series' tests take well under a minute on CPU.
    times = durations(job)
    assert sum(times.get(name, 0.0) for name in NEW_TESTS[release.line]) < PASS_BOUND, times


def test_regression_test_fails_unpatched(release):
    """(b) The new tests catch the bug on the unpatched sdist, by failing, not by hanging.

    Each failing test must end within REGRESSION_BOUND seconds: its bound is the process group's
    timeout in the worker script, the hard timeout of `run_pytest` only guards this suite.
    """
    job = run_pytest(release.tree, release.unpatched, [SINGLE_PROCESS_TEST, REGRESSION_TEST])
    failed = set(re.findall(r"^FAILED \S+::(\w+)", "\n".join(job.lines), re.M))
    assert job.killed is None, job
    assert failed == UNPATCHED_FAILURES[release.line], "\n".join(job.lines[-60:])
    assert not any(line.startswith("ERROR") for line in job.lines), "\n".join(job.lines[-60:])
    times = durations(job)
    assert NEW_TESTS[release.line] <= set(times), "\n".join(job.lines[-60:])
    slow = {name: secs for name, secs in times.items() if secs >= REGRESSION_BOUND}
    assert not slow, f"failed, but not within {REGRESSION_BOUND}s: {slow}"
    # The failures come from the gloo timeout of the worker script (a process left in a barrier).
    assert any("Timed out" in line or "Connection closed" in line for line in job.lines), "\n".join(job.lines[-60:])


@pytest.mark.parametrize("version", RUFF_RELEASES)
def test_touched_files_pass_upstream_ruff(version, tmp_path):
    """(c) `ruff check` and `ruff format --check` (0.13.1) are clean on every Python file the series
    touches, under the release's own pyproject.toml, as upstream's `make quality` runs them."""
    tree = checkout_sdist(version, tmp_path)
    assert f'"{RUFF}"' in (tree / "setup.py").read_text(), f"{version} does not pin {RUFF}"
    series = SERIES[release_line(version)]
    git(tree, "am", "-q", *map(str, code_patches(series)))
    files = sorted({path for p in code_patches(series) for path in patched_paths(p) if path.endswith(".py")})
    assert set(REGRESSION_FILES) | {SINGLE_PROCESS_TEST, "src/accelerate/logging.py"} == set(files), files
    ruff = [upstream_python(), "-m", "ruff"]
    version_out = subprocess.run([*ruff, "--version"], capture_output=True, text=True, timeout=60)
    assert version_out.stdout.split() == ["ruff", RUFF.split()[-1]], (version_out, "run scripts/setup.sh")
    for args in (["check", "--no-cache"], ["format", "--check", "--diff", "--no-cache"]):
        out = subprocess.run([*ruff, *args, *files], cwd=tree, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"ruff {' '.join(args)} on {version}:\n{out.stdout}{out.stderr}"


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
        if rel in (Path("README.md"), Path("ISSUE.md"), Path("main/PULL_REQUEST.md")):
            continue
        assert len(rel.parts) == 2 and rel.suffix == ".patch", f"patches/{rel}: not part of any series"
        assert rel.parts[0] in tested, f"patches/{rel}: no release in {RELEASES} applies this series"
    assert tested == set(SERIES.values()) == {p.name for p in PATCHES.iterdir() if p.is_dir()}


def _added_file(patch_text, path):
    """The lines a patch adds to `path` (for a new file: its content), or None."""
    match = re.search(
        rf"^\+\+\+ b/{re.escape(path)}\n@@[^\n]*\n(.*?)(?=^diff --git|^-- \n|\Z)", patch_text, re.M | re.S
    )
    if not match:
        return None
    return "".join(line[1:] + "\n" for line in match.group(1).splitlines() if line.startswith("+"))


def _regression_files(series):
    """{path: content} of the regression files a series adds; each exactly once."""
    files = {}
    for path in REGRESSION_FILES:
        found = [b for b in (_added_file(p.read_text(), path) for p in series_files(series)) if b is not None]
        assert len(found) == 1, f"{series}: {path} is added {len(found)} times"
        files[path] = found[0]
    return files


def test_series_share_one_regression_test():
    """The regression test is one test, not three that can drift: every older series carries main's
    files, with only the declared substitutions for helpers its releases lack."""
    main = _regression_files(SERIES["1.13"])
    for series, substitutions in FORK_SUBSTITUTIONS.items():
        expected = dict(main)
        for path, old, new in substitutions:
            assert expected[path].count(old) == 1, (series, path, old)
            expected[path] = expected[path].replace(old, new)
        assert _regression_files(series) == expected, f"{series} differs from main beyond FORK_SUBSTITUTIONS"
    assert set(FORK_SUBSTITUTIONS) == set(SERIES.values()) - {SERIES["1.13"]}


def _single_process_block(series):
    """The single-process tests a series adds to tests/test_logging.py: from their first decorator to their end."""
    added = [b for b in (_added_file(p.read_text(), SINGLE_PROCESS_TEST) for p in series_files(series)) if b]
    assert len(added) == 1, f"{series}: {SINGLE_PROCESS_TEST} is changed {len(added)} times"
    line = next(line for line, name in SERIES.items() if name == series)
    assert added[0].count(SINGLE_PROCESS_BLOCK) == len(SINGLE_PROCESS_TESTS[line]), series
    return added[0][added[0].index(SINGLE_PROCESS_BLOCK) :].rstrip("\n") + "\n"


def test_series_share_one_single_process_test():
    """Main's single-process test in tests/test_logging.py ends every series' block (0.20-0.30 has no
    test_logging.py: its series creates one, with the helper, the fixture and the call-site test it needs)."""
    block = _single_process_block(SERIES["1.13"])
    for line, series in SERIES.items():
        assert _single_process_block(series).endswith(block), series
        names = set(re.findall(r"^def (test_\w+)\(", _single_process_block(series), re.M))
        assert names == SINGLE_PROCESS_TESTS[line], series


def test_regression_test_conventions():
    """The upstream test follows accelerate's CPU multi-process conventions."""
    files = _regression_files(SERIES["1.13"])
    test, script = files[REGRESSION_TEST], files[REGRESSION_SCRIPT]
    assert "@require_cpu\nclass " in test
    assert "execute_subprocess_async(" in test and "torch.distributed.run" in test
    assert 'patch_environment(gloo_socket_ifname="lo"' in test
    assert "PartialState(cpu=True, timeout=COLLECTIVE_TIMEOUT)" in script
    assert re.search(r"^COLLECTIVE_TIMEOUT = timedelta\(seconds=(\d+)\)$", script, re.M)
    assert int(re.search(r"timedelta\(seconds=(\d+)\)", script).group(1)) == COLLECTIVE_TIMEOUT
    # No harness of its own: no manual process group, free-port helper, or process handling.
    for own in ("init_process_group", "import socket", "start_processes", "multiprocessing", "MASTER_PORT"):
        assert own not in script + test, own
    assert "logging.disable(" in script
    # `get_logger` reads ACCELERATE_LOG_LEVEL: at DEBUG the hidden record would not be hidden, and the test could not fail.
    assert 'monkeypatch.delenv("ACCELERATE_LOG_LEVEL", raising=False)' in _single_process_block("main")
    # One launch: one multi-process test, one torchrun command, every scenario run by the script's main().
    assert test.count("execute_subprocess_async(") == 1 and test.count("    def test_") == 1
    assert re.findall(r"^def (in_order_\w+)\(state, logger\):", script, re.M) == REGRESSION_SCENARIOS
    for scenario in REGRESSION_SCENARIOS:
        assert f'("{scenario}", ' in test, scenario  # its records are checked
    # Docstrings that stay true once merged: what the test guards, not what upstream does today.
    tests = re.findall(r"    def (test_\w+)\(self\):\n(.*?)(?=\n    def |\Z)", test, re.S)
    tests += re.findall(r"^def (test_\w+)\([^)]*\):\n(.*?)(?=\n\n\n|\Z)", _single_process_block("main"), re.S | re.M)
    assert {name for name, _ in tests} == NEW_TESTS["1.13"]
    for name, body in tests:
        docstring = body.split('"""')[1]
        assert "collective" in docstring or "every turn" in docstring, (name, docstring)
        for stale in ("on `main`", "#3939", "#3280", "Fails", "Passes"):
            assert stale not in docstring, (name, stale)


def _fixture_from_patch(text):
    """{path: content} of files that hold exactly the context of a patch's hunks, at their line numbers."""
    files = {}
    for diff in re.split(r"^(?=diff --git )", text, flags=re.M)[1:]:
        path = re.match(r"diff --git a/(\S+) b/", diff).group(1)
        lines = []
        for start, body in re.findall(
            r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@[^\n]*\n(.*?)(?=^@@ |\Z)", diff, re.M | re.S
        ):
            pre = [line[1:] for line in body.splitlines() if line[:1] in (" ", "-")]
            lines += ["filler"] * (int(start) - 1 - len(lines)) + pre
        files[path] = "".join(line + "\n" for line in lines)
    return files


def test_docs_patches_are_well_formed(tmp_path):
    """Docs commits touch only docs/ and `git am` cleanly onto their own context (no network here).

    The main series has one, after the code; the older series have none (they are for forks, whose
    docs are not published). Their check on a real checkout of accelerate is in patches/README.md.
    """
    docs = docs_patches(SERIES["1.13"])
    assert [p.name[:4] for p in docs] == ["0003"], docs
    assert series_files(SERIES["1.13"])[-1] == docs[0]  # the code and test commits come first
    for series in FORK_SUBSTITUTIONS:
        assert docs_patches(series) == [], series
    for patch in docs:
        text = patch.read_text()
        assert patched_paths(patch) and all(
            p.startswith("docs/source/") and p.endswith(".md") for p in patched_paths(patch)
        ), patch
        assert "in_order=True" in text and "collective" in text
        assert HANG_OR_DESYNC in " ".join(text.split())
        for tip in re.findall(r"^\+<Tip[^>]*>\n\+\n(.*?)\n\+\n\+</Tip>", text, re.M | re.S):
            prose = " ".join(line[1:] for line in tip.splitlines())
            # A warning a reader reads: two or three sentences, short ones.
            assert len(re.findall(r"[.!?](?:\s|$)", prose)) <= 3 and len(prose) < 500, tip
        tree = tmp_path / patch.stem
        for path, content in _fixture_from_patch(text).items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(content)
        git(tree, "init", "-q")
        git(tree, "add", "-A")
        git(tree, "commit", "-q", "-m", "fixture")
        git(tree, "am", "-q", str(patch))


def test_series_are_git_am_ready():
    """Each patch has what `git am` and a reviewer need: From line, author, date, subject, a message;
    the main series' commits link the bug report and the partial fix, as upstream's PR template asks."""
    for series in SERIES.values():
        files = series_files(series)
        assert files, series
        for number, path in enumerate(files, 1):
            text = path.read_text()
            assert re.match(r"From [0-9a-f]{40} ", text), path
            for header in ("From: ", "Date: ", f"Subject: [PATCH {number}/{len(files)}] "):
                assert f"\n{header}" in text, (path, header)
            assert PATCH_AUTHOR.search(text), f"{path}: the author must not be a GitHub account"
            message = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
            assert len(message.split()) > 40, f"{path}: the commit message must explain the change"
    fix = series_files(SERIES["1.13"])[0].read_text().split("\n---\n", 1)[0]
    assert re.search(r"^Follow-up to #3280, refs #3939$", fix, re.M) and "Fixes #" not in fix
    assert "What changes for users" in fix and "barriers" in fix
    assert HANG_OR_DESYNC in " ".join(fix.split())


def test_pull_request_text():
    """patches/main/PULL_REQUEST.md: a release-notes title and the fields of accelerate's PR template, with links.

    It fixes the issue opened from ISSUE.md (its number, `#NNNN`, is the one thing the submitter fills in, as
    patches/README.md says) and follows up #3280, not #3939 (closed, its two cases fixed by #3280); no maintainer
    has discussed the new issue yet, so the "discussed/approved via issue" box stays unticked.
    """
    text = (PATCHES / "main" / "PULL_REQUEST.md").read_text()
    assert re.match(r"Fix `in_order=True` logging hang when processes' log levels differ\n\n# What does", text)
    for field in (
        "# What does this PR do?\n\nFixes #NNNN\n",
        "Follow-up to #3280, refs #3939",
        "## Before submitting",
        "## Who can review?",
    ):
        assert field in text, field
    assert text.count("NNNN") == 1 and re.findall(r"Fixes #\w+", text) == [f"Fixes {ISSUE_NUMBER}"]
    assert f"Fixes {ISSUE_NUMBER}" in (PATCHES / "README.md").read_text()
    assert "# Title" not in text
    # The release note of the behaviour change: the cost of a hidden call, and the call made on some processes only.
    note = re.search(r"^\*\*Release note \(behaviour change\)\.\*\* (.*?)\n\n", text, re.M | re.S)
    assert note, "no release note"
    note = " ".join(note.group(1).split())
    assert "`num_processes` barriers" in note and re.search(r"\d us before, [\d.-]+ ms after", note), note
    assert "used to do nothing" in note and HANG_OR_DESYNC in note, note
    assert re.search(r"^- \[ \] Was this discussed/approved via a Github issue", text, re.M)
    assert HANG_OR_DESYNC in " ".join(text.split())
    for must in (
        "#3280",
        "#1262",
        "test_in_order_logging",
        "in_order_rank_dependent_levels",
        "in_order_logging_disabled",
        "test_in_order_hidden_level_still_takes_its_turn",
        "debug_launcher",
        "Torchrun on CPU is new",
        "GLOO_SOCKET_IFNAME",
        "timeout=timedelta(seconds=30)",
        "depends on the machine",
    ):
        assert must in text, must
    # Each measured figure comes with what gives it: the test command, and the timing snippet, inline.
    assert "python -m pytest tests/test_logging.py tests/test_logging_in_order.py" in text
    assert "torchrun --standalone --nproc_per_node=2 timing.py" in text
    assert 'logger.debug("hidden on every process", in_order=True)' in text


def test_nothing_internal_upstream_sees():
    """The patches, ISSUE.md and PULL_REQUEST.md carry no blank, note, private link or GitHub identity of ours; the
    patches' `From:` line is the one exception, and the submitter applies them as themselves (patches/README.md)."""
    texts = [PATCHES / "ISSUE.md", PATCHES / "main" / "PULL_REQUEST.md", *series_files(SERIES["1.13"])]
    for path in texts:
        text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("From: "))
        for internal in INTERNAL:
            assert internal not in text, (path.name, internal)
    for path in PATCHES.rglob("*"):
        if path.is_file():
            assert "users.noreply" not in path.read_text(), path
    readme = " ".join((PATCHES / "README.md").read_text().split())
    assert "--reset-author" in readme


def test_issue_text():
    """patches/ISSUE.md: the bug report to open first, in the fields of accelerate's bug-report template, with a
    2-rank reproducer (one rank at WARNING), the gloo timeout it ends with, the cause and the proposed fix."""
    text = (PATCHES / "ISSUE.md").read_text()
    title = "`logger.info(..., in_order=True)` hangs when the processes' log levels differ"
    assert text.startswith(f"{title}\n\n### System Info\n"), text[:200]
    fields = re.findall(r"^### (.+)$", text, re.M)
    assert fields == ["System Info", "Information", "Tasks", "Reproduction", "Expected behavior"], fields
    for must in (
        "`Accelerate` version: 1.16.0",
        "torchrun --standalone --nproc_per_node=2 repro.py",
        "logging.WARNING",
        "in_order=True",
        "Timed out waiting 10000ms",
        "**Cause.**",
        "isEnabledFor",
        "**Proposed fix.**",
        "#3280",
        "#3939",
    ):
        assert must in text, must


def test_series_share_one_fix():
    """The patched `log` body is the same in every series: one fix in three contexts, not three fixes.

    Compared on the patches' post-image from `if in_order:` to the end of its `elif`; 0.20-0.30 also
    gains upstream's `stacklevel` default, checked on its own.
    """
    bodies = {}
    for series in SERIES.values():
        fix = series_files(series)[0].read_text()
        after = [line[1:] for line in fix.splitlines() if line[:1] in " +" and not line.startswith("+++")]
        first = after.index("        if in_order:")
        branch = next(n for n, line in enumerate(after) if n > first and line.startswith("        elif "))
        last = after.index("            self.logger.log(level, msg, *args, **kwargs)", branch)
        bodies[series] = after[first : last + 1]
        assert sum(line.strip().startswith("#") for line in bodies[series]) == 1, series  # a one-line comment
    assert len({tuple(body) for body in bodies.values()}) == 1, bodies
    backport = series_files(SERIES["0.20"])[0].read_text()
    assert '\n+        kwargs.setdefault("stacklevel", 2)\n' in backport
