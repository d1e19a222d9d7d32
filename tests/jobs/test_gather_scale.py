"""16 real ranks: gather mode complete, ordered, each record exactly once; the store bounded in both modes.

The gather job also runs collapse off then on over calls whose messages mix identical and
different ones: a collapsed line counts once for each rank it names.

One torchrun job, CPU gloo, under a hard timeout. Lean on purpose (2 CI cores): one job, no stagger.
"""

import re

from conftest import LATEST, REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.gather import queues


NPROC, CALLS = 16, 64
TIME_BOUND = 180.0  # seconds for the whole job, start-up of 16 ranks on 2 cores included
_RECORD = re.compile(r"^h(?P<printer>\d+) (?:\[RANK \d+\] )?call (?P<call>\d+) from r(?P<rank>\d+)$")
_MIXED = re.compile(r"^h(?P<printer>\d+) \[RANK (?P<ranks>[\d,-]+)\] mixed (?P<phase>on|off) (?P<k>\d+) (?P<text>.+)$")
MIXED = 6  # the script's mixed calls per phase


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
    _assert_mixed_calls(job.lines)
    keys = dict(re.findall(r"^@@KEYS after=(\d+) keys=(\d+)$", "\n".join(job.lines), re.M))
    # Without clean-up the store would gain a key per rank per call between the two counts.
    growth = int(keys[str(CALLS)]) - int(keys["16"])
    # Ranks in step with the main process (a barrier a call): a rank's records (one key each here) wait up to
    # an ack's interval to be acked (the main process acks every `queues.ACK_EVERY` records read) and up to
    # one more for the rank to delete them (it reads its acks every ACK_EVERY posts), and at most 2 acks are
    # unread; far under GATHER_QUEUE + ACK_KEYS, a rank's bound when it runs ahead.
    per_rank = 2 * queues.ACK_EVERY + 2
    assert per_rank <= queues.QUEUE + queues.ACK_KEYS
    assert growth <= (NPROC - 1) * per_rank < (NPROC - 1) * (CALLS - 16), keys


def _ranks(spans):
    """`0-3,6` -> [0, 1, 2, 3, 6]."""
    ranks = []
    for run in spans.split(","):
        first, _, last = run.partition("-")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


def _expected_mixed(phase, k):
    """The lines of mixed call `k`, as `(tag, text)`: collapse on gives a shared message one line, at its first rank."""
    shared = {1: ("same", list(range(NPROC))), 2: ("odd", list(range(1, NPROC, 2))), 0: ("group", [0, 1, 2, 3, 6])}
    word, sharers = shared[k % 3]
    tags = {1: "0-15", 2: "1,3,5,7,9,11,13,15", 0: "0-3,6"}
    lines = []
    for rank in range(NPROC):
        if rank not in sharers:
            lines.append((str(rank), f"from r{rank}"))
        elif phase == "off":
            lines.append((str(rank), word))
        elif rank == sharers[0]:
            lines.append((tags[k % 3], word))
    return lines


def _assert_mixed_calls(lines):
    """Collapse off then on: every rank's record of each mixed call exactly once, in call and rank order."""
    mixed = [m.groupdict() for m in map(_MIXED.match, lines) if m]
    assert {m["printer"] for m in mixed} == {"0"}, "mixed records printed by ranks other than the main process"
    got = [(m["phase"], int(m["k"]), m["ranks"], m["text"]) for m in mixed]
    assert got == [
        (phase, k, tag, text)
        for phase in ("off", "on")
        for k in range(1, MIXED + 1)
        for tag, text in _expected_mixed(phase, k)
    ]
    for phase in ("off", "on"):
        for k in range(1, MIXED + 1):
            named = [rank for m in mixed if (m["phase"], int(m["k"])) == (phase, k) for rank in _ranks(m["ranks"])]
            assert sorted(named) == list(range(NPROC)), (phase, k, named)  # each rank's record exactly once
    assert len([m for m in mixed if m["phase"] == "on"]) < len([m for m in mixed if m["phase"] == "off"])


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
