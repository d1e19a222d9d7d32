"""Promises at the session's edges, on real jobs (3 CPU ranks, gloo, T = `ACCELERATE_INORDER_TIMEOUT` = 2 s):

- a call some rank skips costs at most T at that call, the job's first one too, and a gather-mode post never
  waits for the main process's word (written when its process group starts);
- a forked process is not a rank, whenever it was forked (before its parent's first in_order call, or
  while a thread of its parent is inside one): it prints its own record at once and never blocks;
- `configure(mode=...)` on one rank alone, mid-job, is not taken (the mode is fixed per job): one line,
  no record lost;
- in_order calls from exit handlers, after the package closed its session, are logged at once: no rank
  waits in a barrier for one that is busy elsewhere;
- gather mode: a call only the non-main ranks make is printed within about a timeout, not at exit, and
  the collector keeps nothing of it;
- barrier mode: the main process's word comes late (its `init_process_group` bound before the package loaded,
  and 2.5 T of its own work before a line): the others' first two calls, logged at once for want of the word, cost
  those calls only; the line's later calls are in rank order, and no rank waits past the main's lateness.

Each job runs several cases of scripts/session_edges.py; each test gathers every row's problems before
failing, so one run on the unfixed code (f0a0bfc) shows each row that breaks there.
"""

import collections
import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


SCRIPT = str(SCRIPTS / "session_edges.py")
NPROC = 3
T = 2.0
# Barrier mode before accelerate 1.13 has no `[RANK n] ` tag (upstream's record); gather mode always has it.
RECORD = re.compile(r"^(?:\[RANK (\d)\] )?(\w+)#(\d+) r(\d)( child)? @@\w+ by=r(\d) p(\d+)$")


