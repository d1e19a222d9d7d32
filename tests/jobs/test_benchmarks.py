"""Promise: the benchmark scripts in `benchmarks/` that launch real jobs still run and report every variant.

Figures come from benchmarks, never from tests: this only shows that `bench_cpu.py` runs end to end
on 2 real ranks (torchrun, CPU gloo) and measured each variant, under a hard timeout.
"""

import re

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
