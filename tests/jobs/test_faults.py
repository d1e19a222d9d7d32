"""Promise: every enabled in_order record of a live rank comes out exactly once, no log call raises, no
wait outlives its bound, and no bad setting passes silently -- under faults, proven on real jobs.

The cases live in scripts/fault_ranks.py and run several to a job (each job is one launch, 4 CPU
ranks). Every test counts each expected record (exactly once, by the process that should write it:
`by=r0` is the main process, so gather mode ran), asserts the launcher's exit code and the job's time
bound, and checks the one-line warnings the faults must produce.
"""

import collections
import re
import sys

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir, run_python, two_nodes

from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


SCRIPT = str(SCRIPTS / "fault_ranks.py")
NPROC = 4
TIMEOUT = 2.0  # the main process's ACCELERATE_INORDER_TIMEOUT in the gather jobs
SLOW = TIMEOUT + 2.0  # how late the slow rank is
RECORD = re.compile(
    r"^(?:\[RANK (?P<prefix>\d+)\] )?(?P<case>\w+)#(?P<call>\d+) r(?P<rank>\d+)(?: t(?P<thread>\d+))?"
    r"(?P<text>.*) @@(?P<func>\w+) by=r(?P<by>\d+)$"
)
ALL = range(NPROC)
THREAD_CALLS = 20  # per thread, 3 threads per rank (fault_ranks.THREAD_CALLS)


def records(lines, caller=None):
    """Counter of (case, call, rank, thread, by) over every record line.

    Also checks each record's `[RANK n]` prefix (its own rank) and caller function (`caller`, or the
    case's own function or its threads' `work`).
    """
    found = collections.Counter()
    for line in lines:
        m = RECORD.match(line)
        if m:
            assert m["prefix"] in (None, m["rank"]), f"[RANK n] prefix of another rank: {line[:200]}"
            callers = (caller,) if caller else (m["case"], "work")
            assert m["func"] in callers, f"caller is not the case's function: {line[:200]}"
            thread = int(m["thread"]) if m["thread"] else None
            found[(m["case"], int(m["call"]), int(m["rank"]), thread, int(m["by"]))] += 1
    return found


def expect(found, case, call, ranks, by=0, thread=None):
    """Each of `ranks`' record of `case#call` exactly once, written by `by` (None: by the rank itself)."""
    for rank in ranks:
        writer = rank if by is None else by
        key = (case, call, rank, thread, writer)
        assert found.pop(key, 0) == 1, f"{key}: {found.get(key, 0)} copies; rest: {sorted(found)[:20]}"


def block_ranks(lines, case):
    """The ranks of `case`'s records in output order (blocks whole and in rank order: 0, 1, .., 0, 1, ..)."""
    return [int(m["rank"]) for m in map(RECORD.match, lines) if m and m["case"] == case]


def results(lines, case, key):
    pattern = re.compile(rf"^@@RESULT {case} r(\d+) {key}=(.*)$")
    return {int(m[1]): float(m[2]) for m in map(pattern.match, lines) if m}


def done(lines, case):
    return {int(line.split()[2][1:]) for line in lines if line.startswith(f"@@DONE {case} ")}


def warnings(stderr, pattern):
    return [line for line in stderr.splitlines() if re.search(pattern, line)]


def env_for(version, mode, **extra):
    env = _launch.scenario_env(True, mode, [accelerate_dir(version), str(REPO)])
    env.update(extra)
    return env


def torchrun(cases, env, nproc=NPROC, timeout=150.0):
    cmd = _launch.launch_command([SCRIPT, ",".join(cases)], nproc)
    return _launch.run(cmd, env=env, timeout=timeout, stall=40)


def assert_ended(job, bound):
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < bound, job


GATHER_CASES = [
    "plain",
    "payloads",
    "quiet_main",
    "main_waits",
    "filter_raises",
    "threads",
    "slow_rank",
    "never_reached",
    "forked",
    "main_first",
]


