"""torch's own `[c10d] waitForInput ... likely a timeout` lines: exactly what docs/c10d-warnings.md says.

torch 2.13 logs two lines (C++, WARNING) whenever a blocking store call reaches its timeout; the
package cannot turn them off without lowering the user's own diagnostics, so the doc explains them.
These tests pin each claim it makes: none in a normal run; for a call only the main process makes, at
4 ranks, two per slice of T/8 that runs out: in gather mode all on rank 0, in one wait of at most T (its
wait reads ahead between slices), and in barrier mode sixteen on rank 0 (its check-in waits to its deadline,
in slices no signal stretches) when the other ranks make no in_order call, up to 32 on a rank when they wait
at the next one;
the user's opt-out (`TORCH_CPP_LOG_LEVEL=ERROR` before torch loads), and the route the doc names (a
wait woken at its deadline ends without them). Every job has a hard timeout.
"""

import datetime
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix import bounds
from accelerate_inorder_fix.cli import check as _check
from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.gather.collector import SLICE


pytestmark = pytest.mark.timed


C10D = "[c10d] waitForInput"
WAIT = """
import datetime, sys, threading, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
if "--wake" in sys.argv:  # at its deadline, another connection pokes the key: compare_set that creates nothing
    waker = store.clone()
    threading.Timer(0.2, lambda: waker.compare_set("k", b"unset", b"unset")).start()
try:
    store.wait(["k"], datetime.timedelta(seconds=2 if "--wake" in sys.argv else 0.2))
    print("woken", "there" if store.check(["k"]) else "absent")
except Exception as exc:
    print("timed out", type(exc).__name__)
"""


def _wait(*args, **env):
    run_env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"} | env
    return subprocess.run([sys.executable, "-c", WAIT, *args], env=run_env, capture_output=True, text=True, timeout=60)


def test_a_store_wait_that_times_out_makes_torch_log_two_c10d_lines():
    result = _wait()
    assert result.stdout.strip() == "timed out DistStoreError", result
    lines = [line for line in result.stderr.splitlines() if C10D in line]
    assert len(lines) == 2 and "socket.cpp:" in lines[0] and "likely a timeout" in lines[0], result.stderr


def test_torch_cpp_log_level_error_set_before_torch_loads_hides_them():
    """The user's opt-out the doc gives (process-wide: it hides torch's other C++ warnings too)."""
    result = _wait(TORCH_CPP_LOG_LEVEL="ERROR")
    assert result.stdout.strip() == "timed out DistStoreError", result
    assert C10D not in result.stderr, result.stderr


def test_a_wait_woken_at_its_deadline_ends_without_them():
    result = _wait("--wake")
    assert result.stdout.strip() == "woken absent", result  # woken, and the key is still not there
    assert C10D not in result.stderr, result.stderr


def _job(script_args, **env):
    job_env = _launch.scenario_env(True, None, [accelerate_dir("1.15.0"), str(REPO)])
    job_env.pop("TORCH_CPP_LOG_LEVEL", None)
    job_env.update(env)
    return _launch.run(_launch.launch_command(script_args, 4), env=job_env, timeout=150, stall=40)


@pytest.mark.parametrize("mode", ["barrier", "gather"])
def test_a_run_where_every_rank_makes_every_call_has_no_c10d_line(mode):
    job = _job([str(SCRIPTS / "rank_tags.py"), "%(message)s"], ACCELERATE_INORDER_MODE=mode)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert len(job.lines) == 4 and C10D not in job.stderr, job.stderr


