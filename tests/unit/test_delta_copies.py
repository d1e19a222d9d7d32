"""Promise: with delta copies in play, every record comes out of the main process exactly once, in its
call's block, in rank order, equal attribute for attribute to the record in the rank's own key.

A property test over the rank-side `Copier` (through the real `Outbox`) and the main-side `CopyReader`
(through the real `Inbox` and `Collector`) on an in-memory store. Hypothesis draws what production meets:
calls whose static part changes (another call site, an attribute that changes) or not, refresh boundaries,
disabled records (empty markers), ranks a call ahead, slots lost before the main process reads them,
slots read early (a rank's copy lands after the main process has read the slot), and damaged or foreign
lines in a slot. Delta copies are most of what production decodes, so the test counts the deltas the
main process actually decoded and fails below a floor: a change that stops deltas from being used
(every record then comes from its key, correct but slow) fails here too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import copies, queues, records
from accelerate_inorder_fix.testing import InMemoryStore


LOGGER = "aif.unit.delta"
SITES = (("train.py", "step", 10), ("train.py", "evaluate", 20))
DELTA_FLOOR = 0.3  # share of the ranks' copies decoded as deltas over the whole run (measured: 0.40-0.43)
Identity = tuple[tuple[str, str, int], int]


class SlotHookStore(InMemoryStore):
    """A store that runs the actions in `after_slot_read` once the main process has read a slot.

    Right after the read and the swap that empties it (the copies land in the emptied slot), or between
    the two when `between` is set (the race a real store has: the swap fails, and the slot is read again).
    """

    def __init__(self) -> None:
        super().__init__()
        self.after_slot_read: list[Callable[[], None]] = []
        self.between = False

    def _fire(self) -> None:
        actions, self.after_slot_read = self.after_slot_read, []
        for action in actions:
            action()

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        unread = not self.data.get(key)  # absent or emptied: the read is all, no swap follows
        value: bytes = super().compare_set(key, expected, desired)
        swap = desired in (b"", "")
        if key.startswith("slot/") and (swap or self.between or unread):
            self._fire()
        return value

    def delete_key(self, key: str) -> bool:
        deleted: bool = super().delete_key(key)
        if key.startswith("slot/"):
            self._fire()
        return deleted


class Kept(logging.Handler):
    """The main process's handler: a copy of each record's attributes as it was emitted."""

    def __init__(self) -> None:
        super().__init__()
        self.emitted: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.emitted.append(dict(record.__dict__))


@dataclass
class Plan:
    """One drawn job: what each rank posts for each call, when, and what happens to each slot."""

    world: int
    refresh: int
    sites: list[int]  # per call: which call site
    enabled: dict[tuple[int, int], bool]  # (call, rank) -> the record is enabled (else an empty marker)
    epoch: dict[tuple[int, int], int]  # (call, rank) -> an attribute; a change is a change of the static part
    post_at: dict[tuple[int, int], int]  # (call, rank) -> 2c: before the main process's call c; 2c+1: during its read
    slot_fate: list[str]  # per call: "kept", "lost", "truncated", "foreign"
    between: list[bool]  # per call: copies posted during the read land between its read and its delete
    cut: list[float]  # per call: which line of the slot is damaged, and where it is cut (fractions)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    world = draw(st.integers(2, 5), label="world")
    calls = draw(st.integers(1, 22), label="calls")  # past a refresh of SLOTS (16) too
    refresh = draw(st.sampled_from([2, 3, 5] + [queues.SLOTS] * 3), label="refresh")
    site_changes = draw(
        st.lists(st.booleans(), min_size=calls, max_size=calls).map(
            lambda bs: [b and i % 5 == 4 for i, b in enumerate(bs)]
        )
    )
    sites, site = [], 0
    for change in site_changes:
        site ^= int(change)
        sites.append(site)
    cells = [(c, r) for c in range(calls) for r in range(1, world)]
    mostly = st.sampled_from([True] * 11 + [False])
    enabled = {cell: draw(mostly, label=f"enabled {cell}") for cell in cells}
    epoch: dict[tuple[int, int], int] = {}
    post_at: dict[tuple[int, int], int] = {}
    for c, r in cells:
        changed = not draw(mostly, label=f"same static {c, r}")
        epoch[c, r] = epoch.get((c - 1, r), 0) + int(changed)
        offset = draw(st.sampled_from([0] * 8 + [-2, 1]), label=f"arrival {c, r}")  # ahead, on time, during the read
        post_at[c, r] = max(post_at.get((c - 1, r), 0), 2 * c + offset)
    fates = st.sampled_from(["kept"] * 15 + ["lost", "truncated", "foreign"])
    slot_fate = [draw(fates, label=f"slot {c}") for c in range(calls)]
    cut = [draw(st.floats(0, 1), label=f"cut {c}") for c in range(calls)]
    between = [draw(st.booleans(), label=f"between {c}") for c in range(calls)]
    return Plan(world, refresh, sites, enabled, epoch, post_at, slot_fate, cut, between)


def _identities(plan: Plan) -> list[Identity]:
    counts = [0, 0]
    identities = []
    for site in plan.sites:
        counts[site] += 1
        identities.append((SITES[site], counts[site]))
    return identities


def _record(call: int, rank: int, epoch: int) -> logging.LogRecord:
    record = logging.LogRecord(LOGGER, logging.INFO, "/job/train.py", 10, f"call {call} rank {rank}", None, None)
    record.created += call  # the dynamic part changes at every call
    record.epoch, record.rank, record.hostname = epoch, rank, "node-a"
    return record


@dataclass
class Run:
    """The job of one plan: the ranks' outboxes, the main process's collector, and what they did."""

    plan: Plan
    store: SlotHookStore = field(default_factory=SlotHookStore)
    in_keys: dict[tuple[int, int], Optional[dict[str, Any]]] = field(default_factory=dict)  # what each key holds
    warnings: list[str] = field(default_factory=list)
    deltas_decoded: int = 0
    full_decoded: int = 0

    def __post_init__(self) -> None:
        self.identities = _identities(self.plan)
        self.outboxes = {r: queues.Outbox(self.store, r, background=False) for r in range(1, self.plan.world)}
        for rank, outbox in self.outboxes.items():
            outbox.copier = copies.Copier(rank, refresh=self.plan.refresh)
        inbox = queues.StoreInbox(self.store, self.plan.world)
        self.collector = _collector.Collector(inbox, self.plan.world, 5.0, self.warnings.append)
        reader, decode = inbox.reader, inbox.reader.decode

        def counting(rank: int, line: list[Any], current: Optional[Identity] = None) -> Any:
            item = decode(rank, line, current)
            self.deltas_decoded += int(item is not None and len(line) == copies.DeltaCopy.LENGTH)
            self.full_decoded += int(item is not None and len(line) == copies.FullCopy.LENGTH)
            return item

        reader.decode = counting  # type: ignore[method-assign]

    def post(self, call: int, rank: int) -> None:
        plan = self.plan
        record = _record(call, rank, plan.epoch[call, rank]) if plan.enabled[call, rank] else None
        payload, document = records.encode(self.identities[call], record)
        assert self.outboxes[rank].post(payload, document)
        self.in_keys[call, rank] = None if record is None else records.from_bytes(payload)[1].__dict__

    def damage(self, call: int) -> None:
        """What happens to the slot of `call` before the main process reads it."""
        name, fate = queues.slot_key(call), self.plan.slot_fate[call]
        blob = self.store.data.get(name)
        if blob is None or fate == "kept":
            return
        if fate == "lost":
            del self.store.data[name]
            return
        lines = blob.split(b"\n")[:-1]
        at = min(int(self.plan.cut[call] * len(lines)), len(lines) - 1)
        if fate == "truncated":  # a strict prefix of the line: never valid JSON
            lines[at] = lines[at][: int(self.plan.cut[call] * (len(lines[at]) - 1))]
        else:
            lines[at:at] = [b"garbage \xff", b'{"v": 1}', b"[0,0,[2]]", b"[1,0]"]
        self.store.data[name] = b"".join(line + b"\n" for line in lines)

    def run(self) -> None:
        plan, cells = self.plan, sorted(self.plan.post_at, key=lambda cell: (self.plan.post_at[cell], cell[0]))
        for call, identity in enumerate(self.identities):
            for cell in [cell for cell in cells if plan.post_at[cell] == 2 * call]:
                self.post(*cell)
            during = [cell for cell in cells if plan.post_at[cell] == 2 * call + 1]
            self.store.after_slot_read = [lambda cell=cell: self.post(*cell) for cell in during]
            self.store.between = plan.between[call]
            self.damage(call)
            self.collector.emit_call(identity, _record(call, 0, 0))
        self.collector.flush()


def _expected(run: Run) -> list[tuple[int, int, Optional[dict[str, Any]]]]:
    """Each call's block in rank order: the main process's own record, then each rank's key, if enabled."""
    expected = []
    for call in range(len(run.identities)):
        expected.append((call, 0, None))
        for rank in range(1, run.plan.world):
            if run.plan.enabled[call, rank]:
                expected.append((call, rank, run.in_keys[call, rank]))
    return expected