@pytest.mark.parametrize("version", ["1.12.0"])
def test_gather_mode_emits_every_record_exactly_once_under_faults(version):
    env = env_for(
        version,
        "gather",
        AIF_RANK_TIMEOUTS=f"{TIMEOUT},inf,abc,-1",  # the main process's is good, the others' are not
        AIF_CONFIGURE_MODE="2:barrier",  # rank 2 alone asks for barrier mode
        AIF_SLOW=str(SLOW),
    )
    job = torchrun(GATHER_CASES, env)
    assert_ended(job, 120)
    lines, found = job.lines, records(job.lines)
    for case in GATHER_CASES[:-1]:
        assert done(lines, case) == set(ALL), case
    assert done(lines, "main_first") == set(ALL)
    expect(found, "plain", 1, ALL)
    expect(found, "plain", 2, ALL)
    # Payloads: %-args and non-ASCII merged on the rank, 1 MiB intact, stack and traceback follow.
    for n in range(1, 5):
        expect(found, "payloads", n, ALL)
    assert sum(" ünïcødé ✓ 日本語 — ok {'k': 1} @@payloads" in line for line in lines) == NPROC
    big = [line for line in lines if line.startswith(("payloads#2", "[RANK")) and len(line) > 1 << 20]
    assert len(big) == NPROC and all(line.count("x") >= 1 << 20 for line in big)
    for rank in ALL:
        at = next(i for i, line in enumerate(lines) if re.match(rf"^(\[RANK \d\] )?payloads#3 r{rank} ", line))
        assert lines[at + 1] == "Stack (most recent call last):", lines[at : at + 3]
        at = next(i for i, line in enumerate(lines) if re.match(rf"^(\[RANK \d\] )?payloads#4 r{rank} ", line))
        tail = next(line for line in lines[at + 1 : at + 12] if line.startswith("ValueError"))
        assert (
            lines[at + 1] == "Traceback (most recent call last):"
            and tail == f"ValueError: boom r{rank} ünïcødé ✓ 日本語 — ok"
        )
    expect(found, "quiet_main", 1, [1, 2, 3])
    expect(found, "main_waits", 1, ALL)
    assert results(lines, "main_waits", "seconds")[0] >= 0.3 * (NPROC - 1) - 0.05  # main waited for rank 1
    # A raising filter on the main process's handler loses rank 2's record of call 1, and only that.
    expect(found, "filter_raises", 1, [0, 1, 3])
    expect(found, "filter_raises", 2, ALL)
    assert (
        len(
            warnings(
                job.stderr, r"rank 2's record reached only the main process's handlers before the one that raised"
            )
        )
        == 1
    ), job.stderr[-3000:]
    for thread in range(3):
        for call in range(1, THREAD_CALLS + 1):
            expect(found, "threads", call, ALL, thread=thread)
    assert block_ranks(lines, "threads") == list(ALL) * 3 * THREAD_CALLS  # blocks whole, in rank order
    # The slow rank: on its own after the block that missed it, named by one warning, nobody waits past the bound.
    expect(found, "slow_rank", 1, ALL)
    expect(found, "slow_rank", 2, ALL)
    assert max(results(lines, "slow_rank", "seconds").values()) < TIMEOUT + 1.0
    # Its warning, on stderr in the voice barrier mode uses: site, ranks, cost, what was printed, the rule.
    named = [line for line in job.stderr.splitlines() if "sent no record" in line]
    assert len(named) == 1 and re.search(
        r"^accelerate-inorder-fix: in_order call at \S*fault_ranks\.py:\d+ in slow_rank \(call 1 from there\): "
        r"rank 2 sent no record within 2 s \(ACCELERATE_INORDER_TIMEOUT\)\. Cost: a wait of 2 s\. "
        r"Next: this call's records of ranks 0, 1, 3 were printed without them, in rank order; .*\. "
        r"Rule: an in_order call is collective: every rank must make it\. Way out: .*lint.*\.$",
        named[0],
    ), named
    # The call site the main process never reached: out once the main process makes a call the others made
    # after it (never_reached#2, same thread), with one warning naming them.
    expect(found, "never_reached", 1, [1, 2, 3])
    expect(found, "never_reached", 2, ALL)
    went_past = [line for line in job.stderr.splitlines() if "made it and the main process went past it" in line]
    assert len(went_past) == 1 and "never_reached" in went_past[0] and "ranks 1, 2, 3" in went_past[0], went_past
    # A forked child's in_order record: printed by the child, never sent through its parent's connection.
    expect(found, "forked", 1, ALL, by=None)
    expect(found, "forked", 2, ALL)
    assert set(results(lines, "forked", "exitcode").values()) == {0.0}
    assert len(warnings(job.stderr, r"a forked process logs its in_order records at once")) == NPROC
    # The main process finished first: its block went out, the others print their later calls themselves.
    expect(found, "main_first", 1, ALL)
    expect(found, "main_first", 2, [1, 2, 3], by=None)
    expect(found, "main_first", 3, [1, 2, 3], by=None)
    assert len(warnings(job.stderr, r"the main process has finished; this rank prints")) == 3
    assert not found, f"unexpected records: {sorted(found)[:20]}"
    # Settings: a bad value is said by the host's local main process only (ranks share the launcher's
    # environment); rank 0's is good here, so the values ranks 1-3 set for themselves are not said, and
    # each of them uses the default (their calls ended within the main process's bound above).
    # Rank 2's mode, once.
    for value in ("inf", "abc", "-1"):
        said = warnings(job.stderr, rf"ACCELERATE_INORDER_TIMEOUT='{value}' is not valid")
        assert said == [], job.stderr[-3000:]
    said = warnings(job.stderr, r"in_order mode setting")
    assert said == [
        "accelerate-inorder-fix: rank 2: in_order mode setting 'barrier' (from configure()) differs from the "
        "main process's; using the main process's mode, gather"
    ], job.stderr[-3000:]
    assert "Traceback" not in job.stderr and "could not" not in job.stderr, job.stderr[-3000:]


