"""Promise: no in_order wait outlives T, whoever hosts the store; once the main process has finished, a rank
prints its own records, said once.

A 2-rank gather job started as plain processes with env:// (`spawn_ranks.py`: rank 0's process hosts the
TCPStore, as under notebook_launcher, debug_launcher or a script that calls `init_process_group` itself;
accelerate 1.15.0, `ACCELERATE_INORDER_TIMEOUT=2`). Rank 0 makes one call and returns; rank 1, once rank
0's process is gone, makes two. Its failed post used to be retried on a new client that kept reconnecting
to the gone server for the process group's timeout (30 minutes).
"""

import os
import re
import sys

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


TIMEOUT = 2.0
SAID = "gather mode could not send a record to the main process, printing it on this rank"


def test_a_rank_calling_after_the_main_process_took_the_store_away_prints_its_own_records_within_T():
    env = _launch.scenario_env(
        True, "gather", [accelerate_dir("1.15.0"), os.environ.get("AIF_PACKAGE_ROOT", str(REPO))]
    )
    env["ACCELERATE_INORDER_TIMEOUT"] = str(TIMEOUT)
    cmd = [sys.executable, str(SCRIPTS / "spawn_ranks.py"), "2", str(SCRIPTS / "main_exits_first.py")]
    job = _launch.run(cmd, env=env, timeout=90, stall=60)
    context = (job.killed, job.returncode, job.lines, job.stderr[-3000:])
    assert job.killed is None and job.returncode == 0, context
    assert {line for line in job.lines if line.startswith("@@DONE")} == {"@@DONE r0", "@@DONE r1"}, context
    records = [m.groups() for m in map(re.compile(r"^\[RANK (\d)\] (\S+) r\d by=r(\d)$").match, job.lines) if m]
    assert records == [("0", "before", "0"), ("1", "before", "0"), ("1", "after#1", "1"), ("1", "after#2", "1")]
    seconds = [float(line.split()[3]) for line in job.lines if line.startswith("@@SECONDS r1 ")]
    assert len(seconds) == 2 and max(seconds) < TIMEOUT, (seconds, context)
    assert job.stderr.count(SAID) == 1, context
