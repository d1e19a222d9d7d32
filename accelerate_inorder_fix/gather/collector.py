"""The main process's side of gather mode: assemble each in_order call's block and emit it.

A call is named by its *identity*: the call site plus how many times this rank has called from that
site. Every rank computes it alone, so records pair up by what the user wrote, not by arrival order:
a rank that skips a call at one site (a user error) shifts nothing at other sites, but at that site its
later calls are counted one lower: each of its later records goes out in the block of the call before
(its 3rd call in the block of call 2, ...), and only the main process's last call there names it missing
(as measured on a real job: tests/jobs/test_faults.py).

For its own call `identity`, the main process takes each other rank's queue in order until it finds
that rank's record of `identity`, or the deadline passes. Records met on the way belong elsewhere:
- to a call the main process has made already (they came late): emitted at once, as a block of their own;
- to a call the main process has not made (yet): kept, used when it makes it, flushed at exit.
Then the block goes out in rank order, followed, if ranks are missing, by one warning naming them.

A call site the main process has never called from, whose records have been kept a whole timeout
(`if not accelerator.is_main_process: logger.info(..., in_order=True)`), is *others-only*: what was
kept for it goes out at once, block by block, with one warning naming the site and the ranks, and its
later records are emitted as they are found, on their own, never kept. The timeout counts from the end
of the main process's call that found the first of them: a main-only call that waits a timeout for the
others must not age the records of their next site, which the main process is about to call from. So
the kept records stay bounded by what arrives within a call and a timeout, not by the number of calls.

Reading is batched (`queues`): first whatever is in the shared slot already, without waiting;
then, for ranks still missing, one wait on all of them and one read, so a block of 1,024 ranks costs
a few store round trips, not a few per rank.

Emitting never raises and never stops a block: a handler or filter of the main process that raises
loses that one record (one warning on stderr), as it would on the barrier path. With collapse on
(`config.SETTINGS.collapse()`, read at each block), a block's identical records go out once, tagged
with every rank that sent them (`collapse`).

Only the main process waits, and only for a bounded time: past a call's deadline it takes what has
arrived without waiting, at most `LATE_READS` records a rank and for at most `GRACE` x the timeout, so a
rank's backlog is read a little at each call and no call takes more than 1.25 timeouts. Absence is kept per call site. A rank
that missed a deadline at site S is "absent" there: later calls at S do not wait for it (a call only the
main process makes costs one timeout for its site in all, not one per call), but still take whatever
it sent; it is waited for at S again as soon as a record of it for S arrives, in time or late. At
every other site it is waited for as before, so the blocks of the calls it does make go out whole, in
rank order. A rank of which nothing at all has arrived since it missed a deadline is also "quiet"
(it may have died): other sites wait for it only `GRACE` x the timeout in all, then not at all until
a record of it arrives, so a dead rank costs at most 1.25 timeouts in all, not one per site.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Callable, Optional, Protocol, runtime_checkable

from .._callsite import Identity, Site
from .._diagnostics import COLLECTIVE, CallWarning, ranks_text, warn_every
from ..config import SETTINGS, TIMEOUT_ENV
from ..store.connection import SHORTEST_WAIT
from . import collapse as _collapse
from . import copies as _copies
from . import records as _records
from .copies import BlockEntry
from .queues import Taken


Block = dict[int, BlockEntry]  # one call's entries, by rank
GRACE = 0.25  # x the timeout: how long in all a rank that went quiet is waited for at other call sites,
# and how long past its deadline a call goes on taking what has arrived (at most LATE_READS records a rank)
LATE_READS = 16
INF = float("inf")


@runtime_checkable
class RecordSource(Protocol):
    """What the collector reads the ranks' queues through: `queues.StoreInbox`, a test double, a benchmark's.

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

    def end_call(self) -> None:
        """After each call's block (publish read marks, if the source has any)."""

    def seal(self, rank: int) -> list[Taken]:
        """At exit: close `rank`'s queue; what it posted meanwhile, in order."""