@pytest.mark.parametrize("version", ["1.15.0"])
def test_barrier_mode_with_bad_settings_threads_and_a_disagreeing_rank(version):
    env = env_for(
        version,
        None,
        ACCELERATE_INORDER_MODE="gahter",  # a typo: barrier mode, said once per process
        AIF_RANK_TIMEOUTS="0,inf,abc,-1",
        AIF_CONFIGURE_MODE="1:GATHER",  # rank 1 alone asks for gather mode (any case)
    )
    cases = ["plain", "threads", "quiet_main", "payloads"]
    job = torchrun(cases, env)
    assert_ended(job, 90)
    found = records(job.lines)
    for case in cases:
        assert done(job.lines, case) == set(ALL), case
    expect(found, "plain", 1, ALL, by=None)
    expect(found, "plain", 2, ALL, by=None)
    for thread in range(3):
        for call in range(1, THREAD_CALLS + 1):
            expect(found, "threads", call, ALL, by=None, thread=thread)
    # One in_order call at a time per process: each call's barriers pair up, so blocks stay whole.
    assert block_ranks(job.lines, "threads") == list(ALL) * 3 * THREAD_CALLS
    expect(found, "quiet_main", 1, [1, 2, 3], by=None)
    for n in range(1, 5):
        expect(found, "payloads", n, ALL, by=None)
    assert not found, sorted(found)[:20]
    # A bad value is said once per host, by its local main process (rank 0 here): the mode word, and rank
    # 0's own timeout; the values ranks 1-3 set for themselves are not said (they use the default).
    said = warnings(job.stderr, r"ACCELERATE_INORDER_MODE='gahter' is not valid .*; using the default, barrier")
    assert len(said) == 1, job.stderr
    for value, lines in (("0", 1), ("inf", 0), ("abc", 0), ("-1", 0)):
        assert len(warnings(job.stderr, rf"ACCELERATE_INORDER_TIMEOUT='{value}' is not valid")) == lines, job.stderr
    said = warnings(job.stderr, r"in_order mode setting")
    assert said == [
        "accelerate-inorder-fix: rank 1: in_order mode setting 'gather' (from configure()) differs from the "
        "main process's; using the main process's mode, barrier"
    ], job.stderr[-3000:]
    assert "Traceback" not in job.stderr, job.stderr[-3000:]


def test_rank_killed_mid_job_costs_one_timeout():
    env = env_for("1.15.0", "gather", ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT))
    cmd = [sys.executable, str(SCRIPTS / "spawn_ranks.py"), str(NPROC), SCRIPT, "plain,killed"]
    job = _launch.run(cmd, env=env, timeout=90, stall=30)
    assert_ended(job, 60)
    found = records(job.lines)
    expect(found, "plain", 1, ALL)
    expect(found, "plain", 2, ALL)
    expect(found, "killed", 1, ALL)
    expect(found, "killed", 2, [0, 1, 2])
    expect(found, "killed", 3, [0, 1, 2])
    assert not found, sorted(found)
    assert done(job.lines, "killed") == {0, 1, 2}
    assert max(results(job.lines, "killed", "seconds").values()) < TIMEOUT + 1.0
    named = [line for line in job.stderr.splitlines() if "sent no record" in line]
    assert len(named) == 1 and "rank 3 sent no record within" in named[0], named


