"""The main process's side of gather mode: assemble each in_order call's block and emit it.

A call is named by its *identity*: the call site plus how many times this rank has called from that
site. Every rank computes it alone, so records pair up by what the user wrote, not by arrival order:
a rank that skips a call at one site (a user error) shifts nothing at other sites, but at that site its
later calls are counted one lower: each of its later records goes out in the block of the call before
(its 3rd call in the block of call 2, ...), and only the main process's last call there names it missing
(as measured on a real job: tests/jobs/test_faults.py).

For its own call `identity`, the main process takes each other rank's queue in order until it finds
that rank's record of `identity`, or the deadline passes. Records met on the way belong elsewhere:
- to a call already closed (they came late): emitted at once, as a block of their own;
- to a call the main process has not made (yet): kept, used when it makes it, flushed at exit.
Then the block goes out in rank order, followed, if ranks are missing, by one warning naming them.

Reading is batched (`transport`): first whatever is in the shared slot already, without waiting;
then, for ranks still missing, one wait on all of them and one read, so a block of 1,024 ranks costs
a few store round trips, not a few per rank.

Emitting never raises and never stops a block: a handler or filter of the main process that raises
loses that one record (one warning on stderr), as it would on the barrier path.

Only the main process waits, and only for a bounded time. A rank that missed a deadline is "absent":
the next calls do not wait for it (a crashed rank costs one timeout, not one per call) but still take
whatever it sent; it is waited for again as soon as one of its records arrives in time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Callable, Optional, Protocol, runtime_checkable

from .._diagnostics import warn_once
from . import copies as _copies
from . import records as _records
from .copies import BlockEntry
from .records import Identity
from .transport import Taken


Block = dict[int, BlockEntry]  # one call's entries, by rank


@runtime_checkable
class Inbox(Protocol):
    """What the collector reads the ranks' queues through: `transport.Inbox`, a test double, a benchmark's.

    Each rank's queue is read in order; whatever is taken moves that rank's place on by one.
    """

    def wait(self, ranks: list[int], seconds: float) -> bool:
        """Wait up to `seconds` until every rank in `ranks` has a next record; False on timeout."""

    def ready(self, rank: int) -> bool:
        """Non-blocking: has `rank` a next record?"""

    def take(self, rank: int) -> Taken:
        """The next record of `rank` (known to be there)."""

    def take_many(self, ranks: list[int]) -> list[Taken]:
        """The next record of each rank in `ranks` (each known to be there), in order."""

    def take_copied(self, ranks: list[int], current: Identity, into: Block) -> list[tuple[int, Taken]]:
        """Without waiting, the next record of each rank in `ranks` already copied to a shared slot.

        Those of the call `current` go into `into`; the others are returned with their rank.
        """

    def settle(self) -> None:
        """After each call's block (publish read marks, if the inbox has any)."""

    def seal(self, rank: int) -> list[Taken]:
        """At exit: close `rank`'s queue; what it posted meanwhile, in order."""


def describe(identity: Identity) -> str:
    (filename, function, line), count = identity
    return f"{filename}:{line} in {function} (call {count} from there)"