def where(site: Site) -> str:
    filename, function, line = site
    return f"{filename}:{line} in {function}"


def describe(identity: Identity) -> str:
    return f"{where(identity[0])} (call {identity[1]} from there)"


class Collector:
    """The main process's side of gather mode: one block per in_order call, in rank order.

    State (each bounded by the number of call sites and ranks, whatever the number of calls):
    - `pending`: identity -> `Block`, records of calls the main process has not made yet (first seen first);
    - `made`: site -> the main process's last call there (a record of a call it made already came late);
    - `kept_since`: site the main process never called from -> when the call that first kept a record for it ended;
    - `others_only`: sites kept from a whole timeout without the main process calling there: emitted as found;
    - `absent`: site -> ranks that missed a call there, not waited for there until a record of theirs
      for that site arrives;
    - `quiet`: rank -> seconds of grace left, for a rank that missed a deadline and of which nothing has
      arrived since: waited for elsewhere only that long in all, then not at all until a record comes.

    A block entry (`copies.BlockEntry`) is a `LogRecord`, a `DeferredRecord` (a delta copy of the call,
    made into a record when the block goes out), or None (the rank's empty marker: nothing to print).
    """

    def __init__(self, source: RecordSource, world_size: int, timeout: float, warn: Callable[[str], object]) -> None:
        self.source = source
        self.world_size = world_size
        self.timeout = timeout
        self.warn = warn
        self.pending: dict[Identity, Block] = {}
        self.made: dict[Site, int] = {}
        self.absent: dict[Site, set[int]] = {}
        self.quiet: dict[int, float] = {}
        self.kept_since: dict[Site, float] = {}
        self._first_kept: set[Site] = set()  # sites of `kept_since` to come: first kept during the current call
        self.others_only: set[Site] = set()
        self._heard: set[int] = set()  # ranks with a record taken during the current call

    # -- reading the queues -----------------------------------------------------------------

    def _route(self, rank: int, item: Taken, current: Optional[Identity], block: Block) -> None:
        """File one decoded record of `rank`: into `block` if it is for `current`, else where it belongs."""
        if isinstance(item, _records.MalformedRecord):  # foreign bytes where this rank's next record should be
            text = f"rank {rank} sent something that is not an in_order record ({item}); it was ignored"
            if current is None:
                self.warn(text)
                return
            self.warn(
                CallWarning(
                    describe(current),
                    (rank,),
                    f"sent something that is not an in_order record ({item})",
                    0,
                    f"it was ignored and counted as rank {rank}'s empty record of this call",
                ).render()
            )
            item = current, None
        identity, record = item
        if self.quiet or self.absent:
            self._hear(rank, identity[0])
        else:  # nothing to forget: no rank is quiet or absent anywhere
            self._heard.add(rank)
        if identity == current:
            block[rank] = record
        elif identity[1] <= self.made.get(identity[0], 0) or (
            identity[0] in self.others_only and identity[0] not in self.made
        ):
            if record is not None:
                self._emit(
                    rank, identity, _copies.build(record)
                )  # late: its block is out, so it goes alone, not into another
        else:
            self.pending.setdefault(identity, {})[rank] = record
            if identity[0] not in self.made and identity[0] not in self.kept_since:
                self._first_kept.add(identity[0])

    def _hear(self, rank: int, site: Site) -> None:
        """A record of `rank` for `site` arrived: it is not quiet, nor absent there, any more."""
        self._heard.add(rank)
        if self.quiet:
            self.quiet.pop(rank, None)
        absent = self.absent.get(site)
        if absent:
            absent.discard(rank)

    def _take_what_arrived(
        self, rank: int, current: Optional[Identity], block: Block, most: Optional[int] = None, until: float = INF
    ) -> None:
        """Take what `rank` has sent, without waiting, until its record of `current` is found.

        Args:
            most: take at most this many records (None: all there are, as at exit).
            until: take none after this `time.monotonic()`: a rank's backlog is left for later calls.
        """
        taken = 0
        while rank not in block and (most is None or taken < most) and time.monotonic() < until:
            if not self.source.ready(rank):
                return
            self._route(rank, self.source.take(rank), current, block)
            taken += 1

    def _take_after_wait(self, ranks: list[int], current: Identity, block: Block) -> None:
        """Take one record of each rank in `ranks` (all there), in one batch; it may be for another call."""
        self._route_all(zip(ranks, self.source.take_many(ranks)), current, block)

    def _take_from_slots(self, ranks: list[int], current: Identity, block: Block) -> None:
        """Take, without waiting, the next record of each rank in `ranks` already copied to its slot."""
        self._route_all(self.source.take_copied(ranks, current, block), current, block)

    def _route_all(self, taken: Iterable[tuple[int, Taken]], current: Identity, block: Block) -> None:
        failure = None
        for rank, item in taken:
            try:
                self._route(rank, item, current, block)
            except Exception as exc:  # the batch has left the store: one bad record must not lose the others
                failure = failure or exc
        if failure is not None:
            raise failure

    def _until(self, rank: int, start: float) -> float:
        """Until when `rank` is waited for in a call that started at `start` (a quiet rank: its grace left)."""
        return start + min(self.timeout, self.quiet.get(rank, self.timeout))

    def _waitable(self, block: Block, site: Site, start: float, now: float) -> list[int]:
        """The ranks whose record for this block is still to come and still waited for at `now`."""
        absent = self.absent.get(site, ())
        quiet = self.quiet
        in_time = start + self.timeout - now >= SHORTEST_WAIT  # a rank that is not quiet (`_until`)
        return [
            r
            for r in range(self.world_size)
            if r not in block
            and r not in absent
            and (self._until(r, start) - now >= SHORTEST_WAIT if r in quiet else in_time)
        ]

    def _collect(self, identity: Identity, block: Block) -> None:
        start = time.monotonic()
        site = identity[0]
        self._take_from_slots(self._waitable(block, site, start, start), identity, block)  # no wait
        given_up: set[int] = set()  # a failed wait gives up the ranks whose time ran out, so no loop spins
        while True:
            now = time.monotonic()
            waitable = [r for r in self._waitable(block, site, start, now) if r not in given_up]
            if not waitable:
                break
            until = min(self._until(r, start) for r in waitable) if self.quiet else start + self.timeout
            if self.source.wait(waitable, until - now):
                self._take_after_wait(waitable, identity, block)
            else:
                given_up.update(r for r in waitable if self._until(r, start) <= until)
        # Deadline passed (or only ranks not waited for are left): what has arrived, without waiting, and
        # no more than LATE_READS a rank nor for longer than the grace: a rank's backlog waits for later calls.
        until = time.monotonic() + GRACE * self.timeout
        for rank in [r for r in range(self.world_size) if r not in block]:
            self._take_what_arrived(rank, identity, block, LATE_READS, until)
        self._spend_grace(site, time.monotonic() - start)
        self.source.end_call()

    def _spend_grace(self, site: Site, waited: float) -> None:
        """Quiet ranks this call waited for (all but those absent at `site`) have `waited` less grace."""
        absent = self.absent.get(site, set())
        for rank in [r for r in self.quiet if r not in absent]:
            self.quiet[rank] = max(0.0, self.quiet[rank] - waited)

    # -- one call ---------------------------------------------------------------------------

    def emit_call(self, identity: Identity, own: Optional[logging.LogRecord]) -> None:
        """The main process's own call `identity` (`own`: its record, or None): collect its block, emit it."""
        block: Block = {0: own}
        block.update(self.pending.pop(identity, {}))
        self._heard = set()
        try:
            self._collect(identity, block)
        except Exception as exc:  # the store went away: what was collected still goes out
            self.warn(
                CallWarning(
                    describe(identity),
                    (),
                    f"the main process could not read the other ranks' records ({exc!r})",
                    None,
                    "what was collected is printed, in rank order",
                ).render()
            )
        self.pending.pop(identity, None)
        site, count = identity
        self.made[site] = max(count, self.made.get(site, 0))
        self._emit_block(block, identity)
        self._heard.update(block)
        if self.quiet or self.absent.get(site):  # else hearing them changes nothing more
            for rank in block:
                self._hear(rank, site)
        missing = [r for r in range(self.world_size) if r not in block]
        if missing:
            self._missed(identity, missing, block)
        self._release_others_only()

    def _release_others_only(self) -> None:
        """Emit what was kept for sites the main process has not called from in a whole timeout (others-only).

        One warning per such site, naming the ranks; from now on their records there go out as found.
        A site first kept during this call is timed from now.
        """
        now = time.monotonic()
        for site in self._first_kept:
            self.kept_since.setdefault(site, now)
        self._first_kept.clear()
        for site, since in list(self.kept_since.items()):
            if site in self.made:
                del self.kept_since[site]
            elif now - since >= self.timeout:
                del self.kept_since[site]
                self.others_only.add(site)
                kept = sorted(identity for identity in self.pending if identity[0] == site)
                ranks = sorted({rank for identity in kept for rank in self.pending[identity]})
                for identity in kept:
                    self._emit_block(self.pending.pop(identity), identity)
                if not ranks:
                    continue
                self.warn(
                    CallWarning(
                        where(site),
                        tuple(ranks),
                        f"made it and the main process has not within {self.timeout:g} s ({TIMEOUT_ENV})",
                        self.timeout,
                        "their records held for it are printed now, and their later records from there as they "
                        "arrive, each on its own",
                        COLLECTIVE,
                    ).render()
                )

    def _missed(self, identity: Identity, missing: list[int], block: Block) -> None:
        """`missing` missed the call `identity`: absent at its site; quiet if nothing of theirs came meanwhile.

        One warning, when a rank among them was waited for a whole timeout (not absent there, not quiet).
        """
        absent = self.absent.setdefault(identity[0], set())
        if any(r not in absent and r not in self.quiet for r in missing):
            self.warn(absence_warning(identity, missing, block, self.timeout).render())
        absent.update(missing)
        for rank in missing:
            if rank not in self._heard:
                self.quiet.setdefault(rank, GRACE * self.timeout)

    def _emit(self, rank: int, identity: Identity, record: logging.LogRecord) -> None:
        """Hand one record to the main process's handlers; a handler that raises loses only this one."""
        try:
            _records.emit(record)
        except Exception as exc:
            self._dropped(rank, identity, exc)

    @staticmethod
    def _dropped(rank: int, identity: Identity, exc: Exception) -> None:
        """Say, each time (rate-limited), that a handler or filter of the main process raised on a record."""
        warn_every(
            CallWarning(
                describe(identity),
                (rank,),
                f"'s record reached only the main process's handlers before the one that raised ({exc!r})",
                0,
                "the block's other records are not affected",
            )
        )

    def _emit_block(self, block: Block, identity: Identity) -> None:
        """Emit a block in rank order; with collapse on (`SETTINGS.collapse()`), identical records once."""
        if SETTINGS.collapse():
            self._emit_collapsed(block, identity)
            return
        loggers: dict[str, logging.Logger] = {}
        for rank in sorted(block):
            entry = block[rank]
            if entry is not None:
                try:
                    _hand_over(_copies.build(entry), loggers)
                except Exception as exc:
                    self._dropped(rank, identity, exc)

    def _emit_collapsed(self, block: Block, identity: Identity) -> None:
        """`_emit_block` with collapse on: the block's records grouped (`collapse.collapse`), then emitted."""
        built: list[tuple[int, logging.LogRecord]] = []
        for rank in sorted(block):
            entry = block[rank]
            if entry is not None:
                try:
                    built.append((rank, _copies.build(entry)))
                except Exception as exc:
                    self._dropped(rank, identity, exc)
        try:
            lines = _collapse.collapse(built)
        except Exception as exc:  # grouping must not cost the block: it goes out per rank, as collapse off
            warn_every(f"in_order call at {describe(identity)}: its records could not be collapsed: {exc!r}")
            lines = [record for _, record in built]
        loggers: dict[str, logging.Logger] = {}
        for record in lines:
            try:
                _hand_over(record, loggers)
            except Exception as exc:
                self._dropped(getattr(record, "rank", -1), identity, exc)

    # -- exit -------------------------------------------------------------------------------

    def flush(self) -> None:
        """At exit: emit every record delivered but not yet emitted (calls this process never made).

        Each queue is sealed on the way: what a rank posts from now on, it prints itself.
        """
        for rank in range(1, self.world_size):
            self._take_what_arrived(rank, None, {})
            for item in self.source.seal(rank):
                self._route(rank, item, None, {})
        clear = getattr(self.source, "clear", None)  # a source in the store: its shared keys go too
        if clear is not None:
            clear()
        leftovers = [(identity, block) for identity, block in self.pending.items() if block]
        self.pending.clear()
        for identity, block in leftovers:
            self._emit_block(block, identity)
        if leftovers:
            self.warn(exit_summary(leftovers))


