"""Promise: `python -m build` gives an sdist and a wheel that pass `twine check --strict`; the wheel carries the
start-up hook, `py.typed`, the license, the benchmark and the lint where its entry points name it; and
`accelerate-inorder-fix bench` works from a wheel install (a real 2-rank job, torchrun + gloo, under a hard
timeout that kills the job's process tree).

The wheel is installed into a fresh venv (tests/conftest.py: `make_venv`, whose dependencies come from the test
runner's site-packages), and run from a folder outside the repo with no PYTHONPATH to it.
"""

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from conftest import site_packages


BENCH_TIMEOUT = 240  # the bench's own job has --job-timeout 150, and kills its ranks at that point


def test_sdist_and_wheel_pass_twine_check_strict(dists):
    twine = Path(sys.executable).parent / "twine"
    proc = subprocess.run(
        [str(twine), "check", "--strict", str(dists["sdist"]), str(dists["wheel"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_wheel_carries_the_hook_py_typed_the_license_and_the_bench(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    assert {
        "_accelerate_inorder_fix_startup.pth",
        "_accelerate_inorder_fix_startup.py",
        "accelerate_inorder_fix/py.typed",
        "accelerate_inorder_fix/cli/bench.py",
    } <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    # Developer-only benchmarks stay out: no old protocol, no old codec, no pickle or marshal anywhere.
    wheel = zipfile.ZipFile(dists["wheel"])
    sources = {n: wheel.read(n).decode() for n in names if n.endswith(".py")}
    assert "accelerate_inorder_fix/gather/queues.py" in sources
    assert not [n for n, text in sources.items() if re.search(r"pickle|marshal|LegacyInbox", text)]


def test_wheel_carries_the_lint_where_its_entry_points_name_it(dists):
    wheel = zipfile.ZipFile(dists["wheel"])
    names = set(wheel.namelist())
    lint = {n for n in names if n.startswith("accelerate_inorder_fix/lint/") and n.endswith(".py")}
    assert {"accelerate_inorder_fix/lint/__init__.py", "accelerate_inorder_fix/lint/flake8_plugin.py"} <= lint
    assert not any(n.startswith("accelerate_inorder_fix/cli/lint/") for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    targets = re.findall(r"^\S+ = ([\w.]+):\w+$", wheel.read(entry_points).decode(), flags=re.MULTILINE)
    assert "accelerate_inorder_fix.lint.flake8_plugin" in targets
    for module in targets:  # the console script and the flake8 plugin: each module is in the wheel
        assert module.replace(".", "/") + ".py" in names, module


def test_sdist_builds_the_same_files(dists):
    root = dists["sdist"].name.removesuffix(".tar.gz")
    names = set(tarfile.open(dists["sdist"]).getnames())
    for path in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "_accelerate_inorder_fix_startup.pth"):
        assert f"{root}/{path}" in names, path
    assert f"{root}/accelerate_inorder_fix/py.typed" in names
    assert not any("/.cache/" in n or "/.venv" in n for n in names)


def test_bench_runs_from_a_wheel_install(wheel_venv, tmp_path):
    site = site_packages(wheel_venv)
    cli = wheel_venv / "bin" / "accelerate-inorder-fix"
    args = ["bench", "--sizes", "2", "--rounds", "1", "--calls", "2", "--plain-calls", "50", "--job-timeout", "150"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(cli), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "world size 2 ..." in proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| ranks | upstream in_order | barrier"))
    row = lines[header + 2].split("|")
    assert row[1].strip() == "2" and row[2].strip().endswith(" ms"), lines
    assert "2 in_order calls x 1 rounds, 50 plain calls x 1 rounds" in proc.stdout

    # The benchmark that ran is the wheel's own copy, from the venv's site-packages.
    where = subprocess.run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "import accelerate_inorder_fix.cli.bench as b; print(b.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(where.stdout.strip()).parent == site / "accelerate_inorder_fix" / "cli", where.stderr