def test_gather_mode_does_not_wait_for_ranks_whose_records_are_disabled():
    """The non-main ranks' records are disabled (their level): each posts an empty marker instead, so the main
    process never waits for them. A rank that stopped posting its marker costs the main process a timeout and
    a "sent no record" warning at its first call: both fail here, in seconds."""
    env = env_for("1.15.0", "gather", ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT))
    job = torchrun(["others_disabled", "plain"], env, nproc=3, timeout=90)
    assert_ended(job, 60)
    found = records(job.lines)
    for call in (1, 2, 3):
        expect(found, "others_disabled", call, [0])
    expect(found, "plain", 1, [0, 1, 2])
    expect(found, "plain", 2, [0, 1, 2])
    assert not found, sorted(found)
    assert done(job.lines, "others_disabled") == {0, 1, 2}
    assert [line for line in job.lines + job.stderr.splitlines() if "sent no record" in line] == []
    assert max(results(job.lines, "others_disabled", "seconds").values()) < TIMEOUT / 2, job.lines
    assert "Traceback" not in job.stderr and "could not" not in job.stderr, job.stderr[-3000:]


def test_gather_mode_a_skipped_call_shifts_that_ranks_later_records_back_one_block():
    """What README and the collector say a skipped call does (a call is named by its site and its count there):
    rank 1 skips call 2 of 5 from one site, so its n-th call from there is the job's call n + 1. Each of its later
    records comes out, once, in the block of the call before, and only the last call names it missing."""
    env = env_for("1.15.0", "gather", ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT))
    job = torchrun(["skips_one"], env, nproc=3, timeout=90)
    assert_ended(job, 60)
    blocks = [(int(m["call"]), int(m["rank"])) for m in map(RECORD.match, job.lines) if m and m["case"] == "skips_one"]
    assert blocks == [
        (1, 0), (1, 1), (1, 2),
        (2, 0), (3, 1), (2, 2),
        (3, 0), (4, 1), (3, 2),
        (4, 0), (5, 1), (4, 2),
        (5, 0), (5, 2),
    ], blocks  # fmt: skip
    named = [line for line in job.stderr.splitlines() if "sent no record" in line]
    assert len(named) == 1 and "rank 1 sent no record within" in named[0] and "(call 5 from there)" in named[0], named
    assert done(job.lines, "skips_one") == {0, 1, 2}


def test_gather_post_applied_before_its_reply_was_lost_comes_out_once():
    """Rank 1's second post: the server applies its `compare_set`, then the connection fails before the reply.
    The rank asks again on a fresh connection, learns the record landed, and leaves it to the main process:
    once, by r0 (the unfixed code printed it on rank 1 too: twice). Its next post goes out on that connection."""
    env = env_for("1.15.0", "gather", ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT))
    job = torchrun(["reply_lost", "plain"], env, nproc=2, timeout=90)
    assert_ended(job, 60)
    found = records(job.lines)
    hit = [key for key in found.elements() if key[:3] == ("reply_lost", 2, 1)]
    assert hit == [("reply_lost", 2, 1, None, 0)], f"the lost reply's record, as written: {hit}"
    for call in (1, 2, 3):
        expect(found, "reply_lost", call, [0, 1])
    expect(found, "plain", 1, [0, 1])
    expect(found, "plain", 2, [0, 1])
    assert not found, sorted(found)
    assert done(job.lines, "reply_lost") == {0, 1}
    assert max(results(job.lines, "reply_lost", "call2")[1], results(job.lines, "reply_lost", "call3")[1]) < TIMEOUT
    assert len(warnings(job.stderr, "a fresh connection settled it")) == 1
    assert "could not send a record" not in job.stderr and "Traceback" not in job.stderr, job.stderr[-3000:]


