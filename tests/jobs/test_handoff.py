"""Promise: in barrier mode a rank that dies in its in_order turn, mid-chain, costs the others one
`ACCELERATE_INORDER_TIMEOUT`: they end within it (plus a margin), each survivor's record of that call
comes out exactly once and in rank order, and the warning names exactly the rank that did not hand over
-- on real 4-rank torchrun jobs (CPU gloo), on two accelerate releases.

The case is scripts/handoff_death.py; the schedule explorer (tests/unit/test_checkin.py) covers deaths,
slow handlers and junk in handoff keys over thousands of schedules.
"""

import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix import bounds
from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


SCRIPT = str(SCRIPTS / "handoff_death.py")
NPROC = 4
TIMEOUT = 3.0
SLACK = 1.5  # seconds of the machine's own (2 shared cores) beyond the timeout
RECORD = re.compile(r"^(?:\[RANK \d+\] )?handoff#(?P<call>\d) r(?P<rank>\d) by=r(?P<by>\d)$")
NAMED = re.compile(r"rank (\d+) did not hand over its turn")
# torchrun's agent: a worker that exited nonzero fails the job (ChildFailedError), exit code 1.
TORCHRUN_FAILED = 1


def run(version, dying, nproc=NPROC, late=()):
    env = _launch.scenario_env(True, "barrier", [accelerate_dir(version), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(TIMEOUT)
    cmd = _launch.launch_command([SCRIPT, ",".join(map(str, dying)), *late], nproc)
    return _launch.run(cmd, env=env, timeout=90, stall=45)


@pytest.mark.parametrize(("version", "dying"), [("1.15.0", 1), ("1.12.0", 2), ("1.15.0", 3)])
def test_a_rank_dead_in_its_turn_costs_one_timeout_and_is_named(version, dying):
    job = run(version, [dying])
    survivors = [r for r in range(NPROC) if r != dying]
    assert job.killed is None, (job, job.stderr[-3000:])
    assert job.returncode == TORCHRUN_FAILED, (job, job.stderr[-3000:])
    assert sorted(int(line.split()[1][1:]) for line in job.lines if line.startswith("@@DONE ")) == survivors
    seconds = {int(m[1]): float(m[2]) for m in map(re.compile(r"^@@RESULT r(\d) seconds=(.*)$").match, job.lines) if m}
    assert set(seconds) == set(survivors) and max(seconds.values()) < TIMEOUT + SLACK, seconds
    found = [(int(m["call"]), int(m["rank"]), int(m["by"])) for m in map(RECORD.match, job.lines) if m]
    want = [(call, r, r) for call in (1, 2) for r in range(NPROC)] + [(3, r, r) for r in survivors]
    assert found == want, found
    named = [int(q) for q in NAMED.findall(job.stderr)]
    assert named and set(named) == {dying}, job.stderr[-3000:]
    # the one traceback is the launcher's report of the dead worker
    assert job.stderr.count("Traceback") == job.stderr.count("ChildFailedError:") == 1, job.stderr[-3000:]


def test_two_ranks_dead_in_their_turns_of_one_call_are_each_named():
    """Ranks 1 and 3 of 5 die in their turns of one call: each is named (rank 2 names rank 1, rank 4 rank 3), the
    survivors' records stay in rank order, and no call waits past `CALL`. Rank 2 comes T/8 late, so its wait for
    the last rank after its turn outlasts rank 4's handoff (before the fix, nobody named rank 3 then)."""
    nproc, dying = 5, (1, 3)
    job = run("1.15.0", dying, nproc, [f"2:{TIMEOUT / 8}"])
    survivors = [r for r in range(nproc) if r not in dying]
    assert job.killed is None, (job, job.stderr[-3000:])
    assert job.returncode == TORCHRUN_FAILED, (job, job.stderr[-3000:])
    assert sorted(int(line.split()[1][1:]) for line in job.lines if line.startswith("@@DONE ")) == survivors
    seconds = {int(m[1]): float(m[2]) for m in map(re.compile(r"^@@RESULT r(\d) seconds=(.*)$").match, job.lines) if m}
    assert set(seconds) == set(survivors) and max(seconds.values()) < bounds.CALL.value * TIMEOUT + SLACK, seconds
    found = [(int(m["call"]), int(m["rank"]), int(m["by"])) for m in map(RECORD.match, job.lines) if m]
    assert found == [(call, r, r) for call in (1, 2) for r in range(nproc)] + [(3, r, r) for r in survivors], found
    assert set(map(int, NAMED.findall(job.stderr))) == set(dying), job.stderr[-3000:]
    # the one traceback is the launcher's report of the dead workers
    assert job.stderr.count("Traceback") == job.stderr.count("ChildFailedError:") == 1, job.stderr[-3000:]
