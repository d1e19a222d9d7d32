"""This process's gather-mode side: post its records (a rank), or collect and emit every rank's (main).

Each rank builds its own record with its own logger (`records`), drops it if its own level or filters
do, and posts it -- or an empty marker, so the main process need not wait for it -- to its queue in
the job's c10d store (`queues`). It returns at once. The main process, at its own call, collects that
call's records from every rank and emits them in rank order through its handlers (`collector`),
waiting at most `ACCELERATE_INORDER_TIMEOUT` seconds for absent ones. At exit it emits what was
delivered and seals every queue: a record posted after that is printed by the rank that made it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .._call import InOrderCall
from .._callsite import Identity
from .._diagnostics import CallWarning, warn_every, warn_once
from .._origin import Origin
from ..store import connection
from ..store.connection import Store
from . import collector as _collector
from . import queues, records


def _capture(call: InOrderCall) -> Optional[logging.LogRecord]:
    """`records.capture`, or None when building the record raises (a message whose `str` raises, an
    `extra` naming a LogRecord attribute, a filter that raises): the call still counts, and the loss is
    said, each time, naming the call (if numbered) and the rank."""
    try:
        return records.capture(call.log, call.origin)
    except Exception as exc:
        warn_every(
            CallWarning(
                _collector.describe(call.identity) if call.count else "",
                (call.origin.rank,),
                f"'s record could not be built ({exc!r})",
                0,
                "the record is lost; the call still counts on every rank",
            )
        )
        return None


def _print_here(record: Optional[logging.LogRecord], rank: int) -> None:
    """This process's own handlers: for a record that cannot reach the main process.

    A handler or filter that raises loses the record for the handlers after it: said each time.
    """
    if record is not None:
        try:
            records.emit(record)
        except Exception as exc:
            warn_every(
                CallWarning(
                    f"{record.filename}:{record.lineno} in {record.funcName}",
                    (rank,),
                    f"'s record, printed on its own rank, reached only the handlers before the one that raised ({exc!r})",
                    0,
                    "the handlers after it did not get the record",
                )
            )


def print_in_child(call: InOrderCall) -> None:
    """A forked child's in_order call (a DataLoader worker): printed here, since the store connection is its
    parent's. The child opens no side and touches no store, whenever it was forked."""
    warn_once("a forked process prints its own in_order records (the store connection is its parent's)")
    _print_here(_capture(call), call.origin.rank)


