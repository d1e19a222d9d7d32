"""Promise: in gather mode a record too large for the job's store arrives truncated, with a marker and one
warning naming its call site and rank, and the rank's later records still arrive in order.

TCPStore refuses a request over 8 MiB and resets the rank's connection: before this was fixed, the
9 MB record (and the 800,000 emoji, 9.6 MB as JSON) broke rank 1's connection, the main process waited
the whole timeout for it, and from then on rank 1 printed its own records, out of order.

One job (2 CPU ranks, accelerate 1.15.0, `ACCELERATE_INORDER_TIMEOUT=2`) runs scripts/big_records.py. Its
last call's %-format fails: every rank's record arrives with the same "could not be formatted" note, the
main process's own too (before, that one was lost to Python's `--- Logging error ---`).
"""

import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.gather import records


pytestmark = pytest.mark.timed


SCRIPT = SCRIPTS / "big_records.py"
TIMEOUT = 2.0
NAMES = ["mb1", "mb9", "mb20", "emoji"] + [f"after#{k}" for k in range(1, 6)]
LENGTHS = {"mb1": 10**6, "mb9": 9 * 10**6, "mb20": 20 * 10**6, "emoji": 1_200_000}
TRUNCATED = {"mb9", "mb20", "emoji"}  # over `records.MAX_RECORD` on the wire (UTF-8)
RECORD = re.compile(r"^\[RANK (\d)\] (\S+) r(\d) ")
WARNING = re.compile(r"in_order call at big_records\.py:\d+ in main \(call (\d) from there\): rank 1's record is ")


def test_records_over_the_store_limit_arrive_truncated_once_in_order_and_later_ones_too():
    env = _launch.scenario_env(True, "gather", [accelerate_dir("1.15.0"), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(TIMEOUT)
    job = _launch.run(_launch.launch_command([str(SCRIPT)], 2), env=env, timeout=180, stall=60)
    assert job.killed is None and job.returncode == 0, (job.killed, job.returncode, job.stderr[-3000:])
    found = [(m, line) for m, line in ((RECORD.match(line), line) for line in job.lines) if m]
    emitted = [(m[2], int(m[3])) for m, _ in found]
    assert emitted == [(name, rank) for name in NAMES for rank in (0, 1)], emitted  # each once, in rank order
    for m, line in found:
        assert m[1] == m[3] and line.endswith(" by=r0"), line[:200]  # gather mode: the main process wrote it
        name, rank = m[2], int(m[3])
        body = line[m.end() : -len(" by=r0")]
        if rank == 1 and name in TRUNCATED:
            kept, marker = body.split("... [truncated ")
            assert marker.endswith(" MB]") and len(kept.encode()) < records.MAX_RECORD, (name, marker)
        else:  # the main process's own records never travel: they are whole, as are rank 1's small ones
            assert len(body) == LENGTHS.get(name, 3) and "[truncated" not in body, (name, rank, len(body))
    warnings = [line for line in job.stderr.splitlines() if "over gather mode's limit" in line]
    assert sorted(WARNING.search(line)[1] for line in warnings) == ["2", "3", "4"], warnings  # one per cut record
    assert "could not send" not in job.stderr and "sent no record" not in job.stderr, job.stderr[-3000:]
    (slowest,) = [float(line.split("=")[1]) for line in job.lines if line.startswith("@@RESULT r0 slowest=")]
    assert slowest < TIMEOUT, slowest  # no call waited out its deadline for a rank cut off from the store
    assert {line for line in job.lines if line.startswith("@@DONE")} == {"@@DONE r0", "@@DONE r1"}
    # A message whose %-format fails reads the same from every rank, the main process's own included.
    bad = [line for line in job.lines if "badformat %d" in line]
    assert [
        line.startswith(f"'[RANK {rank}] badformat %d' % ('x',) (could not be formatted: TypeError")
        for rank, line in enumerate(bad)
    ] == [True, True], bad
    assert all(line.endswith(" by=r0") for line in bad) and "--- Logging error ---" not in job.stderr, job.stderr[
        -3000:
    ]
