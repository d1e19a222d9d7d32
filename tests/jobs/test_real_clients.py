"""Promise: real clients run unchanged with the start-up hook on, and a real training loop that logs
in_order every step completes, ordered, with the same trained weights as without logging.

As a user gets it: the built wheel in a fresh venv (test_startup_hook.py's venv), scripts that never
import the package, `accelerate launch` with 2 CPU ranks. `PYTHONPROFILEIMPORTTIME` makes every
process list its imports on stderr, which shows that the hook brought the package into each rank.
accelerate's own scripts run through `scripts/seeded_client.py`: unchanged, but on fixed data (their
dataset otherwise draws from fresh OS entropy in every run). On failure, the job's whole stderr is
printed (pytest shows it with the failure).
"""

import re

import pytest
from conftest import SCRIPTS, accelerate_dir
from test_faults import expect, records
from test_startup_hook import clean_env

from accelerate_inorder_fix.cli import launch as _launch


TRAIN = str(SCRIPTS / "train_loop.py")
SEEDED = str(SCRIPTS / "seeded_client.py")


def _run(venv, script, version, timeout, args=(), **env):
    cmd = _launch.launch_command([script, *args], 2, "accelerate", python=str(venv / "bin" / "python"))
    # ACCELERATE_USE_CPU: without it, accelerate's own scripts come up as two single-process jobs
    # on a machine with no GPU (each its own "main process"), which proves nothing about ranks.
    full_env = clean_env(version, PYTHONPROFILEIMPORTTIME="1", ACCELERATE_USE_CPU="1", **env)
    return _launch.run(cmd, env=full_env, timeout=timeout, stall=None)


def _errors(stderr):
    """stderr without the `import time:` lines, for a failure's message (and whole on stdout, which
    pytest shows with a failing test, where an assertion's message would be cut short)."""
    text = "\n".join(line for line in stderr.splitlines() if not line.startswith("import time:"))
    print(text)
    return text[-3000:]


def _patched_processes(stderr):
    """How many processes imported the package (one `import time:` line each)."""
    return len(re.findall(r"^import time:.*\|\s+accelerate_inorder_fix$", stderr, re.M))


# What each of accelerate's scripts prints only when its ranks form one distributed job. (Its
# `test_ops.py` is not here: it uses `PartialState()`, which on a machine without a GPU always
# comes up as a single process, however it is launched.)
DISTRIBUTED = {
    "test_script": "Distributed environment: DistributedType.MULTI_CPU",
    "test_sync": "**Test Distributed `no_sync` context manager**",
}


@pytest.mark.parametrize("version", ["1.12.0", "1.15.0"])
@pytest.mark.parametrize("name", list(DISTRIBUTED))
def test_accelerate_self_tests_pass_with_the_hook(wheel_venv, version, name):  # noqa: F811
    # Through `seeded_client.py`: the scripts unchanged, their random data the same in every run.
    script = f"{accelerate_dir(version)}/accelerate/test_utils/scripts/{name}.py"
    job = _run(wheel_venv, SEEDED, version, timeout=300, args=[script])
    assert job.killed is None and job.returncode == 0, (job, _errors(job.stderr))
    assert any(line.startswith(DISTRIBUTED[name]) for line in job.lines), "the ranks did not form one job"
    assert job.elapsed < 240, job
    assert _patched_processes(job.stderr) >= 2, "the hook did not patch the ranks"
    assert "accelerate-inorder-fix:" not in job.stderr, _errors(job.stderr)


@pytest.mark.parametrize("mode", ["barrier", "gather"])
def test_training_loop_logging_in_order_every_step(wheel_venv, mode):  # noqa: F811
    job = _run(wheel_venv, TRAIN, "1.15.0", timeout=180, ACCELERATE_INORDER_MODE=mode)
    assert job.killed is None and job.returncode == 0, (job, _errors(job.stderr))
    assert job.elapsed < 150, job
    assert _patched_processes(job.stderr) >= 2
    found, writer = records(job.lines, caller="train"), 0 if mode == "gather" else None
    steps = range(8)
    for step in steps:
        expect(found, "train", step, [0], by=writer)  # ranks 1+ are at WARNING: rank 0's record only
        if step % 2:
            expect(found, "sync", step, [0, 1], by=writer)
    assert not found, sorted(found)
    syncs = [line.split()[0:2] for line in job.lines if re.match(r"^(\[RANK \d\] )?sync#", line)]
    ranks = [int(re.search(r" r(\d)", line).group(1)) for line in job.lines if re.search(r"sync#\d+ r\d", line)]
    assert ranks == [0, 1] * 4, syncs  # every block in rank order
    weights = sorted(line for line in job.lines if line.startswith("@@WEIGHTS"))
    assert len(weights) == 2 and all("identical=True" in line for line in weights), weights
    assert len({line.split("sha=")[1] for line in weights}) == 1, weights  # ranks agree (DDP)
