"""A rank is a rank whatever launched it, on any c10d store, for as long as its process group lives, from any thread.

Real jobs of 2-3 CPU ranks (gloo, T = 3 s) started by scripts/any_launcher.py, each under a hard timeout
that kills its process tree. Every job: exit code 0 within `BOUND` seconds, every record exactly once,
each call's records in rank order, and no warning. C1 (file://: the job never exited), C2
(a second `init_process_group`: every call unordered), C3 (`debug_launcher`, `notebook_launcher`,
multiprocessing fork: taken for forked children, unordered) and C4 (threads at two sites: a site given
up) each fail on 4f3c6d8.
"""

import collections
import re
import sys

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


SCRIPT = str(SCRIPTS / "any_launcher.py")
T = 3.0
BOUND = 60.0  # seconds a job may take in all (start-up of 2-3 interpreters with torch included)
RECORD = re.compile(r"^(?:\[RANK (\d)\] )?(\w+)#(\S+) r(\d)$")


def run(case, mode, nproc=2, said=0):
    env = _launch.scenario_env(True, mode, [accelerate_dir("1.15.0"), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(T)
    job = _launch.run([sys.executable, SCRIPT, case, str(nproc)], env=env, timeout=150, stall=90)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < BOUND, job
    assert job.stderr.count("accelerate-inorder-fix:") == said, job.stderr[-3000:]
    return job


def check_order(job, case, nproc, whole=True):
    """Each call's records once per rank, in rank order; `whole`: the calls one after another, unmixed."""
    found = [(m[3], int(m[4])) for m in map(RECORD.match, job.lines) if m and m[2] == case]
    assert collections.Counter(found) == collections.Counter({(call, r): 1 for call, _ in found for r in range(nproc)})
    for call in {call for call, _ in found if not call.startswith("W")}:  # W: a worker's, at once
        assert [r for c, r in found if c == call] == list(range(nproc)), (call, job.lines)
    if whole:
        assert [r for _, r in found] == [r for _ in range(len(found) // nproc) for r in range(nproc)], job.lines
    return found


@pytest.mark.parametrize("case", ["debug", "notebook", "fork", "spawn"])
def test_every_launcher_starts_ranks(case):
    found = check_order(run(case, "barrier"), case, 2)
    assert len(found) == 2 * 3


@pytest.mark.parametrize("mode", ["barrier", "gather"])
@pytest.mark.parametrize("case", ["file", "spawn"])  # init_method file:// (FileStore) and tcp:// (TCPStore)
def test_any_store_exits_in_bounded_time(case, mode):
    assert len(check_order(run(case, mode), case, 2)) == 2 * 3


@pytest.mark.parametrize("mode", ["barrier", "gather"])
def test_a_second_process_group_is_a_new_session(mode):
    found = check_order(run("reinit", mode, 3), "reinit", 3)
    assert len(found) == 3 * 6


@pytest.mark.parametrize("mode", ["barrier", "gather"])
def test_threads_at_two_sites_each_in_rank_order(mode):
    found = check_order(run("threads", mode), "threads", 2, whole=False)
    assert len(found) == 2 * 10


def test_a_worker_forked_in_the_group_logs_at_once():
    job = run("worker", "barrier", said=2)  # each worker says once that it is not a rank
    found = check_order(job, "worker", 2, whole=False)
    assert sum(call == "W0" for call, _ in found) == 2
    assert job.stderr.count("a forked process logs its in_order records at once") == 2
