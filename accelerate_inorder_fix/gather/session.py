"""Gather mode (`ACCELERATE_INORDER_MODE=gather`): one writer, nobody but it waits, every wait bounded.

Each rank builds its own record with its own logger (`records`), drops it if its own level or filters
do, and posts it -- or an empty marker, so the main process need not wait for it -- to its queue in
the job's c10d store (`transport`). It returns at once. The main process, at its own call, collects
that call's records from every rank and emits them in rank order through its handlers (`collector`),
waiting at most `ACCELERATE_INORDER_TIMEOUT` seconds for absent ones.

Jobs with no c10d store (a backend torch.distributed does not run) fall back to barrier mode, with
one warning. `GATHER` is the process's one session: it opens on first use, under a lock.
"""

from __future__ import annotations

import atexit
import collections
import threading
from typing import Any, Optional

from .._diagnostics import warn_once
from . import collector as _collector
from . import records, transport


def _warn(text: str) -> None:
    warn_once(("gather", text), text)


class GatherSession:
    """This process's gather state: its store connection, its side of the protocol, its call counts."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._decided = False
        self._usable = False
        self._outbox: Optional[transport.Outbox] = None
        self._collector: Optional[_collector.Collector] = None
        self._logger_name = "root"
        self._counts: collections.Counter = collections.Counter()

    def usable(self, state, settings) -> bool:
        """True when gather mode can run in this job; otherwise barrier mode, after one warning."""
        if self._decided:
            return self._usable
        with self._lock:
            if not self._decided:
                self._open(state, settings)
                self._decided = True
        return self._usable

    def _open(self, state, settings) -> None:
        store, reason = transport.open_store(settings.timeout())
        if store is None:
            _warn(f"gather mode needs a torch.distributed c10d store ({reason}); using barrier mode")
            return
        if state.is_main_process:
            inbox = transport.Inbox(store, state.num_processes)
            self._collector = _collector.Collector(inbox, state.num_processes, settings.timeout(), self._warning)
        else:
            self._outbox = transport.Outbox(store, state.process_index)
        self._settings = settings
        self._usable = True
        atexit.register(self.close)

    def _warning(self, text: str) -> None:
        """The main process's warning about a block: to its stream, through the in_order logger."""
        record = _collector.warning_record(self._logger_name, text)
        try:
            records.emit(record)
        except Exception as exc:  # a broken handler: say it on stderr rather than lose it
            _warn(f"{text} (handler failed: {exc!r})")

    def log(self, state, adapter, level: int, msg: Any, args: tuple, kwargs: dict, site: tuple) -> None:
        """One rank's in_order call. `site` is the user's call site, the same on every rank."""
        try:
            record = records.capture(adapter, level, msg, args, kwargs)
        except Exception as exc:  # a filter or formatter that raises: the call still counts, as a marker
            _warn(f"a log record could not be built: {exc!r}")
            record = None
        with self._lock:
            self._counts[site] += 1
            identity = (site, self._counts[site])
            if self._collector is not None:
                self._collect(adapter, identity, record)
            else:
                self._post(identity, record)

    def _collect(self, adapter, identity, record) -> None:
        self._logger_name = adapter.logger.name
        self._collector.timeout = self._settings.timeout()  # `configure(timeout=...)` may come later
        try:
            self._collector.block(identity, record)
        except Exception as exc:  # the store went away: emit our own record, never raise
            _warn(f"gather mode could not collect the other ranks' records: {exc!r}")
            if record is not None:
                records.emit(record)

    def _post(self, identity, record) -> None:
        try:
            if self._outbox is None:  # at exit, after our connection closed: nobody would read it
                raise RuntimeError("the process is exiting")
            self._outbox.post(records.to_bytes(identity, record))
        except Exception as exc:  # undeliverable: print it here rather than lose it
            _warn(f"gather mode could not send a record to the main process, printing it locally: {exc!r}")
            if record is not None:
                records.emit(record)

    def close(self) -> None:
        """At exit. Main process: emit what was delivered and not yet emitted. Every rank: drop our side.

        Done here, while the store's server is certainly up, rather than at interpreter teardown, so
        our connection stays out of the launcher's shutdown.
        """
        with self._lock:
            if self._collector is not None:
                try:
                    self._collector.flush()
                except Exception as exc:  # the store is gone at exit: nothing more can be delivered
                    _warn(f"gather mode could not flush records at exit: {exc!r}")
            self._outbox = self._collector = None


GATHER = GatherSession()