def run(cases, mode, version="1.15.0"):
    env = _launch.scenario_env(True, mode, [accelerate_dir(version), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(T)
    job = _launch.run(_launch.launch_command([SCRIPT, ",".join(cases)], NPROC), env=env, timeout=150, stall=40)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    for case in cases:
        done = {line for line in job.lines if line.startswith(f"@@DONE {case} ")}
        assert done == {f"@@DONE {case} r{rank}" for rank in range(NPROC)}, (case, done)
        sums = {line for line in job.lines if line.startswith(f"@@RESULT {case} ") and " sum=" in line}
        assert sums == {f"@@RESULT {case} r{rank} sum=6.0" for rank in range(NPROC)}, (case, sums)
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
    return job


def records(job, case):
    """[(call, rank, child, by, pid)] of `case`'s record lines, in output order."""
    found = []
    for m in map(RECORD.match, job.lines):
        if m and m[2] == case:
            assert m[1] in (None, m[4]), m[0]  # the [RANK n] tag is the record's own rank
            found.append((int(m[3]), int(m[4]), bool(m[5]), int(m[6]), int(m[7])))
    return found


def results(job, case, key):
    pattern = re.compile(rf"^@@RESULT {case} r(\d) {key}=(.*)$")
    return {int(m[1]): m[2] for m in map(pattern.match, job.lines) if m}


def said(job, text):
    return [line for line in job.stderr.splitlines() + job.lines if text in line]


def once_each(found, expected, problems, row):
    counts = collections.Counter((call, rank, child) for call, rank, child, *_ in found)
    if counts != collections.Counter(expected):
        problems.append(f"{row}: records {sorted(counts.items())} != each of {sorted(expected)} once")


BARRIER_CASES = ["first_call", "fork_locked", "one_sided", "at_exit"]


@pytest.mark.parametrize("version", ["1.12.0"])
def test_barrier_mode_first_call_forks_one_sided_mode_and_exit_handlers(version):
    job = run(BARRIER_CASES, "barrier", version)
    problems = []

    # D1: rank 0 skips the job's first in_order call (a loop, an all_reduce per step): T in all, not 2 T.
    found = records(job, "first_call")
    loop = [f for f in found if f[0] > 10]
    once_each(loop, [(10 + s, r, False) for s in (1, 2, 3) for r in range(NPROC) if (r, s) != (0, 1)], problems, "D1")
    for rank in (1, 2):
        first = float(results(job, "first_call", "step1")[rank])
        if not 0.9 * T <= first <= 1.25 * T:
            problems.append(f"D1: rank {rank}'s skipped first call took {first} s, not about T = {T} s")
    if any(by != rank for _c, rank, _ch, by, _p in loop):
        problems.append("D1: a barrier-mode record was written by another rank")

    # D2: a child forked before its parent's first in_order call prints its own record, at once; the parents'
    # later calls from the same line stay whole and in rank order (no drift, no damage).
    pids = {rank: int(pid) for rank, pid in results(job, "first_call", "pid").items()}
    children = [f for f in found if f[2]]
    once_each(children, [(0, r, True) for r in range(NPROC)], problems, "D2")
    if any(pid == pids[rank] for _c, rank, _ch, _by, pid in children):
        problems.append("D2: a child's record was made by its parent")
    if set(results(job, "first_call", "child_exitcode").values()) != {"0"}:
        problems.append(f"D2: children exited {results(job, 'first_call', 'child_exitcode')}")
    shared = [(c, r) for c, r, child, *_ in found if 1 <= c <= 3 and not child]
    if shared != [(c, r) for c in (1, 2, 3) for r in range(NPROC)]:
        problems.append(f"D2: the parents' calls from the child's line came out as {shared}")
    if len(said(job, "a forked process logs its in_order records at once")) != NPROC + 2:  # + D3's children
        problems.append(f"D2: {said(job, 'a forked process logs')}")
    if said(job, "found something else in the job's store"):
        problems.append("D2: a check-in found a counter someone else wrote to (a child checked in as its parent)")

    # D3: a child forked while a thread of its parent is inside an in_order call never blocks.
    found = records(job, "fork_locked")
    once_each(found, [(1, r, False) for r in range(NPROC)] + [(0, r, True) for r in (1, 2)], problems, "D3")
    if set(results(job, "fork_locked", "child_exitcode").values()) != {"0"}:
        problems.append(f"D3: children exited {results(job, 'fork_locked', 'child_exitcode')} (None: blocked)")

    # D9: rank 1 alone sets gather mid-job: not taken (the mode is fixed per job), one line, every record once.
    found = records(job, "one_sided")
    once_each(found, [(c, r, False) for c in (1, 2, 3) for r in range(NPROC)], problems, "D9")
    if any(by != rank for _c, rank, _ch, by, _p in found):
        problems.append("D9: a record was printed by another rank: the ranks did not all stay in barrier mode")
    refused = said(
        job, "rank 1: the in_order mode (ACCELERATE_INORDER_MODE or configure(mode=...)) changed to 'gather'"
    )
    if len(refused) != 1 or "it stays barrier" not in refused[0]:
        problems.append(f"D9: the refusal was said {len(refused)} times")
    slowest = max(float(v) for v in results(job, "one_sided", "seconds").values())
    if slowest > 1.5 * T + 3 * 0.1:  # the stagger: 2 x 0.05 s per call
        problems.append(f"D9: the switch cost {slowest} s")

    # At exit, after the package closed: ranks 1 and 2 log while rank 0 is busy for 2 T: no wait.
    found = records(job, "at_exit")
    once_each(found, [(1, r, False) for r in (1, 2)], problems, "at_exit")
    exits = results(job, "at_exit", "seconds")
    if sorted(exits) != [1, 2] or max(float(v) for v in exits.values()) > 0.25 * T:
        problems.append(f"at_exit: the calls at exit took {exits} s (rank 0 was busy for 2 T)")
    assert not problems, "\n".join(problems)


def test_gather_mode_first_post_never_waits_and_a_call_only_other_ranks_make_is_printed_within_a_timeout():
    job = run(["first_post", "others_only"], "gather")
    problems = []

    # D1: rank 0 skips the job's first in_order call: the others' posts do not wait for its word (written when
    # its process group started).
    for rank in (1, 2):
        first = float(results(job, "first_post", "step1")[rank])
        if first > 0.25 * T:
            problems.append(f"D1: rank {rank}'s first post took {first} s")
    found = records(job, "first_post")
    once_each(found, [(s, r, False) for s in (1, 2, 3) for r in range(NPROC) if (r, s) != (0, 1)], problems, "D1")
    if {by for *_x, by, _p in found} != {0} or not any(rank == 1 for _c, rank, *_ in found):
        problems.append("D1: not gathered by the main process")

    # D10: the others-only call's records come out before the main process's case ends (not at exit), once each,
    # with one warning naming the line and ranks 1 and 2; the collector keeps nothing per call.
    found = records(job, "others_only")
    once_each(
        found,
        [(s, r, False) for s in range(1, 31) for r in (1, 2)]
        + [(100 + s, r, False) for s in range(1, 31) for r in range(NPROC)],
        problems,
        "D10",
    )
    if {by for *_x, by, _p in found} != {0}:
        problems.append("D10: not gathered by the main process")
    done = job.lines.index("@@DONE others_only r0")
    late = [line for line in job.lines[done:] if RECORD.match(line) and "others_only#" in line]
    if late:
        problems.append(f"D10: {len(late)} records printed after the case ended (at exit): {late[:2]}")
    warned = [w for w in said(job, "made it and the main process went past it") if " in first_post:" not in w]
    if len(warned) != 1 or "in others_only: ranks 1, 2 made it" not in warned[0]:
        problems.append(f"D10: warnings {warned}")
    kept = int(results(job, "others_only", "kept").get(0, -1))
    if not 0 <= kept <= 2:  # first_post's call 3, which the main process never makes (its skip shifted rank 1 and 2)
        problems.append(f"D10: the collector still keeps {kept} calls")
    assert not problems, "\n".join(problems)


LATE_WORD = re.compile(r"^(?:\[RANK (\d)\] )?late_word#(\d) r(\d)$")


def test_barrier_mode_a_late_word_from_the_main_process_costs_the_calls_before_it_only():
    """ddf0396 numbered the others' word-less calls and never counted them at their site, so the main process's
    call 1 met their call 3 in the store: every call unordered, the line retired, ranks 1 and 2 waited 4 T."""
    env = _launch.scenario_env(True, "barrier", [accelerate_dir("1.15.0"), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(T)
    cmd = _launch.launch_command([str(SCRIPTS / "late_word.py")], NPROC)
    job = _launch.run(cmd, env=env, timeout=90, stall=40)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert {line for line in job.lines if line.startswith("@@DONE")} == {
        f"@@DONE late_word r{r}" for r in range(NPROC)
    }
    found = [(int(m[2]), int(m[3])) for m in map(LATE_WORD.match, job.lines) if m]
    assert all(m[1] in (None, m[3]) for m in map(LATE_WORD.match, job.lines) if m)
    assert sorted(found) == [(c, r) for c in range(1, 6) for r in range(NPROC)]  # each record exactly once
    spans = {
        (int(m[1]), int(m[2])): (float(m[3]), float(m[4]))
        for m in map(re.compile(r"^@@CALL late_word r(\d) c(\d) began=(\S+) ended=(\S+)$").match, job.lines)
        if m
    }
    word = spans[0, 1]  # the main process's first call: its word is written in it
    before = max(sum(spans[r, c][1] < word[1] for c in range(1, 6)) for r in range(1, NPROC))
    assert 2 <= before <= 3, spans  # two calls logged for want of the word (three on a machine slow to start rank 0)
    assert [rank for call, rank in found if call > before] == list(range(NPROC)) * (5 - before)  # then rank order
    assert spans[0, 5][1] - word[0] < 0.25 * T, spans  # the main process came last to every call: it never waits
    assert max(spans[r, 5][1] for r in range(NPROC)) - word[0] < 0.25 * T, spans  # the others: its lateness, no more
    warned = said(job, "no word from the main process")
    assert len(warned) == NPROC - 1, warned
    assert not said(job, "did not make it") and not said(job, "missed two calls"), job.stderr[-2000:]
