"""Promise: ranks started by `accelerate launch` (the way most users start jobs) are fixed too.

`accelerate launch --multi_gpu --num_processes 4` on this GPU-less machine starts 4 CPU ranks (gloo).
"""

import pytest
from conftest import accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import scenarios


NAMES = ["default", "rank_levels", "exception"]


@pytest.mark.parametrize("version", ["0.21.0", "1.15.0"])
def test_patched_under_accelerate_launch(version):
    job = _launch.run_scenarios(
        NAMES, 4, patched=True, launcher="accelerate", pythonpath=[accelerate_dir(version)], timeout=240, stall=None
    )
    assert job.killed is None and job.returncode == 0, f"{job}\n{job.stderr[-3000:]}"
    said = job.lines + job.stderr.splitlines()  # the package's warnings are on stderr
    assert {n: scenarios.check(n, 4, said)[0] for n in NAMES} == dict.fromkeys(NAMES, "ordered")


def test_unpatched_under_accelerate_launch_deadlocks():
    job = _launch.run_scenarios(
        ["rank_levels"],
        4,
        patched=False,
        launcher="accelerate",
        pythonpath=[accelerate_dir("1.15.0")],
        timeout=90,
        stall=10,
    )
    assert scenarios.check("rank_levels", 4, job.lines)[0] in {"deadlock", "desync"}
    assert job.killed is not None or job.returncode != 0
