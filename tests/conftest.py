"""Shared test helpers: where the accelerate releases live, and how a test launches a real job.

`scripts/setup.sh` installs each release under `.cache/accelerate/<version>`; a job that should run
against a release gets that folder first on PYTHONPATH. Every job runs under `accelerate_inorder_fix.cli.launch.run`, which
kills the job's whole process tree on a stall or at its hard deadline.

The test venv is an install of this package, so its start-up hook would patch every Python process
the tests start as soon as accelerate is imported. Tests want accelerate as it is until they patch it
themselves, so the hook stays unarmed in this process and, through `ACCELERATE_INORDER_FIX_STARTUP=0`,
in every child; `import accelerate_inorder_fix` still patches. Only tests/jobs/test_startup_hook.py arms it,
in venvs of its own.
"""

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import _accelerate_inorder_fix_startup as _startup_hook


REPO = Path(__file__).resolve().parents[1]

os.environ["ACCELERATE_INORDER_FIX_STARTUP"] = "0"
_startup_hook.uninstall()
if Path(_startup_hook.__file__).resolve().parent != REPO:
    # An install's copy, loaded at start-up by an older hook's .pth: the tests are of the repo's module.
    del sys.modules[_startup_hook.__name__]
    import _accelerate_inorder_fix_startup as _startup_hook

    _startup_hook.uninstall()
CACHE = REPO / ".cache"
RELEASES = [
    line.strip()
    for line in (REPO / "scripts" / "releases.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
LATEST = RELEASES[-1]
# CI's release matrix runs the job tier once per release: AIF_TEST_RELEASE=<version> keeps the tests of that
# release (a test belongs to the first release among its parameters; a test with none, to the latest).
SELECTED_RELEASE = os.environ.get("AIF_TEST_RELEASE", "").strip()
SCRIPTS = Path(__file__).resolve().parent / "jobs" / "scripts"


def accelerate_dir(version):
    """Folder holding accelerate==version (installed there by scripts/setup.sh)."""
    path = CACHE / "accelerate" / version
    if not (path / "accelerate").is_dir():
        pytest.fail(f"accelerate {version} is not set up: run scripts/setup.sh")
    return str(path)


def release_line(version):
    """'0.20' (0.20-0.30.0), '0.31' (0.30.1-1.12) or '1.13' (1.13+): the three upstream log bodies."""
    parts = tuple(int(p) for p in version.split(".")[:3])
    if parts < (0, 30, 1):
        return "0.20"
    if parts < (1, 13, 0):
        return "0.31"
    return "1.13"


def run_python(code, version=LATEST, env=None, timeout=60):
    """Run `python -c code` against an accelerate release; returns CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join([accelerate_dir(version), str(REPO)])
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout)


def run_script(path, *args, version=LATEST, env=None, timeout=60):
    """Run a Python file against an accelerate release; returns CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join([accelerate_dir(version), str(REPO)])
    return subprocess.run(
        [sys.executable, str(path), *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )


# --- built distributions and fresh venvs (tests/jobs/test_startup_hook.py, tests/jobs/test_packaging.py) ----------
# A fresh venv holds pip and what a test installs, plus a `.pth` line naming the test runner's own site-packages,
# where torch 2.13.0, accelerate and wrapt already are (a plain path line: the `.pth` files of that folder,
# including the runner's own hook, are not read). Nothing is downloaded.

SHARED_SITE = sysconfig.get_paths()["purelib"]
PIP_TIMEOUT = 300


def site_packages(venv):
    return next((venv / "lib").glob("python3*/site-packages"))


def make_venv(path):
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=PIP_TIMEOUT)
    (site_packages(path) / "zz_aif_test_shared_deps.pth").write_text(SHARED_SITE + "\n")
    return path


def pip(venv, *args):
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    return subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT, capture_output=True, text=True)


@pytest.fixture(scope="session")
def dists(tmp_path_factory):
    """`python -m build` of the repo, offline (no isolation: hatchling is in the test extra): {"sdist", "wheel"}."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        timeout=PIP_TIMEOUT,
        capture_output=True,
    )
    return {"sdist": next(out.glob("accelerate_inorder_fix-*.tar.gz")), "wheel": next(out.glob("*.whl"))}


@pytest.fixture(scope="session")
def wheel(dists):
    return dists["wheel"]


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory, wheel):
    venv = make_venv(tmp_path_factory.mktemp("wheel") / "venv")
    pip(venv, "install", "--no-deps", "--no-index", str(wheel))
    return venv


def two_nodes(script_args, env, tmp_path, node_env=("", ""), timeout=120.0):
    """Two torchrun agents of 2 ranks each on one loopback rendezvous: a 2-node job under a hard timeout.

    `node_env`: a `NAME=value ` prefix for each node's command. Each node's stdout and stderr go to files.
    Returns (the job, [each node's stdout lines], [each node's stderr]).
    """
    from accelerate_inorder_fix.cli import launch as _launch

    port = _launch.free_port()
    parts = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        cmd += ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port), *script_args]
        out = f"> {tmp_path}/node{node}.out 2> {tmp_path}/node{node}.err"
        parts.append(f"{node_env[node]}{shlex.join(cmd)} {out}")  # shell quoting: a `%(rank)s` argument too
    script = f"{parts[0]} & a=$!; {parts[1]} & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))"
    job = _launch.run(["bash", "-c", script], env=env, timeout=timeout)
    lines = [(tmp_path / f"node{n}.out").read_text().splitlines() for n in (0, 1)]
    errors = [(tmp_path / f"node{n}.err").read_text() for n in (0, 1)]
    return job, lines, errors


def release_of(item):
    """The release a collected test belongs to, for AIF_TEST_RELEASE."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((v for v in params.values() if isinstance(v, str) and v in RELEASES), LATEST)


# The files that take minutes, longest first (pytest --durations, fresh-clone CI): run first, so that under
# `-n 2 --dist loadfile` the two workers end together instead of one running a long file alone at the end
# (about 200 s of a 30-minute untimed tier, simulated from its measured durations).
LONG_FILES = (
    "test_exit.py",
    "test_in_order_contract.py",
    "test_quick_start.py",
    "test_upstream_patches.py",
    "test_cli.py",
)


def long_files_first(items):
    """`items` reordered stably: the `LONG_FILES` first, in that order (the same on every xdist worker)."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))


def pytest_collection_modifyitems(config, items):
    long_files_first(items)
    if not SELECTED_RELEASE:
        return
    if SELECTED_RELEASE not in RELEASES:
        raise pytest.UsageError(f"AIF_TEST_RELEASE={SELECTED_RELEASE!r} is not in scripts/releases.txt")
    other = [item for item in items if release_of(item) != SELECTED_RELEASE]
    config.hook.pytest_deselected(items=other)
    items[:] = [item for item in items if release_of(item) == SELECTED_RELEASE]
