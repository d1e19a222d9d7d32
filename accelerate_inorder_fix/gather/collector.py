"""This process's gather-mode side: a rank posts its record and returns; the main process emits every rank's in order.

A rank builds its record with its own logger (`records.capture`) and posts it, or an empty marker so the
main process need not wait for it, to its queue (`queues.Outbox`); a record that cannot reach the main
process (its queue full past the timeout, the main process gone) is printed by its own rank, said. A call
is named by its identity (site, count at the site), computed by every rank alone. For its own
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
from typing import Optional

from .. import bounds
from .._call import InOrderCall
from .._callsite import Identity, Site
from .._diagnostics import COLLECTIVE, CallWarning, ranks_text, site_text, warn_every, warn_once
from ..config import SETTINGS, TIMEOUT_ENV
from ..store.connection import SHORTEST_WAIT, SLICE, Store, wait_until
from . import collapse, records
from .queues import QUEUE, Inbox, Outbox, Refused, Taken


Block = dict[int, Optional[logging.LogRecord]]  # one call's records by rank (None: the rank had none to print)
Kept = tuple[Identity, str]  # a kept record's call, and the name of the thread that made it
LATE_READS = 16  # records a rank taken past a call's deadline, at most


def describe(identity: Identity) -> str:
    return f"{site_text(identity[0])} (call {identity[1]} from there)"


def _say(where: str, ranks: tuple[int, ...], event: str, cost: Optional[float], done: str, rule: str = "") -> None:
    """Say what happened at an in_order call (`CallWarning`), rate-limited (`warn_every`)."""
    warn_every(CallWarning(where, ranks, event, cost, done, rule))


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
            what = f"the main process could not read the other ranks' records ({exc!r})"
            _say(describe(identity), (), what, None, "what was collected is printed, in rank order")
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
            heads = self.inbox.heads(waited)
            if wait_until(self.inbox.store, heads, min(start + left, now + SLICE * timeout), timeout, time.monotonic):
                self._route_all(self.inbox.take(waited, heads), identity, block)
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
        """File each record taken (`_route`); most, of `current` from a rank with none kept, straight into `block`."""
        read, ahead, heard = records.read, self.ahead, self.heard
        for rank, payload in taken:
            heard.add(rank)
            try:
                if isinstance(payload, Refused):
                    raise records.MalformedRecord(payload)
                found = read(payload, rank)
            except records.MalformedRecord as exc:
                done = f" and counted as rank {rank}'s empty record of this call" if rank not in block else ""
                block.setdefault(rank, None)  # in its record's place: not waited for, not said absent
                what = f"sent something that is not an in_order record ({exc})"
                _say(describe(current), (rank,), what, 0, f"it was ignored{done}")
                continue
            if found[0] == current and rank not in ahead:
                block[rank] = found[1]
            else:
                self._route(rank, found, current, block)

    def _route(self, rank: int, found: records.Read, current: Identity, block: Block) -> None:
        """File `rank`'s record (`records.read`'s): into `block` if of `current`, emitted if late, else kept."""
        identity, record, thread = found
        site = identity[0]
        if identity == current:  # from a rank with records kept
            block[rank] = record
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
                what = "made it and the main process went past it (it made a call they made after it)"
                done = "their records from there are printed on their own, once the main process makes a call they made after them"
                _say(site_text(identity[0]), tuple(ranks), what, 0, done, COLLECTIVE)

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
                what = f"'s record reached only the main process's handlers before the one that raised ({exc!r})"
                _say(describe(identity), (rank,), what, 0, "the block's other records are not affected")

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


def _capture(call: InOrderCall) -> Optional[logging.LogRecord]:
    """`records.capture`, or None when building the record raises (said each time): the call still counts."""
    try:
        return records.capture(call.log, call.origin)
    except Exception as exc:
        done = "the record is lost; the call still counts on every rank"
        where = describe(call.identity) if call.count else ""
        _say(where, (call.origin.rank,), f"'s record could not be built ({exc!r})", 0, done)
        return None


def print_here(record: Optional[logging.LogRecord], rank: int) -> None:
    """This process's own handlers, for a record that cannot reach the main process; a handler that raises is said."""
    if record is None:
        return
    if SETTINGS.collapse():
        record.ranks = [rank]
    try:
        records.emit(record)
    except Exception as exc:
        where = f"{record.filename}:{record.lineno} in {record.funcName}"
        what = f"'s record, printed on its own rank, reached only the handlers before the one that raised ({exc!r})"
        _say(where, (rank,), what, 0, "the handlers after it did not get the record")


