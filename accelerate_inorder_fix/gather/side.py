"""This process's gather-mode side: a rank posts its record and returns; the main process emits every rank's in order.

A rank builds its record with its own logger (`records.capture`), and posts it, or an empty marker so
the main process need not wait for it, to its queue (`queues.Outbox`). The main process collects each
call's block from the queues and emits it in rank order (`collector.Collector`). A record that cannot
reach the main process (its queue full past the timeout, the main process gone) is printed by its own
rank, and that is said. The protocol: docs/gather-mode.md.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from .._call import InOrderCall
from .._diagnostics import CallWarning, warn_every, warn_once
from ..config import SETTINGS
from ..store.connection import Store
from . import records
from .collector import Collector, describe
from .queues import Inbox, Outbox


def _capture(call: InOrderCall) -> Optional[logging.LogRecord]:
    """`records.capture`, or None when building the record raises (said each time): the call still counts."""
    try:
        return records.capture(call.log, call.origin)
    except Exception as exc:
        where = describe(call.identity) if call.count else ""
        warn_every(
            CallWarning(
                where,
                (call.origin.rank,),
                f"'s record could not be built ({exc!r})",
                0,
                "the record is lost; the call still counts on every rank",
            )
        )
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
        warn_every(
            CallWarning(
                where,
                (rank,),
                f"'s record, printed on its own rank, reached only the handlers before the one that raised ({exc!r})",
                0,
                "the handlers after it did not get the record",
            )
        )


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
                warn_every(
                    CallWarning(
                        describe(call.identity),
                        (self._rank,),
                        f"'s record is {records.size_text(size)} as sent, over gather mode's limit of {records.size_text(records.MAX_RECORD)}",
                        0,
                        "it was truncated to fit (marked '... [truncated ...]') and sent",
                    )
                )
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
            warn_every(
                CallWarning(
                    describe(call.identity),
                    (self._rank,),
                    f"holds {outbox.bound} records in the store that the main process has not read, and it read none within {call.timeout:g} s (ACCELERATE_INORDER_TIMEOUT)",
                    call.timeout,
                    "this rank prints its records itself, out of order, without waiting, until the main process reads again",
                )
            )
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
