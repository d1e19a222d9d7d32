"""Promise: the benchmark scripts in `benchmarks/` that launch real jobs or build a wheel still run and report.

Figures come from benchmarks, never from tests: this only shows that `bench_cpu.py` and `bench_ab.py`
run end to end on 2 real ranks (torchrun, CPU gloo) and measured each variant, and that
`bench_startup.py` builds its venv and times both sides, each under a hard timeout. The scripts that
launch no ranks are smoke-tested in tests/jobs/test_benchmark_scripts.py.
"""

import re
import sys

import pytest
from conftest import LATEST, REPO, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


TIME_BOUND = 120.0


def test_bench_cpu_reports_the_cpu_of_every_variant_from_a_real_job():
    cmd = _launch.launch_command([str(REPO / "benchmarks" / "bench_cpu.py"), "--calls", "5"], 2)
    env = _launch.scenario_env(True, None, [accelerate_dir(LATEST), str(REPO)])
    job = _launch.run(cmd, env=env, timeout=TIME_BOUND + 60, stall=60)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < TIME_BOUND, job
    rows = {
        m.group(1): m.groups()[1:]
        for m in map(re.compile(r"^\| (\w+) " + r"\| (\d+) " * 5 + r"\|$").match, job.lines)
        if m
    }
    assert set(rows) == {"upstream", "barrier", "gather"}, job.lines
    assert all(int(wall) > 0 and int(total) > 0 for wall, *_, total in rows.values()), rows


def _run_script(script, *args):
    """`python benchmarks/<script> args`, as a user runs it, its whole tree killed at the deadline."""
    env = _launch.scenario_env(False, None, [accelerate_dir(LATEST), str(REPO)])
    cmd = [sys.executable, str(REPO / "benchmarks" / script), *args]
    job = _launch.run(cmd, env=env, timeout=TIME_BOUND + 60, cwd=str(REPO))
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < TIME_BOUND, job
    return job


@pytest.mark.parametrize(
    "options,title",
    [
        ([], "2 ranks, barrier mode, base HEAD vs head,"),
        (["--mode", "gather", "--collapse"], "2 ranks, gather mode, base HEAD vs head, collapse on,"),
    ],
)
def test_bench_ab_pairs_the_working_tree_with_a_revision_in_one_job(options, title):
    job = _run_script("bench_ab.py", "--base", "HEAD", "--ranks", "2", "--calls", "2", "--rounds", "1", *options)
    rows = [m.group(1) for m in map(re.compile(r"^\| (\w+) \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$").match, job.lines) if m]
    assert rows == ["upstream", "base", "head"], job.lines
    assert job.lines[0].startswith(title + " 1 rounds of 2 calls"), job.lines
    assert job.lines[-1].startswith("base / head: "), job.lines


def test_bench_startup_builds_its_venv_and_times_both_sides():
    job = _run_script("bench_startup.py", "--pairs", "2", "--markdown")
    rows = [line for line in job.lines if line.startswith("| ") and not line.startswith("| case")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| python -c pass, wall",
        "| python -c pass, CPU",
        "| site.main() in the child, wall",
    ], job.lines
    assert job.lines[-1] == "modules of the package imported at start-up: []", job.lines


def test_bench_upstream_in_order_times_both_logs_side_by_side_in_one_job():
    """`bench_upstream_in_order.py` on 2 real ranks: the released `log` and the `patches/main/` fix's in one job
    (the script itself asserts that the patched call takes `num_processes` barriers and the released one none)."""
    script = str(REPO / "benchmarks" / "bench_upstream_in_order.py")
    cmd = _launch.launch_command([script, "--calls", "3", "--batches", "1"], 2)
    env = _launch.scenario_env(False, None, [accelerate_dir(LATEST)])
    job = _launch.run(cmd, env=env, timeout=TIME_BOUND + 60, stall=60)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < TIME_BOUND, job
    rows = [m.groups() for m in map(re.compile(r"^\| 2 \| (.+) \| [\d.]+ \| [\d.]+ \|$").match, job.lines) if m]
    assert [name for (name,) in rows] == [
        "unpatched `debug(..., in_order=True)`",
        "patched `debug(..., in_order=True)`",
        "one `wait_for_everyone()`",
    ], job.lines
    assert job.lines[0].startswith(f"accelerate {LATEST}, "), job.lines