class GatherSide:
    """The main process's collector, or a rank's outbox, on the job's store.

    Args:
        store: this process's connection to the job's store, prefixed for this session.
        rank, world_size: this process's place in the job.
    """

    def __init__(self, store: Store, rank: int, world_size: int) -> None:
        self._lock = threading.RLock()  # one call at a time; a handler may log in_order from inside one
        self._rank = rank
        self._store = store
        self._collector = Collector(Inbox(store, world_size), world_size) if rank == 0 else None
        self._outbox = None if rank == 0 else Outbox(store, rank)
        self._behind = False  # a full queue waited T in vain, and no ack has come since

    def call(self, call: InOrderCall) -> None:
        """One in_order call: its block collected and emitted (main), or its record posted (a rank). Never raises."""
        record = _capture(call)
        with self._lock:
            if self._rank != 0:
                self._post(call, record)
            elif self._collector is None:  # after `close`: nobody is left to collect
                print_here(record, 0)
            else:
                try:
                    self._collector.emit_call(call.identity, record, call.timeout)
                except Exception as exc:  # not expected: the collector handles the store and the handlers
                    warn_once(f"gather mode could not collect the other ranks' records: {exc!r}")

    def _post(self, call: InOrderCall, record: Optional[logging.LogRecord]) -> None:
        outbox = self._outbox
        if outbox is None:  # the main process has finished (said once), or this rank's session closed
            print_here(record, self._rank)
            return
        try:
            payload, size = records.encode(call.identity, record)
            if size > len(payload):
                what = f"'s record is {records.size_text(size)} as sent, over gather mode's limit of {records.size_text(records.MAX_RECORD)}"
                done = "it was truncated to fit (marked '... [truncated ...]') and sent"
                _say(describe(call.identity), (self._rank,), what, 0, done)
            if outbox.full and not self._make_room(outbox, call):
                print_here(record, self._rank)
                return
            if self._send(outbox, payload):
                return
            warn_once("the main process has finished; this rank prints its own in_order records from now on")
        except Exception as exc:  # undeliverable: printed here rather than lost
            warn_once(f"gather mode could not send a record to the main process, printing it on this rank: {exc!r}")
        self._outbox = None
        print_here(record, self._rank)

    def _send(self, outbox: Outbox, payload: bytes) -> bool:
        """`outbox.post`; if it raises, once more on a fresh client of this thread (its head's `compare_set`
        says whether the first landed: docs/gather-mode.md); if that fails too, the first error stands."""
        try:
            return outbox.post(payload)
        except Exception as exc:
            fresh = getattr(self._store, "fresh", None)
            if fresh is None:
                raise
            try:
                fresh()
                outbox.store = self._store  # this thread's new client from now on
                delivered = outbox.post(payload)
            except Exception:
                raise exc from None  # the post's own error says why the record is printed here
            warn_once(f"gather mode's store connection failed during a post ({exc!r}); a fresh connection settled it")
            return delivered

    def _make_room(self, outbox: Outbox, call: InOrderCall) -> bool:
        """Wait for the main process's next ack, at most T once a stall (`GATHER_FULL`); False: print the record here."""
        if outbox.learn(0.0 if self._behind else call.timeout):
            self._behind = False
            return True
        if not self._behind:
            what = f"holds {outbox.bound} records in the store that the main process has not read, and it read none within {call.timeout:g} s (ACCELERATE_INORDER_TIMEOUT)"
            done = "this rank prints its records itself, out of order, without waiting, until the main process reads again"
            _say(describe(call.identity), (self._rank,), what, call.timeout, done)
        self._behind = True
        return False

    def close(self) -> None:
        """At exit (idempotent, never raises): the main process seals the queues and emits what was delivered; a
        rank closes its queue. Each deletes the keys it is last to need; no thread is left."""
        with self._lock:
            collector, outbox, self._collector, self._outbox = self._collector, self._outbox, None, None
            try:
                if collector is not None:
                    collector.flush()
                if outbox is not None:
                    outbox.close()
            except Exception as exc:  # the store is gone at exit: its keys went with it
                warn_once(f"gather mode could not close its queues in the store at exit: {exc!r}")
