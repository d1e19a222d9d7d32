"""README's CPU launch lines start real ranks: each line of its quick start, run on a two-rank script.

A plain `Accelerator()` under torchrun on a machine without a GPU, without `ACCELERATE_USE_CPU=1`,
starts one independent one-process run per rank, exit 0: it looks like a working job. So the lines are
read from README itself (a changed line is tested as written), with only the 4 ranks made 2, a free
loopback port added and `train.py` replaced by tests/jobs/scripts/readme_ranks.py. Each job runs under
a hard timeout that kills its whole process tree; the launcher's exit code is asserted.
"""

import os
import re
import shlex
import sys

import pytest
import torch
from conftest import LATEST, REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


SCRIPT = str(SCRIPTS / "readme_ranks.py")
BOUND = 90.0  # seconds a 2-rank job of one in_order call may take on a loaded 2-core machine, start-up included
SEEN = re.compile(r"^@@ACCELERATOR process_index=(\d+) num_processes=(\d+) distributed_type=(\w+)$")
# Each launcher as this interpreter runs it, and its option for a free port.
LAUNCHERS = {
    "torchrun": ([sys.executable, "-m", "torch.distributed.run"], "--master_port"),
    "accelerate launch": ([sys.executable, "-m", "accelerate.commands.launch"], "--main_process_port"),
}


def quick_start_launch_lines():
    """Every launch line in README's quick start (`torchrun ...`, `accelerate launch ...`), as written."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Quick start") : readme.index("\n## ", readme.index("## Quick start"))]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if not line.strip().startswith("#") and any(f"{name} " in line for name in LAUNCHERS)
    ]


def as_two_rank_command(line, port):
    """(environment assignments, argv) of README's `line` with 2 ranks, `port` and the test script."""
    words = shlex.split(line.split(" #")[0])
    assignments = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        assignments[name] = value
    launcher = "accelerate launch" if words[:2] == ["accelerate", "launch"] else words[0]
    prefix, port_option = LAUNCHERS[launcher]
    rest = words[len(launcher.split()) :]
    assert rest[-1] == "train.py", line
    rest = [*rest[:-1], SCRIPT]
    for option in ("--nproc_per_node", "--num_processes"):
        if option in rest:
            rest[rest.index(option) + 1] = "2"
    return assignments, [*prefix, port_option, str(port), *rest]


def test_readme_quick_start_has_a_cpu_launch_line_for_each_launcher():
    lines = quick_start_launch_lines()
    assert {"accelerate launch" if "accelerate launch" in line else "torchrun" for line in lines} == set(LAUNCHERS)


def _run(line, tmp_path, **extra):
    assignments, cmd = as_two_rank_command(line, _launch.free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "CUDA_VISIBLE_DEVICES")}
    env.update(assignments)
    env["HF_HOME"] = str(tmp_path / "hf")  # no accelerate config file of this machine's user
    env["PYTHONPATH"] = os.pathsep.join([accelerate_dir(LATEST), str(REPO)])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return _launch.run(cmd, env=env, timeout=BOUND + 60, stall=60)


@pytest.mark.parametrize("line", quick_start_launch_lines())
def test_each_readme_cpu_launch_line_starts_two_ranks_of_one_job(line, tmp_path):
    job = _run(line, tmp_path)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < BOUND, job
    seen = sorted(m.groups() for m in map(SEEN.match, job.lines) if m)
    assert seen == [("0", "2", "MULTI_CPU"), ("1", "2", "MULTI_CPU")], (line, job.lines)
    assert [line for line in job.lines if "loaded" in line] == [f"[RANK {r}] shard {r} loaded" for r in (0, 1)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, a plain Accelerator() is a DDP job")
def test_without_use_cpu_torchrun_starts_one_process_runs(tmp_path):
    """What README warns about: the torchrun line without `ACCELERATE_USE_CPU=1`, exit 0, two runs of one rank.

    Each such run still joins torch's two-rank group (accelerate calls `init_process_group` with no backend when
    `LOCAL_RANK` is set): a rank done with its one-process run could close its gloo pair while the other was still
    connecting (CI, once: exit 1 in `init_process_group`). `TORCH_DIST_INIT_BARRIER=1` keeps it until both are in."""
    (torchrun,) = [line for line in quick_start_launch_lines() if "torchrun " in line]
    job = _run(torchrun.replace("ACCELERATE_USE_CPU=1 ", ""), tmp_path, TORCH_DIST_INIT_BARRIER="1")
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert sorted(m.groups() for m in map(SEEN.match, job.lines) if m) == [("0", "1", "NO")] * 2, job.lines
