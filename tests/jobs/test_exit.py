"""Promise: the package adds no abort at exit to a real training job.

The job (scripts/train_exit.py) is a user's DDP loop in `main()`, launched with `accelerate launch
--multi_gpu --num_processes 4`: an in_order loss line per step, `save_state`, one more in_order line,
then an ending. Before the fix, a rank aborted at interpreter exit ("terminate called without an active
exception", SIGABRT, launcher exit 1) in most gather- and barrier-mode runs: a daemon thread of ours
(gather mode's clean-up, barrier mode's former check-in janitor, since removed) was inside a c10d store call when the
interpreter finalized; on taking the GIL back CPython ends the thread, and the forced unwind through
pybind11's noexcept `gil_scoped_release` destructor calls std::terminate.

torch 2.13 with gloo also aborts at exit on its own now and then, so every count is compared with
upstream (the same script, unpatched) in the same run, the launches interleaved. Groups:

- `end_training`: the job ends with `accelerator.end_training()` (destroys the group): barrier mode,
  gather mode, upstream;
- `no_destroy`: the job leaves its group to interpreter exit: barrier mode, gather mode, upstream.

Each patched variant may abort at most once more than its upstream (torch's own aborts are random).
Every run must end with exit code 0 or that abort and nothing else; every in_order record comes out
exactly once, written by the rank that should (gather mode ran: rank 0 wrote them all, and the ranks'
clean-up threads ran).

CI runs `RUNS` (3) launches of each variant: 21 launches of about 17 CPU-seconds each (five interpreters
importing torch), about 3 minutes on 2 idle cores, within the suite's time budget. The stress run, 20 of
each (42 minutes measured on a loaded machine): `AIF_EXIT_RUNS=20 python -m pytest tests/jobs/test_exit.py -s`.
"""

import collections
import os
import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


SCRIPT = str(SCRIPTS / "train_exit.py")
VERSION = "1.15.0"
NPROC = 4
RUNS = int(os.environ.get("AIF_EXIT_RUNS", "3"))
CALLS = 32  # in_order calls per job in one mode (train_exit.STEPS + 1): a gather-mode rank's clean-up runs once
SWITCH_AT = 8  # train_exit.SWITCH_AT
ABORT = ("terminate called without an active exception", "(SIGABRT)")
RECORD = re.compile(r"^(?:\[RANK (?P<prefix>\d+)\] )?exit#(?P<call>\d+) r(?P<rank>\d+) .* @@main by=r(?P<by>\d+)$")
DONE = re.compile(r"^(?:\[RANK \d+\] )?@@DONE r(?P<rank>\d+) cleaner=(?P<cleaner>[01]) threads=\d+$")

# variant: (group, patched, mode, ending, switch)
VARIANTS = {
    "end_training/upstream": ("end_training", "0", "barrier", "end_training", "none"),
    "end_training/barrier": ("end_training", "1", "barrier", "end_training", "none"),
    "end_training/gather": ("end_training", "1", "gather", "end_training", "none"),
    "no_destroy/upstream": ("no_destroy", "0", "barrier", "none", "none"),
    "no_destroy/barrier": ("no_destroy", "1", "barrier", "none", "none"),
    "no_destroy/gather": ("no_destroy", "1", "gather", "none", "none"),
}


def _launch_one(patched, mode, ending, switch):
    env = dict(os.environ, ACCELERATE_INORDER_MODE=mode, ACCELERATE_INORDER_TIMEOUT="10", OMP_NUM_THREADS="1")
    env["ACCELERATE_INORDER_FIX"] = "on" if patched == "1" else "0"
    env["PYTHONPATH"] = os.pathsep.join([accelerate_dir(VERSION), str(REPO)])
    for _attempt in range(2):  # a port taken between picking and binding it: once more, on another
        cmd = _launch.launch_command([SCRIPT, patched, ending, switch], NPROC, launcher="accelerate")
        job = _launch.run(cmd, env=env, timeout=120)
        if job.returncode == 0 or "address already in use" not in job.stderr.lower():
            break
    return job


def _writers(job):
    """{(call, rank): [writer, ...]} over every record line of the job."""
    found = collections.defaultdict(list)
    for m in filter(None, map(RECORD.match, job.lines)):
        assert m["prefix"] in (None, m["rank"], m["by"]), m.string
        found[(int(m["call"]), int(m["rank"]))].append(int(m["by"]))
    return found


def _check_run(name, job):
    """The run's work is right and it ended in exit code 0 or a SIGABRT at exit; True if it aborted."""
    _group, patched, mode, _ending, switch = VARIANTS[name]
    where = f"{name}: {job}\n{job.stderr[-3000:]}"
    assert job.killed is None, where
    done = {int(m["rank"]): m["cleaner"] == "1" for m in filter(None, map(DONE.match, job.lines))}
    assert sorted(done) == list(range(NPROC)), where  # main() returned on every rank
    calls = CALLS + (SWITCH_AT if switch != "none" else 0)
    writers = _writers(job)
    assert sorted(writers) == [(c, r) for c in range(calls) for r in range(NPROC)], where
    for (call, rank), by in writers.items():
        gathered = patched == "1" and (mode == "gather" or (switch == "gather" and call >= SWITCH_AT))
        assert by == [0 if gathered else rank], f"{name}: record {call} of rank {rank} written by {by}"
    if patched == "1" and "gather" in (mode, switch):  # every other rank's clean-up thread ran
        assert all(done[r] for r in range(1, NPROC)), f"{name}: clean-up threads {done}"
    aborted = job.returncode != 0
    if aborted:
        assert any(sign in job.stderr for sign in ABORT), where  # that abort, nothing else
    return aborted


@pytest.fixture(scope="module")
def aborts():
    """{variant: number of runs that aborted at exit}: RUNS launches of each, interleaved."""
    counts = dict.fromkeys(VARIANTS, 0)
    for round_ in range(1, RUNS + 1):
        for name, (_group, patched, mode, ending, switch) in VARIANTS.items():
            counts[name] += _check_run(name, _launch_one(patched, mode, ending, switch))
        print(f"\naborts at exit after {round_} of {RUNS} rounds: {counts}", flush=True)
    return counts


def _assert_no_added_abort(aborts, variants, upstream):
    said = f"aborts of {RUNS} runs each: {aborts}"
    for name in variants:
        assert aborts[name] <= aborts[upstream] + 1, f"{name} adds aborts at exit; {said}"


def test_end_training_adds_no_abort_at_exit(aborts):
    _assert_no_added_abort(aborts, ["end_training/barrier", "end_training/gather"], "end_training/upstream")


def test_a_group_left_to_interpreter_exit_adds_no_abort(aborts):
    _assert_no_added_abort(aborts, ["no_destroy/barrier", "no_destroy/gather"], "no_destroy/upstream")