def _timed_out_waits(job, rank):
    """(seconds each store wait of `rank` that timed out was given, seconds from its first line to its last)."""
    lines = [line for line in job.stderr.splitlines() if C10D in line and line.startswith(f"[rank{rank}]:")]
    given = [int(ms) / 1000 for ms in re.findall(r"timed out after (\d+)ms", "\n".join(lines))]
    stamps = [
        datetime.datetime.strptime(line.split()[1][:15], "%H:%M:%S.%f") for line in lines if len(line.split()) > 1
    ]
    return given, (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0


def test_a_gather_call_only_the_main_process_makes_gives_two_lines_on_rank_0():
    """20 main-only calls at one site: one wait runs to its deadline (the rest do not wait), on rank 0.

    Since the transport's rewrite the main process waits in slices of T/8 and reads ahead between them
    (the others' next records arrive during it): two lines per slice that runs out, not two in all.
    """
    timeout = 2.0
    job = _job(
        [str(SCRIPTS / "partial_calls.py"), "main_only_hidden"],
        ACCELERATE_INORDER_MODE="gather",
        ACCELERATE_INORDER_TIMEOUT=f"{timeout:g}",
    )
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    lines = [line for line in job.stderr.splitlines() if C10D in line]
    given, span = _timed_out_waits(job, 0)
    assert lines and all(line.startswith("[rank0]:") for line in lines), job.stderr
    assert len(lines) == 2 * len(given) and all(g <= SLICE * timeout for g in given), job.stderr  # whole slices
    # one call's wait of T; a rank nothing of which was read during it (slow to start on a loaded machine)
    # is quiet, and may be waited for a quarter T more at a later call: GATHER_DEATH in all, never more
    limit = bounds.GATHER_DEATH.value * timeout
    assert sum(given) <= limit and span < limit, job.stderr
    # the next site's records, found during that wait, were kept for the main process's call there, not
    # released as others-only (which made its first call there wait a timeout more)
    assert "has not within" not in job.stderr, job.stderr


def _c10d_lines_by_rank(job):
    """{rank: number of `[c10d] waitForInput` lines} in a job's stderr (each line starts `[rank<r>]:`)."""
    counts = {}
    for line in job.stderr.splitlines():
        if C10D in line:
            rank = int(line[len("[rank") : line.index("]")])
            counts[rank] = counts.get(rank, 0) + 1
    return counts


GIVEN_UP = {  # mode: (what the warning says of the ranks that missed the call, how its "Next:" begins)
    "gather": ("sent no record", "this call's records of rank 0 were printed without them, in rank order"),
    "barrier": ("did not make it", "this call's records are printed unordered on each rank"),
}


@pytest.mark.parametrize(("mode", "lines"), [("gather", ({0: 16}, {0: 14})), ("barrier", ({0: 16},))])
def test_a_main_only_call_the_others_never_make_gives_lines_on_rank_0_only(mode, lines):
    """`check`'s `partial`: rank 0 alone makes the call, the others go on to a collective.

    Gather mode: the main process's one wait of T for the records runs out in slices of T/8 (since the
    transport's rewrite it reads ahead between slices; nothing arrives here): 8 store waits time out,
    sixteen lines (7, fourteen, when the reads between slices took T/8 in all on a loaded machine).
    Barrier mode: rank 0's check-in waits for the verdict to its deadline T, in slices of T/8 (each re-armed with
    the time left, so no signal stretches it), then looks where the others are (nowhere in an in_order call):
    8 store waits time out, sixteen lines.
    """
    base = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    base["ACCELERATE_INORDER_TIMEOUT"] = "2"
    job = _launch.run_scenarios(
        ["partial"],
        4,
        True,
        mode=mode,
        pythonpath=[accelerate_dir("1.15.0"), str(REPO)],
        base_env=base,
        timeout=150,
        stall=40,
    )
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert _c10d_lines_by_rank(job) in lines, job.stderr
    given, _ = _timed_out_waits(job, 0)  # the one wait, to its deadline, never past its bound
    bound = {"gather": bounds.GATHER_MAIN_ONLY, "barrier": bounds.MAIN_ONLY}[mode].value * 2
    assert (1 - SLICE) * 2 <= sum(given) <= bound, job.stderr
    # The call was given up: one warning, on stderr in both modes, naming site, ranks, cost, next step, rule.
    said = [line for line in job.stderr.splitlines() if "accelerate-inorder-fix: in_order call at " in line]
    what, then = GIVEN_UP[mode]
    assert len(said) == 1 and re.search(
        rf"accelerate-inorder-fix: in_order call at \S*scenarios\.py:\d+ in partial(?: \(call 1 from there\))?: "
        rf"ranks 1, 2, 3 {what} within 2 s \(ACCELERATE_INORDER_TIMEOUT\)\. Cost: a wait of 2 s\. "
        rf"Next: {re.escape(then)}.*\. Rule: an in_order call is collective: every rank must make it\. Way out: .*lint.*\.$",
        said[0],
    ), job.stderr
    assert not [line for line in job.lines if "accelerate-inorder-fix" in line], job.lines
    assert _check.partial_word(job).startswith("ordered, given up"), said  # `check`'s row reads it


def test_a_barrier_call_only_the_main_process_makes_while_the_others_wait_gives_two_lines_per_waiting_rank():
    """`main_only_hidden`: the others wait at the next in_order call. Each rank's check-in waits in slices of
    T/8: two lines per slice that runs out, up to 16 for its T and 16 more for a cycle winner's second T."""
    job = _job(
        [str(SCRIPTS / "partial_calls.py"), "main_only_hidden"],
        ACCELERATE_INORDER_MODE="barrier",
        ACCELERATE_INORDER_TIMEOUT="2",
    )
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert "had not made it, waiting at another in_order call" in job.stderr, job.stderr
    counts = _c10d_lines_by_rank(job)
    assert counts and set(counts) <= {0, 1, 2, 3} and set(counts.values()) <= set(range(2, 33, 2)), job.stderr
