"""Shared test helpers: where the accelerate releases live, and how a test launches a real job.

`scripts/setup.sh` installs each release under `.cache/accelerate/<version>`; a job that should run
against a release gets that folder first on PYTHONPATH. Every job runs under `_launch.run`, which
kills the job's whole process tree on a stall or at its hard deadline.

The test venv is an install of this package, so its start-up hook would patch every Python process
the tests start as soon as accelerate is imported. Tests want accelerate as it is until they patch it
themselves, so the hook stays unarmed in this process and, through `ACCELERATE_INORDER_FIX_STARTUP=0`,
in every child; `import accelerate_inorder_fix` still patches. Only tests/test_startup_hook.py arms it,
in venvs of its own.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import _accelerate_inorder_fix_startup as _startup_hook


os.environ["ACCELERATE_INORDER_FIX_STARTUP"] = "0"
_startup_hook.uninstall()

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
RELEASES = [
    line.strip()
    for line in (REPO / "scripts" / "releases.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
LATEST = RELEASES[-1]
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