def test_with_delta_copies_every_record_comes_out_once_equal_to_its_key() -> None:
    totals = {"copies": 0, "deltas": 0, "full": 0, "from keys": 0}
    kept = Kept()
    logger = logging.getLogger(LOGGER)
    logger.handlers[:], logger.propagate = [kept], False

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plan=plans())
    def one_job(plan: Plan) -> None:
        kept.emitted.clear()
        run = Run(plan)
        run.run()
        assert run.warnings == []  # every record was posted in time: no rank named missing, no foreign key
        expected = _expected(run)
        assert len(kept.emitted) == len(expected), (len(kept.emitted), len(expected))
        for emitted, (call, rank, in_key) in zip(kept.emitted, expected):
            assert emitted["msg"] == f"call {call} rank {rank}", (emitted["msg"], call, rank)
            if in_key is not None:
                assert emitted == in_key
        totals["copies"] += len(run.in_keys)
        totals["deltas"] += run.deltas_decoded
        totals["full"] += run.full_decoded
        totals["from keys"] += len(run.in_keys) - run.deltas_decoded - run.full_decoded

    try:
        one_job()
    finally:
        logger.handlers[:] = []
    assert totals["full"] > 0 and totals["from keys"] > 0, totals  # each path ran: full copies, keys
    assert totals["deltas"] / totals["copies"] >= DELTA_FLOOR, totals