class Collector:
    """The main process's side of gather mode: one block per in_order call, in rank order.

    State:
    - `pending`: identity -> `Block`, records of calls the main process has not made yet (first seen first);
    - `closed`: identities whose block went out incomplete (a record of one that comes later goes alone);
    - `absent`: ranks that missed a deadline, not waited for until one of their records arrives in time.

    A block entry (`copies.BlockEntry`) is a `LogRecord`, a `DeferredRecord` (a delta copy of the call,
    made into a record when the block goes out), or None (the rank's empty marker: nothing to print).
    """

    def __init__(self, inbox: Inbox, world_size: int, timeout: float, warn: Callable[[str], None]) -> None:
        self.inbox = inbox
        self.world_size = world_size
        self.timeout = timeout
        self.warn = warn
        self.pending: dict[Identity, Block] = {}
        self.closed: set[Identity] = set()
        self.absent: set[int] = set()

    # -- reading the queues -----------------------------------------------------------------

    def _route(self, rank: int, item: Taken, current: Optional[Identity], block: Block) -> None:
        """File one decoded record of `rank`: into `block` if it is for `current`, else where it belongs."""
        if isinstance(item, _records.MalformedRecord):  # foreign bytes where this rank's next record should be
            text = f"rank {rank} sent something that is not an in_order record ({item}); it was ignored"
            if current is None:
                self.warn(text)
                return
            self.warn(f"{text} and counted as rank {rank}'s empty record of the call at {describe(current)}")
            item = current, None
        identity, record = item
        if identity == current:
            block[rank] = record
        elif identity in self.closed:
            if record is not None:
                self._emit(rank, _copies.build(record))  # late: its block is out, so it goes alone, not into another
        else:
            self.pending.setdefault(identity, {})[rank] = record

    def _take_what_arrived(self, rank: int, current: Optional[Identity], block: Block) -> None:
        """Take what `rank` has sent, without waiting, until its record of `current` is found."""
        while rank not in block and self.inbox.ready(rank):
            self._route(rank, self.inbox.take(rank), current, block)

    def _take_after_wait(self, ranks: list[int], current: Identity, block: Block) -> None:
        """Take one record of each rank in `ranks` (all there), in one batch; it may be for another call."""
        self._route_all(zip(ranks, self.inbox.take_many(ranks)), current, block)

    def _take_from_slots(self, ranks: list[int], current: Identity, block: Block) -> None:
        """Take, without waiting, the next record of each rank in `ranks` already copied to its slot."""
        self._route_all(self.inbox.take_copied(ranks, current, block), current, block)

    def _route_all(self, taken: Iterable[tuple[int, Taken]], current: Identity, block: Block) -> None:
        failure = None
        for rank, item in taken:
            try:
                self._route(rank, item, current, block)
            except Exception as exc:  # the batch has left the store: one bad record must not lose the others
                failure = failure or exc
        if failure is not None:
            raise failure

    def _waitable(self, block: Block) -> list[int]:
        """The ranks whose record for this block is still to come (those known absent are not waited for)."""
        return [r for r in range(self.world_size) if r not in block and r not in self.absent]

    def _collect(self, identity: Identity, block: Block) -> None:
        deadline = time.monotonic() + self.timeout
        self._take_from_slots(self._waitable(block), identity, block)  # what is in the slot already: no wait
        while True:
            waitable = self._waitable(block)
            if not waitable:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.inbox.wait(waitable, remaining):
                break
            self._take_after_wait(waitable, identity, block)
        # Deadline passed (or only absent ranks are left): whatever has arrived, without waiting.
        for rank in [r for r in range(self.world_size) if r not in block]:
            self._take_what_arrived(rank, identity, block)
        self.inbox.settle()

    # -- one call ---------------------------------------------------------------------------

    def emit_call(self, identity: Identity, own: Optional[logging.LogRecord]) -> None:
        """The main process's own call `identity` (`own`: its record, or None): collect its block, emit it."""
        block: Block = {0: own}
        block.update(self.pending.pop(identity, {}))
        try:
            self._collect(identity, block)
        except Exception as exc:  # the store went away: what was collected still goes out
            self.warn(f"in_order call at {describe(identity)}: could not read the other ranks' records ({exc!r})")
        self.pending.pop(identity, None)
        self._emit_block(block)
        missing = [r for r in range(self.world_size) if r not in block]
        self.absent.difference_update(block)
        if missing:
            self.closed.add(identity)
            if not self.absent.issuperset(missing):
                self.warn(
                    f"in_order call at {describe(identity)}: no record from rank(s) "
                    f"{', '.join(map(str, missing))} within {self.timeout:g} s (ACCELERATE_INORDER_TIMEOUT); "
                    "the other ranks' records are above, in rank order. A record that arrives later is "
                    "emitted on its own."
                )
            self.absent.update(missing)

    def _emit(self, rank: int, record: logging.LogRecord) -> None:
        """Hand one record to the main process's handlers; a handler that raises loses only this one."""
        try:
            _records.emit(record)
        except Exception as exc:
            self._dropped(rank, exc)

    def _dropped(self, rank: int, exc: Exception) -> None:
        warn_once(
            ("gather-emit", type(exc)),
            f"the main process's handlers raised on rank {rank}'s in_order record, which is dropped "
            f"(the others are not): {exc!r}",
        )

    def _emit_block(self, block: Block) -> None:
        loggers: dict[str, logging.Logger] = {}  # one lookup per logger name, not per record: a block may hold 1,024
        for rank in sorted(block):
            entry = block[rank]
            if entry is None:
                continue
            try:
                record = _copies.build(entry)
                logger = loggers.get(record.name) or loggers.setdefault(record.name, _records.logger_for(record))
                logger.callHandlers(record)
            except Exception as exc:
                self._dropped(rank, exc)

    # -- exit -------------------------------------------------------------------------------

    def flush(self) -> None:
        """At exit: emit every record delivered but not yet emitted (calls this process never made).

        Each queue is sealed on the way: what a rank posts from now on, it prints itself.
        """
        for rank in range(1, self.world_size):
            self._take_what_arrived(rank, None, {})
            for item in self.inbox.seal(rank):
                self._route(rank, item, None, {})
        leftovers = [(identity, block) for identity, block in self.pending.items() if block]
        self.pending.clear()
        if not leftovers:
            return
        for _, block in leftovers:
            self._emit_block(block)
        self.warn(
            "records of in_order calls the main process never made were emitted at exit: "
            + "; ".join(
                f"{describe(identity)} from rank(s) {', '.join(map(str, sorted(block)))}"
                for identity, block in leftovers
            )
        )


def warning_record(name: str, text: str) -> logging.LogRecord:
    """A WARNING record for the main process's handlers, from this package."""
    return logging.makeLogRecord(
        {
            "name": name,
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": f"accelerate-inorder-fix: {text}",
            "args": None,
            "funcName": "accelerate_inorder_fix",
        }
    )