class GatherSide:
    """The main process's collector, or a rank's outbox, on the job's store.

    Args:
        store: this process's connection to the job's store (prefixed).
        rank, world_size: this process's place in the job.
        timeout (`float`): `ACCELERATE_INORDER_TIMEOUT` when the side opens (a call may bring a newer one).
        origin (`Origin`): this process's rank and host, for its records.
        reconnect (`Callable[[], Store]`, *optional*): a fresh connection, for a post whose own failed
            (None: the rank prints that record itself).
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        timeout: float,
        origin: Origin,
        reconnect: Optional[Callable[[], Store]] = None,
    ) -> None:
        self._outbox: Optional[queues.Outbox] = None
        self._collector: Optional[_collector.Collector] = None
        self._main_gone = False
        self._origin = origin
        self._reconnect = reconnect
        if rank == 0:
            inbox = queues.StoreInbox(store, world_size)
            self._collector = _collector.Collector(inbox, world_size, timeout, warn_every)
        else:
            # The clean-up thread's own connection; without one (no `Store.clone`), no thread.
            cleanup = connection.own_connection(store)
            self._outbox = queues.Outbox(
                store, rank, background=cleanup is not None, cleanup_store=cleanup, timeout=timeout
            )

    def call(self, call: InOrderCall) -> None:
        """One in_order call of this process: its record collected with the others' (main), or posted."""
        record = _capture(call)
        identity = call.identity
        if self._collector is not None:
            if record is not None:
                records.settle_message(record)  # a bad %-format shows as on the other ranks, not in a traceback
            self._collect(call.log.adapter, identity, record, call.timeout)
        else:
            self._post(identity, record)

    def _collect(self, adapter: Any, identity: Identity, record: Optional[logging.LogRecord], timeout: float) -> None:
        collector = self._collector
        if collector is None:  # `call` saw it; only `close`, under the session's lock, drops it
            return
        collector.timeout = timeout  # `configure(timeout=...)` may come later
        try:
            collector.emit_call(identity, record)
        except Exception as exc:  # not expected: the block handles the store and the handlers itself
            warn_once(f"gather mode could not collect the other ranks' records: {exc!r}")

    def _post(self, identity: Identity, record: Optional[logging.LogRecord]) -> None:
        if not self._main_gone:
            try:
                if self._outbox is None:  # at exit, after our side closed: nobody would read it
                    raise RuntimeError("the process is exiting")
                payload, document = records.encode(identity, record)
                if len(payload) > records.MAX_PAYLOAD:
                    payload = self._shrink(identity, payload, document)
                if self._outbox.full and not self._outbox.make_room():
                    self._behind(identity)
                    self._print_here(record)
                    return
                if self._send(self._outbox, payload, document):
                    return
                warn_once("the main process has finished; this rank prints its own in_order records from now on")
            except Exception as exc:  # undeliverable: print it here rather than lose it
                warn_once(
                    f"gather mode could not send a record to the main process, printing it on this rank: {exc!r}"
                )
            self._main_gone = True
        self._print_here(record)

    def _send(self, outbox: queues.Outbox, payload: bytes, document: list[Any]) -> bool:
        """`outbox.post`; if it raises, ask again on a fresh connection (`Outbox.resend`), so that a post
        the server applied before the reply was lost is not printed here too. Without a fresh connection
        the post's error stands and the rank prints the record: only then can it come out twice.

        Args:
            outbox: this rank's outbox.
            payload (`bytes`), document: the record as sent, and its data.
        """
        n = outbox.sent
        try:
            return outbox.post(payload, document)
        except Exception as exc:
            if outbox.sent > n:  # the key was written; what raised came after it
                return True
            if self._reconnect is None:
                raise
            try:
                delivered = outbox.resend(self._reconnect(), n, payload)
            except Exception:
                raise exc from None  # the post's own error says why the record is printed here
            warn_once(f"gather mode's store connection failed during a post ({exc!r}); a fresh connection settled it")
            return delivered

    def _behind(self, identity: Identity) -> None:
        """Say, once, that this rank's queue is full and its wait for the main process ran out."""
        rank = self._origin.rank
        timeout = self._outbox.timeout if self._outbox is not None else 0.0
        warn_once(
            CallWarning(
                _collector.describe(identity),
                (rank,),
                f"holds {queues.BOUND} records in the store that the main process has not read, and it read none "
                f"within {timeout:g} s (ACCELERATE_INORDER_TIMEOUT)",
                timeout,
                "this rank prints this record itself, out of order, and each later one while its queue stays "
                "full, without waiting, until the main process reads again (said once)",
            ),
            key=("gather", "behind", rank),
        )

    def _shrink(self, identity: Identity, payload: bytes, document: list[Any]) -> bytes:
        """A record too large for the store, cut to fit (`records.shrink`); a warning for each (rate-limited).

        Sent whole, it would make the store reset this rank's connection, and every later record of
        the rank would miss its block.
        """
        shrunk = records.shrink(document, len(payload))
        warn_every(
            CallWarning(
                _collector.describe(identity),
                (self._origin.rank,),
                f"'s record is {records.size_text(len(payload))} as sent, over gather mode's limit of "
                f"{records.size_text(records.MAX_PAYLOAD)}",
                0,
                "it was truncated to fit (marked '... [truncated ...]') and sent",
            )
        )
        return shrunk

    def _print_here(self, record: Optional[logging.LogRecord]) -> None:
        _print_here(record, self._origin.rank)

    @property
    def outbox(self) -> Optional[queues.Outbox]:
        """A rank's outbox (None on the main process, and after `close`)."""
        return self._outbox

    def release(self, bound: float) -> None:
        """Stop and join the clean-up thread, waiting up to `bound` s; the side stays usable."""
        if self._outbox is not None and not self._outbox.close(bound):
            warn_once(f"the in_order clean-up thread did not stop within {bound:g} s; the process may abort at exit")

    def close(self) -> None:
        """At exit. Main process: emit what was delivered, seal the queues. Then drop the side's store objects."""
        if self._collector is not None:
            try:
                self._collector.flush()
            except Exception as exc:  # the store is gone at exit: nothing more can be delivered
                warn_once(f"gather mode could not flush records at exit: {exc!r}")
        if self._outbox is not None:
            try:
                self._outbox.finish()  # the queue's last keys, deleted by whichever side is last
            except Exception as exc:  # the store is gone at exit: its keys went with it
                if not self._main_gone:  # else said already: this rank could not reach it
                    warn_once(f"gather mode could not close this rank's queue in the store at exit: {exc!r}")
        self._outbox = self._collector = None
