"""Promise: the gather collector emits every delivered record exactly once, blocks in rank order, and
never waits past its bound, whatever the arrival order; a record posted after the main process's exit
flush is refused to its rank (which prints it), never lost and never doubled.

In-process, with torch's in-memory `HashStore` standing in for the job's store, the package's real
`Outbox` / `Inbox` / `Collector`, and a handler that keeps what the main process emits.
"""

import logging
import time

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerate_inorder_fix import _diagnostics
from accelerate_inorder_fix._diagnostics import DIAGNOSTICS
from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import queues, records


LOGGER = "aif.unit.collector"
TIMEOUT = 0.05


class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def kept():
    handler = Keep()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    logger.propagate = False
    yield handler
    logger.removeHandler(handler)


def record(call, rank):
    return logging.makeLogRecord(
        {"name": LOGGER, "msg": f"c{call} r{rank}", "levelno": logging.INFO, "rank": rank, "hostname": "node-a"}
    )


def site(call):
    # One call site per call, so a rank that never makes one call shifts nothing else.
    return (("job.py", "train", call), 1)


class Job:
    def __init__(self, world):
        store = dist.HashStore()
        self.outboxes = [queues.Outbox(store, r) for r in range(world)]
        self.warnings = []
        self.collector = _collector.Collector(queues.StoreInbox(store, world), world, TIMEOUT, self.warnings.append)
        self.printed_by_rank = []

    def post(self, call, rank, enabled=True):
        payload = records.to_bytes(site(call), record(call, rank) if enabled else None)
        if not self.outboxes[rank].post(payload) and enabled:
            self.printed_by_rank.append(f"c{call} r{rank}")


# Per (call, rank > 0): "on_time", "late" (after the main process's call, before the next one),
# "exit" (only before the exit flush), "after" (after the exit flush), "absent" (never), "off" (a marker).
WHEN = st.sampled_from(["on_time", "late", "exit", "after", "absent", "off"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(2, 4), calls=st.integers(1, 4), data=st.data())
def test_every_record_exactly_once_in_rank_order_within_the_bound(kept, world, calls, data):
    kept.messages.clear()
    plan = {(c, r): data.draw(WHEN, label=f"c{c} r{r}") for c in range(1, calls + 1) for r in range(1, world)}
    main_skips = data.draw(st.sets(st.integers(1, calls)), label="calls the main process never makes")
    job = Job(world)
    for call in range(1, calls + 1):
        for rank in range(1, world):
            if plan[call, rank] in ("on_time", "off"):
                job.post(call, rank, enabled=plan[call, rank] == "on_time")
        if call not in main_skips:
            start = time.monotonic()
            job.collector.emit_call(site(call), record(call, 0))
            assert time.monotonic() - start < TIMEOUT + 0.5
        for rank in range(1, world):
            if plan[call, rank] == "late":
                job.post(call, rank)
    for (call, rank), when in plan.items():
        if when == "exit":
            job.post(call, rank)
    job.collector.flush()
    for (call, rank), when in plan.items():
        if when == "after":
            job.post(call, rank)

    emitted = [m for m in kept.messages if not m.startswith("accelerate-inorder-fix")]
    expected = {f"c{c} r0" for c in range(1, calls + 1) if c not in main_skips}
    expected |= {f"c{c} r{r}" for (c, r), when in plan.items() if when in ("on_time", "late", "exit")}
    assert sorted(emitted) == sorted(expected), plan
    assert sorted(job.printed_by_rank) == sorted(f"c{c} r{r}" for (c, r), w in plan.items() if w == "after")
    # Each call the main process made: its on-time records are one block, in rank order.
    for call in set(range(1, calls + 1)) - main_skips:
        block = [f"c{call} r0"] + [f"c{call} r{r}" for r in range(1, world) if plan[call, r] == "on_time"]
        at = emitted.index(block[0])
        assert emitted[at : at + len(block)] == block, (plan, emitted)


@pytest.fixture(autouse=True)
def fresh_diagnostics():
    """Each test a process that has said nothing (losses are rate-limited per process)."""
    DIAGNOSTICS.reset()
    yield
    DIAGNOSTICS.reset()


def test_a_raising_handler_loses_only_its_record(kept, capsys):
    class Refuse(logging.Filter):
        def filter(self, rec):
            if rec.getMessage() == "c1 r1":
                raise RuntimeError("a user's filter raised")
            return True

    refuse = Refuse()
    kept.addFilter(refuse)
    try:
        job = Job(3)
        for rank in (1, 2):
            job.post(1, rank)
        job.collector.emit_call(site(1), record(1, 0))
        job.post(2, 1)
        job.post(2, 2)
        job.collector.emit_call(site(2), record(2, 0))
    finally:
        kept.removeFilter(refuse)
    assert kept.messages == ["c1 r0", "c1 r2", "c2 r0", "c2 r1", "c2 r2"]
    said = [line for line in capsys.readouterr().err.splitlines() if "before the one that raised" in line]
    assert len(said) == 1 and "rank 1's record reached only the main process's handlers" in said[0], said
    assert f"in_order call at {_collector.describe(site(1))}" in said[0] and "a user's filter raised" in said[0]


def test_a_filter_raising_on_every_record_is_said_for_every_record_naming_its_call_and_rank(kept, capsys):
    """Before, one line per exception type: the 15 other losses of the same kind were silent."""

    class RefuseAll(logging.Filter):
        def filter(self, rec):
            raise RuntimeError("a user's filter raised")

    refuse = RefuseAll()
    kept.addFilter(refuse)
    try:
        job = Job(4)
        for call in range(1, 5):
            for rank in (1, 2, 3):
                job.post(call, rank)
            job.collector.emit_call(site(call), record(call, 0))
    finally:
        kept.removeFilter(refuse)
    said = [line for line in capsys.readouterr().err.splitlines() if "before the one that raised" in line]
    assert kept.messages == []
    expected = [
        f"in_order call at {_collector.describe(site(call))}: rank {rank}'s record"
        for call in range(1, 5)
        for rank in range(4)
    ]
    assert [line.split(" reached only")[0].split(": ", 1)[1] for line in said] == expected, said


def test_loss_lines_are_rate_limited_and_the_next_one_written_says_how_many_were_not(capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(_diagnostics.time, "monotonic", lambda: now[0])
    written = [_diagnostics.warn_every(f"loss {n}") for n in range(_diagnostics.BURST + 5)]
    assert written == [True] * _diagnostics.BURST + [False] * 5
    now[0] += _diagnostics.WINDOW
    assert _diagnostics.warn_every("loss after")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == _diagnostics.BURST + 1
    assert lines[_diagnostics.BURST - 1].endswith("are counted, not written)")
    assert lines[-1].startswith("accelerate-inorder-fix: loss after (and 5 earlier warning(s) not written")