def test_two_nodes_disagreeing_on_mode_use_the_main_process_mode(tmp_path):
    """`ACCELERATE_INORDER_MODE=gather` exported on node 1 only: barrier mode everywhere, node 1's ranks say so."""
    node_env = ("", "ACCELERATE_INORDER_MODE=gather ")
    job, out, err = two_nodes([SCRIPT, "plain,threads"], env_for("1.15.0", None), tmp_path, node_env)
    assert_ended(job, 90)
    found = records(out[0] + out[1])
    expect(found, "plain", 1, ALL, by=None)
    expect(found, "plain", 2, ALL, by=None)
    for thread in range(3):
        for call in range(1, THREAD_CALLS + 1):
            expect(found, "threads", call, ALL, by=None, thread=thread)
    assert not found
    assert not warnings(err[0], "in_order mode setting"), err[0]
    said = warnings(err[1], "in_order mode setting")
    assert sorted(said) == [
        f"accelerate-inorder-fix: rank {rank}: in_order mode setting 'gather' (from ACCELERATE_INORDER_MODE) "
        "differs from the main process's; using the main process's mode, barrier"
        for rank in (2, 3)
    ], err[1]


def test_unrebuildable_record_attribute_arrives_as_its_repr():
    """Rank 1's record carries an attribute the main process cannot rebuild: the record still arrives."""
    env = env_for("1.15.0", "gather", ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT))
    job = torchrun(["unrebuildable", "plain"], env, nproc=2, timeout=90)
    assert_ended(job, 60)
    found = records(job.lines)
    for call in (1, 2):
        expect(found, "unrebuildable", call, [0, 1])
    expect(found, "plain", 1, [0, 1])
    expect(found, "plain", 2, [0, 1])
    assert not found, sorted(found)
    assert [line for line in job.lines if line.startswith("@@ODD")] == ["@@ODD r1 str <Unrebuildable>"]
    assert "sent no record" not in job.stderr and "could not" not in job.stderr, job.stderr


def test_bad_switch_words_are_reported_once():
    code = "import accelerate_inorder_fix as f, accelerate.logging; print(f.is_patched())"
    env = {"ACCELERATE_INORDER_FIX": "of", "ACCELERATE_INORDER_FIX_STARTUP": "nope"}
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert proc.stderr.splitlines() == [
        "accelerate-inorder-fix: ACCELERATE_INORDER_FIX='of' is not valid (not one of "
        "0/off/false/no/1/on/true/yes/force); using the default, on",
        "accelerate-inorder-fix: ACCELERATE_INORDER_FIX_STARTUP='nope' is not valid (not one of "
        "0/off/false/no/1/on/true/yes); using the default, on",
    ]
    for word in ("OFF", "0", "force", "yes", ""):
        proc = run_python("import accelerate_inorder_fix", env={"ACCELERATE_INORDER_FIX": word})
        assert proc.returncode == 0 and proc.stderr == "", (word, proc.stderr)


def test_configure_refuses_bad_values_and_accepts_any_case():
    code = (
        "import accelerate_inorder_fix as f\n"
        "from accelerate_inorder_fix.config import SETTINGS\n"
        "for bad in [dict(timeout=float('inf')), dict(timeout=0), dict(timeout=-1), dict(timeout='abc'),"
        " dict(mode='gahter'), dict(mode='gather', timeout=float('nan'))]:\n"
        "    try:\n"
        "        f.configure(**bad)\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'accepted {bad}')\n"
        "assert SETTINGS.mode() == 'barrier' and SETTINGS.timeout() == 30.0\n"
        "f.configure(mode=' GATHER ', timeout='2.5')\n"
        "print(SETTINGS.mode(), SETTINGS.timeout())\n"
    )
    proc = run_python(code, env={"ACCELERATE_INORDER_MODE": "", "ACCELERATE_INORDER_TIMEOUT": ""})
    assert proc.returncode == 0 and proc.stdout.split() == ["gather", "2.5"], proc.stderr


def test_timeout_env_inf_is_refused_in_one_line_per_process():
    code = "from accelerate_inorder_fix.config import SETTINGS; print(SETTINGS.timeout(), SETTINGS.timeout())"
    proc = run_python(code, env={"ACCELERATE_INORDER_TIMEOUT": "inf"})
    assert proc.stdout.split() == ["30.0", "30.0"]
    assert proc.stderr.splitlines() == [
        "accelerate-inorder-fix: ACCELERATE_INORDER_TIMEOUT='inf' is not valid (timeout must be a finite number "
        "of seconds greater than 0, not 'inf'); using the default, 30"
    ]
