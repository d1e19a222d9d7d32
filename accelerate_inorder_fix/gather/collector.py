"""The main process's side of gather mode: each in_order call's block, taken from the queues and emitted in rank order.

A call is named by its identity (site, count at the site), computed by every rank alone. For its own
call the main process waits once for every rank's next record and reads them in batches; a record of
another call goes where it belongs (kept for a call to come, or emitted at once if that call's block is
out). While it waits for a slow rank it keeps reading and acknowledging the others. Who is waited for,
and how long (a quiet rank costs `GATHER_DEATH` in all), is in docs/gather-mode.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Optional, Union

from .. import bounds
from .._callsite import Identity, Site
from .._diagnostics import COLLECTIVE, CallWarning, ranks_text, site_text, warn_every
from ..config import SETTINGS, TIMEOUT_ENV
from ..store.connection import SHORTEST_WAIT, SLICE
from . import collapse, records
from .queues import QUEUE, Inbox, Refused, Taken


Block = dict[int, Optional[logging.LogRecord]]  # one call's records by rank (None: the rank had none to print)
Kept = tuple[Identity, str]  # a kept record's call, and the name of the thread that made it
LATE_READS = 16  # records a rank taken past a call's deadline, at most


def describe(identity: Identity) -> str:
    return f"{site_text(identity[0])} (call {identity[1]} from there)"


class Collector:
    """The main process's blocks; its state is bounded by call sites and ranks.

    Args:
        inbox: the queues. world_size: ranks in the job.
    """

    def __init__(self, inbox: Inbox, world_size: int) -> None:
        self.inbox, self.world_size = inbox, world_size
        self.pending: dict[Identity, Block] = {}  # records of calls the main process has not made
        self.made: dict[Site, int] = {}  # its last call per site
        self.absent: dict[Site, set[int]] = {}  # ranks that skipped a site while heard from: not waited for there
        self.quiet: dict[int, float] = {}  # ranks heard from by no call since they missed one: wait left for them
        self.ahead: dict[int, list[Kept]] = {}  # per rank, its kept records' calls, in the order it made them
        self.others_only: set[Site] = set()  # sites said to be called by the other ranks only
        self.heard: set[int] = set()  # ranks read from during the current call
        self.passing: list[tuple[Identity, int]] = []  # kept records this call shows it went past
        self.skipped: dict[int, Site] = {}  # where a quiet rank went quiet: absent there once on time elsewhere

    def emit_call(self, identity: Identity, own: Optional[logging.LogRecord], timeout: float) -> None:
        """The main process's call `identity` (`own`: its record): collect the block, emit it, say who missed it."""
        block: Block = {0: own, **self.pending.pop(identity, {})}
        self.heard, self.passing = set(), []
        start = time.monotonic()
        try:
            self._collect(identity, block, start, timeout)
        except Exception as exc:  # the store went away: what was collected still goes out
            warn_every(
                CallWarning(
                    describe(identity),
                    (),
                    f"the main process could not read the other ranks' records ({exc!r})",
                    None,
                    "what was collected is printed, in rank order",
                )
            )
        site = identity[0]
        self.made[site] = max(identity[1], self.made.get(site, 0))
        self.pending.pop(identity, None)
        self._emit_block(block, identity)
        self.passing += [
            (kept, rank) for rank in self.ahead.keys() & block.keys() for kept in self._passed(rank, identity)
        ]
        self.absent.get(site, set()).difference_update(block)  # on time: waited for again everywhere,
        for rank in self.quiet.keys() & block.keys():
            del self.quiet[rank]
        for rank in self.skipped.keys() & block.keys():  # but where it went quiet and never came
            skipped = self.skipped.pop(rank)
            if skipped != site:
                self.absent.setdefault(skipped, set()).add(rank)
        self._missed(identity, block, timeout, time.monotonic() - start)
        self._release(self.passing)

    def _waited(self, block: Block, site: Site, start: float, timeout: float) -> list[int]:
        """The ranks still waited for: each until `start` plus T, or plus what is left of its wait if quiet."""
        soon = time.monotonic() + SHORTEST_WAIT - start  # into the call, a moment from now
        absent, ended, quiet = self.absent.get(site, ()), self.inbox.ended, self.quiet
        ranks = range(1, self.world_size) if timeout > soon else ()
        return [
            r for r in ranks if r not in block and r not in absent and r not in ended and quiet.get(r, timeout) > soon
        ]

    def _collect(self, identity: Identity, block: Block, start: float, timeout: float) -> None:
        """Wait for the ranks still missing (each until its own limit), reading ahead at each slice's end."""
        while True:
            waited = self._waited(block, identity[0], start, timeout)
            if not waited:
                break
            now, left = time.monotonic(), min([timeout, *(self.quiet[r] for r in self.quiet.keys() & waited)])
            if self.inbox.wait(waited, min(start + left, now + SLICE * timeout), timeout, time.monotonic):
                self._route_all(self.inbox.take(waited), identity, block)
            else:
                self._read_ahead(range(1, self.world_size), identity, block, QUEUE, True)
            self.inbox.ack()
        missing = [r for r in range(1, self.world_size) if r not in block]
        self._read_ahead(missing, identity, block, LATE_READS, False)
        self.inbox.ack()

    def _read_ahead(self, ranks: Sequence[int], identity: Identity, block: Block, most: int, past_block: bool) -> None:
        """Take, without waiting, up to `most` records each of `ranks`; with `past_block`, also of ranks whose
        record of the call is in (so that a rank running ahead never waits for its acks)."""
        todo = list(ranks)
        for _ in range(most):
            todo = self.inbox.present([r for r in todo if past_block or r not in block])
            if not todo:
                return
            self._route_all(self.inbox.take(todo), identity, block)

    def _route_all(self, taken: Taken, current: Identity, block: Block) -> None:
        for rank, payload in taken:
            if payload is not None:
                self._route(rank, payload, current, block)

    def _route(self, rank: int, payload: Union[bytes, Refused], current: Optional[Identity], block: Block) -> None:
        """File one record of `rank`: into `block` if it is of `current`, emitted if late, else kept for its call."""
        self.heard.add(rank)
        try:
            if isinstance(payload, Refused):
                raise records.MalformedRecord(payload.reason)
            identity, record, thread = records.read(payload, rank)
        except records.MalformedRecord as exc:
            where = describe(current) if current else ""
            counted = current is not None and rank not in block  # in the place of its record of this call
            if counted:
                block[rank] = None  # its empty record of the call: not waited for, not said absent
            done = (
                f"it was ignored and counted as rank {rank}'s empty record of this call"
                if counted
                else "it was ignored"
            )
            warn_every(CallWarning(where, (rank,), f"sent something that is not an in_order record ({exc})", 0, done))
            return
        site = identity[0]
        if identity == current:
            block[rank] = record
            if rank in self.ahead:
                self.passing += [(kept, rank) for kept in self._passed(rank, identity, thread)]
        elif identity[1] <= self.made.get(site, 0):
            if self.skipped.get(rank) == site:  # it made the call it went quiet at, late
                del self.skipped[rank]
            if record is not None:
                self._emit_block({rank: record}, identity)  # on its own (with collapse on, `ranks` [rank])
            if rank in self.ahead:
                self._release([(kept, rank) for kept in self._passed(rank, identity, thread)])
        else:
            self.pending.setdefault(identity, {})[rank] = record
            self.ahead.setdefault(rank, []).append((identity, thread))

    def _missed(self, identity: Identity, block: Block, timeout: float, waited: float) -> None:
        """Name the ranks waited for that sent no record of the call; mark each absent at the site, or quiet."""
        site = identity[0]
        absent = self.absent.setdefault(site, set())
        missing = [r for r in range(1, self.world_size) if r not in block and r not in self.inbox.ended]
        named = [r for r in missing if r not in absent and r not in self.quiet]
        if named:
            warn_every(absence_warning(identity, named, block, timeout))
        for rank in missing:
            if rank in self.quiet:
                self.quiet[rank] = max(0.0, self.quiet[rank] - waited) if rank not in absent else self.quiet[rank]
            elif rank not in absent:
                if rank in self.heard:
                    absent.add(rank)
                else:
                    self.quiet[rank] = (bounds.GATHER_DEATH.value - 1.0) * timeout
                    self.skipped[rank] = site

    def _passed(self, rank: int, made: Identity, thread: str = "") -> list[Identity]:
        """The calls of `rank`'s kept records that its thread made before `made`, a call the main process's thread
        of that name has made: that thread went past them (the same code runs in the same order on every rank).

        Args:
            thread: the thread of `rank`'s record of `made`, when it is not kept (read now).
        """
        kept = self.ahead.pop(rank, [])
        places = [i for i, (identity, _) in enumerate(kept) if identity == made]
        if places:
            thread = kept[places[0]][1]
            del kept[places[0]]
        before = kept[: places[0]] if places else kept
        here = threading.current_thread().name
        passed = [k for k in before if k[1] == thread == here]
        left = [k for k in kept if k not in passed]
        if left:
            self.ahead[rank] = left
        return [identity for identity, _ in passed]

    def _release(self, passed: list[tuple[Identity, int]]) -> None:
        """Emit the kept records of calls the main process went past, a block per call; say each site once."""
        for identity in sorted({identity for identity, _ in passed}):
            ranks = sorted(rank for kept, rank in passed if kept == identity)
            block = self.pending.get(identity, {})
            self._emit_block({rank: block.pop(rank, None) for rank in ranks}, identity)
            if not block:
                self.pending.pop(identity, None)
            if identity[0] not in self.others_only:
                self.others_only.add(identity[0])
                warn_every(
                    CallWarning(
                        site_text(identity[0]),
                        tuple(ranks),
                        "made it and the main process went past it (it made a call they made after it)",
                        0,
                        "their records from there are printed on their own, once the main process makes a call they made after them",
                        COLLECTIVE,
                    )
                )

    def _emit_block(self, block: Block, identity: Identity) -> None:
        """Emit a block in rank order; with collapse on, identical records once, each with its `ranks`."""
        lines = [(r, record) for r, record in sorted(block.items()) if record is not None]
        if SETTINGS.collapse():
            try:
                lines = [(getattr(line, "ranks", [0])[0], line) for line in collapse.collapse(lines)]
            except Exception as exc:  # grouping must not cost the block: it goes out per rank
                warn_every(f"in_order call at {describe(identity)}: its records could not be collapsed: {exc!r}")
        for rank, record in lines:
            try:  # a handler that raises loses only this record, said
                records.emit(record)
            except Exception as exc:
                warn_every(
                    CallWarning(
                        describe(identity),
                        (rank,),
                        f"'s record reached only the main process's handlers before the one that raised ({exc!r})",
                        0,
                        "the block's other records are not affected",
                    )
                )

    def flush(self) -> None:
        """At exit: seal every queue, taking what was posted before, and emit every record delivered but not emitted."""
        for rank in range(1, self.world_size):
            self._route_all(self.inbox.seal(rank), (("<exit>", "", 0), 0), {})
        leftovers = [(identity, block) for identity, block in self.pending.items() if block]
        self.pending.clear()
        for identity, block in leftovers:
            self._emit_block(block, identity)
        if leftovers:
            sites = sorted({site_text(identity[0]) for identity, _ in leftovers})
            warn_every(
                f"records of {len(leftovers)} in_order call(s) the main process never made were emitted at exit: {', '.join(sites[:5])}"
            )


def absence_warning(identity: Identity, missing: list[int], block: Block, timeout: float) -> CallWarning:
    """The warning for ranks that sent no record of a call within the timeout; it says what was printed."""
    printed = [rank for rank, record in block.items() if record is not None]
    done = (
        f"this call's records of {ranks_text(printed)} were printed without them, in rank order"
        if printed
        else "nothing was printed for this call"
    )
    return CallWarning(
        describe(identity),
        tuple(missing),
        f"sent no record within {timeout:g} s ({TIMEOUT_ENV})",
        timeout,
        f"{done}; a record of theirs that arrives later is printed on its own",
        COLLECTIVE,
    )
