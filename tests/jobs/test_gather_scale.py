"""16 real ranks: gather mode complete, ordered, each record exactly once; the store bounded in both modes.

One torchrun job, CPU gloo, under a hard timeout. Lean on purpose (2 CI cores): one job, no stagger.
"""

import re

from conftest import LATEST, REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.gather import queues


NPROC, CALLS = 16, 64
TIME_BOUND = 180.0  # seconds for the whole job, start-up of 16 ranks on 2 cores included
_RECORD = re.compile(r"^h(?P<printer>\d+) (?:\[RANK \d+\] )?call (?P<call>\d+) from r(?P<rank>\d+)$")


def test_sixteen_ranks_gather_every_record_once_in_order_with_a_bounded_store():
    cmd = _launch.launch_command([str(SCRIPTS / "gather_many_ranks.py"), str(CALLS)], NPROC)
    env = _launch.scenario_env(True, "gather", [accelerate_dir(LATEST), str(REPO)])
    job = _launch.run(cmd, env=env, timeout=TIME_BOUND + 60, stall=60)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < TIME_BOUND, job
    assert {line for line in job.lines if line.startswith("@@DONE")} == {f"@@DONE r{r}" for r in range(NPROC)}
    records = [m.groups() for m in map(_RECORD.match, job.lines) if m]
    assert {printer for printer, _, _ in records} == {"0"}, "records printed by ranks other than the main process"
    got = [(int(call), int(rank)) for _, call, rank in records]
    assert got == [(call, rank) for call in range(1, CALLS + 1) for rank in range(NPROC)]
    assert "sent no record" not in "\n".join(job.lines + [job.stderr])
    keys = dict(re.findall(r"^@@KEYS after=(\d+) keys=(\d+)$", "\n".join(job.lines), re.M))
    # Without clean-up the store would gain a key per rank per call between the two counts.
    growth = int(keys[str(CALLS)]) - int(keys["16"])
    assert growth <= (NPROC - 1) * (queues.CLEAN_EVERY + queues.PUBLISH_EVERY) < (NPROC - 1) * (CALLS - 16)


BARRIER_CALLS = 32  # 16 barriers a call on 2 cores: fewer calls, the same proof of a bounded store


def test_sixteen_ranks_barrier_mode_checks_in_every_call_with_a_bounded_store():
    """Barrier mode's check-in deletes each decided call's keys: the store does not grow with calls."""
    cmd = _launch.launch_command([str(SCRIPTS / "gather_many_ranks.py"), str(BARRIER_CALLS), "barrier"], NPROC)
    env = _launch.scenario_env(True, None, [accelerate_dir(LATEST), str(REPO)])
    job = _launch.run(cmd, env=env, timeout=TIME_BOUND + 60, stall=60)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < TIME_BOUND, job
    assert {line for line in job.lines if line.startswith("@@DONE")} == {f"@@DONE r{r}" for r in range(NPROC)}
    records = [m.groups() for m in map(_RECORD.match, job.lines) if m]
    assert all(printer == rank for printer, _, rank in records), "barrier mode: each rank prints its own"
    got = [(int(call), int(rank)) for _, call, rank in records]
    assert got == [(call, rank) for call in range(1, BARRIER_CALLS + 1) for rank in range(NPROC)]
    assert "did not make" not in job.stderr, job.stderr[-3000:]
    keys = dict(re.findall(r"^@@KEYS after=(\d+) keys=(\d+)$", "\n".join(job.lines), re.M))
    # What stays is each site's counter and latest verdict, and each rank's marker: nothing per call.
    assert int(keys[str(BARRIER_CALLS)]) - int(keys["16"]) <= NPROC, keys