def _hand_over(record: logging.LogRecord, loggers: dict[str, logging.Logger]) -> None:
    """Hand `record` to its logger's handlers; `loggers` caches one lookup per name (a block may hold 1,024)."""
    logger = loggers.get(record.name) or loggers.setdefault(record.name, _records.logger_for(record))
    logger.callHandlers(record)


SUMMARY_SITES = 5  # the exit warning names this many call sites, and the first SUMMARY_CALLS calls of each
SUMMARY_CALLS = 3


def exit_summary(leftovers: list[tuple[Identity, Block]]) -> str:
    """The exit warning about calls the main process never made: a few lines, whatever their number.

    One line per call site (the first `SUMMARY_SITES`): how many calls, from which ranks, the first few.

    Args:
        leftovers: `(identity, block)` of each such call, in the order they were kept.
    """
    by_site: dict[Site, list[tuple[int, Block]]] = {}
    for (site, count), block in leftovers:
        by_site.setdefault(site, []).append((count, block))
    lines = [f"records of {len(leftovers)} in_order call(s) the main process never made were emitted at exit:"]
    for site, calls in list(by_site.items())[:SUMMARY_SITES]:
        ranks = sorted({rank for _, block in calls for rank in block})
        counts = sorted(count for count, _ in calls)
        first = ", ".join(map(str, counts[:SUMMARY_CALLS])) + (", ..." if len(counts) > SUMMARY_CALLS else "")
        lines.append(
            f"  {where(site)}: {len(calls)} call(s) from rank(s) {', '.join(map(str, ranks))} (calls {first})"
        )
    if len(by_site) > SUMMARY_SITES:
        lines.append(f"  and {len(by_site) - SUMMARY_SITES} more call site(s)")
    return "\n".join(lines)


def absence_warning(identity: Identity, missing: list[int], block: Block, timeout: float) -> CallWarning:
    """The warning for ranks that sent no record of a call within the timeout; it says what was printed.

    Args:
        identity: the call; `missing`: the ranks without a record; `block`: what the call printed (None: nothing).
        timeout: what the main process waited, in seconds.
    """
    printed = [rank for rank, entry in block.items() if entry is not None]
    done = (
        f"this call's records of {ranks_text(printed)} were printed without them, in rank order"
        if printed
        else "nothing was printed for this call (no rank that made it had a record to print)"
    )
    return CallWarning(
        describe(identity),
        tuple(missing),
        f"sent no record within {timeout:g} s ({TIMEOUT_ENV})",
        timeout,
        f"{done}; a record of theirs that arrives later is printed on its own",
        COLLECTIVE,
    )
