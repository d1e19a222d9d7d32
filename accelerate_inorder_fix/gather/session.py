"""This process's in_order state: the mode the job agreed on, and gather mode's side of the protocol.

Mode agreement. Ranks that disagree on the mode cannot work together (barriers on some ranks, store
posts on others). So at its first in_order call every rank takes the main process's mode, through the
job's c10d store: the main process writes its word, every other rank reads it, waiting at most
`ACCELERATE_INORDER_TIMEOUT` seconds (a barrier-mode rank would wait that long for the main process at
its first barrier anyway). A rank whose own setting differs says so in one line. A later
`configure(mode=...)`, or a change of `ACCELERATE_INORDER_MODE`, is taken as a deliberate switch made
on every rank, and followed, whatever the rank's setting was at its first call: every rank switches
at the same call, so no call runs in two modes.

Barrier mode checks each call in through the same store first (`checkin`): its barriers run only when
every rank has made the call, so a call some ranks skip costs a bounded wait and a warning, not a hang.

Gather mode (`ACCELERATE_INORDER_MODE=gather`): one writer, nobody but it waits, every wait bounded.
Each rank builds its own record with its own logger (`records`), drops it if its own level or filters
do, and posts it -- or an empty marker, so the main process need not wait for it -- to its queue in
the job's c10d store (`transport`). It returns at once. The main process, at its own call, collects
that call's records from every rank and emits them in rank order through its handlers (`collector`),
waiting at most `ACCELERATE_INORDER_TIMEOUT` seconds for absent ones. At exit it emits what was
delivered and seals every queue: a record posted after that is printed by the rank that made it.

Threads: the in_order calls of one process take turns (`lock`), in both modes, so one call's N
barriers, or its capture and post, never interleave with another thread's.

Jobs with no c10d store (a backend torch.distributed does not run) skip the agreement and the
check-in (plain barriers, as upstream), and a gather setting falls back to barrier mode with one
warning. `GATHER` is the process's one session.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
from typing import Any, Optional

from .._callsite import Identity, Site
from .._diagnostics import warn_once
from ..barrier import checkin as _checkin
from ..config import SETTINGS, Settings
from ..store import teardown
from . import collector as _collector
from . import records, transport


def _warn(text: str) -> None:
    warn_once(("gather", text), text)


def _say_skipped(side: _checkin.CheckIn, site: Site, verdict: _checkin.Verdict, timeout: float) -> None:
    """One line per diverged site and rank that has something to say; a retired site says nothing more."""
    where = f"{site[0]}:{site[2]} ({site[1]})"
    rank = side.rank
    tail = "logged unordered, without barriers, here and at every later in_order call from this line"
    named = ", ".join(map(str, sorted(verdict.missing)))
    callers = [q for q in range(side.world_size) if q not in verdict.missing]
    speaker = verdict.decider if verdict.decider in callers else (callers[:1] or [rank])[0]
    if verdict.why == "damaged":
        text = f"rank {rank}: the in_order check-in at {where} found something else in the job's store; {tail}"
    elif verdict.why == "store":
        text = f"rank {rank}: the in_order check-in at {where} lost rank {verdict.decider}'s store connection; {tail}"
    elif rank in verdict.missing:
        text = f"rank {rank}: the in_order call at {where} had been given up before this rank made it; {tail}"
    elif rank != speaker or verdict.why == "retired":
        return
    elif verdict.why == "cycle":
        text = (
            f"in_order call at {where}: rank(s) {named} had not made it and were waiting at another in_order call "
            f"({verdict.other}) for the ranks here; given up halfway through the wait so that one could go on; {tail}"
        )
    elif verdict.why == "absent":
        text = (
            f"in_order call at {where}: rank(s) {named} had not made it, missing since an earlier in_order call "
            f"and not back within half of ACCELERATE_INORDER_TIMEOUT ({timeout:g} s) in all; {tail}."
        )
    else:
        text = (
            f"in_order call at {where}: rank(s) {named} did not make it within {timeout:g} s "
            f"(ACCELERATE_INORDER_TIMEOUT); {tail}. An in_order call is collective: every rank must make it."
        )
    warn_once(("checkin", site), text)


class GatherSession:
    """This process's in_order state: the agreed mode, its store connection, its gather side, call counts."""

    def __init__(self) -> None:
        # Held for the whole of one in_order call, in both modes (re-entrant: a handler may log).
        self.lock = threading.RLock()
        # (this process's setting then, its configure() generation then, the mode in use)
        self._agreement: Optional[tuple[str, int, str]] = None
        self._store: Any = None
        self._store_reason: Optional[str] = "no in_order call yet"
        self._opened = False
        self._usable = False  # gather sides opened (stays True after `close`: late calls print locally)
        self._outbox: Optional[transport.Outbox] = None
        self._collector: Optional[_collector.Collector] = None
        self._checkin: Optional[_checkin.CheckIn] = None
        self._settings: Any = None
        self._logger_name = "root"
        self._counts: collections.Counter[Site] = collections.Counter()
        self._main_gone = False
        self._pid: Optional[int] = None  # the process that opened the store connection
        self._settings_timeout = 30.0  # the timeout the store was opened with

    # -- which mode -------------------------------------------------------------------------

    def mode(self, state: Any, settings: Settings) -> str:
        """'barrier' or 'gather': the mode of this in_order call, the same on every rank."""
        own = settings.mode()
        agreement = self._agreement
        if agreement is None:
            with self.lock:
                if self._agreement is None:
                    self._agreement = (own, settings.mode_generation, self._agree(state, settings, own))
                agreement = self._agreement
        setting, generation, mode = agreement
        if own != setting or settings.mode_generation != generation:  # a switch, made on every rank
            mode = own
        if mode == "gather" and not self._gather_ready(state, settings):
            return "barrier"
        return mode

    def _agree(self, state: Any, settings: Settings, own: str) -> str:
        """One bounded round trip through the job's store: the main process's mode, on every rank."""
        self._settings_timeout = settings.timeout()
        store, self._store_reason = transport.open_store(self._settings_timeout)
        self._pid = os.getpid()
        if store is None:
            return own
        self._store = store
        atexit.register(self.close)
        teardown.on_destroy(self.release)
        rank = state.process_index
        try:
            if state.is_main_process:
                transport.publish_mode(store, own)
                return own
            main = transport.read_mode(store, settings.timeout())
        except Exception as exc:  # the store failed: nothing to agree through
            _warn(f"rank {rank}: could not read the main process's in_order mode ({exc!r}); using {own} mode")
            return own
        if main not in ("barrier", "gather"):
            _warn(
                f"rank {rank}: the main process did not publish its in_order mode within {settings.timeout():g} s "
                f"(ACCELERATE_INORDER_TIMEOUT); using this rank's setting, {own} mode"
            )
            return own
        if main != own:
            _warn(
                f"rank {rank}: in_order mode setting {own!r} (from {settings.mode_source()}) differs from the "
                f"main process's; using the main process's mode, {main}"
            )
        return main

    def _gather_ready(self, state: Any, settings: Settings) -> bool:
        if not self._opened:
            with self.lock:
                if not self._opened:
                    self._open(state, settings)
                    self._opened = True
        return self._usable

    def _open(self, state: Any, settings: Settings) -> None:
        if self._store is None:
            _warn(f"gather mode needs a torch.distributed c10d store ({self._store_reason}); using barrier mode")
            return
        if state.is_main_process:
            inbox = transport.Inbox(self._store, state.num_processes)
            self._collector = _collector.Collector(inbox, state.num_processes, settings.timeout(), self._warning)
        else:
            # The clean-up thread's own connection; without one (no `Store.clone`), no thread.
            cleanup = transport.cleanup_store(settings.timeout())
            self._outbox = transport.Outbox(
                self._store, state.process_index, background=cleanup is not None, cleanup_store=cleanup
            )
        self._settings = settings
        self._usable = True

    # -- one call ---------------------------------------------------------------------------

    def _warning(self, text: str) -> None:
        """The main process's warning about a block: to its stream, through the in_order logger."""
        record = _collector.warning_record(self._logger_name, text)
        try:
            records.emit(record)
        except Exception as exc:  # a broken handler: say it on stderr rather than lose it
            _warn(f"{text} (handler failed: {exc!r})")

    def _count(self, site: Site) -> int:
        """This process's number for its next call at `site`: with the site, the call's identity in both modes."""
        self._counts[site] += 1
        return int(self._counts[site])

    def check_in(self, state: Any, settings: Settings, site: Site) -> str:
        """Barrier mode: how this call's turns go.

        `"go"`: every rank checked in (the check-in stands for the barrier after rank 0's turn);
        `"skip"`: some rank did not, nobody enters a barrier; `"plain"`: no store to check in through
        (plain barriers, as upstream). A forked process is not a rank: `"skip"`, with one line.
        """
        with self.lock:
            if self._pid is not None and self._pid != os.getpid():
                _warn("a forked process logs its in_order records at once, without barriers (it is not a rank)")
                return "skip"
            if self._store is None:
                return "plain"
            if self._checkin is None:
                self._checkin = _checkin.CheckIn(
                    self._store, state.process_index, state.num_processes, reconnect=self._reconnect
                )
            verdict = self._checkin.verdict(site, settings.timeout())
            if not verdict.go:
                _say_skipped(self._checkin, site, verdict, settings.timeout())
            return "go" if verdict.go else "skip"

    def _reconnect(self) -> Any:
        """A fresh store connection for the check-in, after its own failed (`_checkin.CheckIn.reconnect`)."""
        store, reason = transport.open_store(self._settings_timeout)
        if store is None:
            raise RuntimeError(reason)
        return store

    def log(
        self, state: Any, adapter: Any, level: int, msg: Any, args: tuple[Any, ...], kwargs: dict[str, Any], site: Site
    ) -> None:
        """One rank's in_order call in gather mode. `site` is the user's call site, the same on every rank."""
        with self.lock:
            try:
                record = records.capture(adapter, level, msg, args, kwargs)
            except Exception as exc:  # a filter or formatter that raises: the call still counts, as a marker
                _warn(f"a log record could not be built: {exc!r}")
                record = None
            identity = (site, self._count(site))
            if self._pid != os.getpid():  # a forked child (a DataLoader worker): the connection is its parent's
                _warn("a forked process prints its own in_order records (the store connection is its parent's)")
                self._print_here(record)
            elif self._collector is not None:
                self._collect(adapter, identity, record)
            else:
                self._post(identity, record)

    def _collect(self, adapter: Any, identity: Identity, record: Optional[logging.LogRecord]) -> None:
        collector = self._collector
        if collector is None:  # `log` saw it; only `close`, under the same lock, drops it
            return
        self._logger_name = adapter.logger.name
        collector.timeout = self._settings.timeout()  # `configure(timeout=...)` may come later
        try:
            collector.emit_call(identity, record)
        except Exception as exc:  # not expected: the block handles the store and the handlers itself
            _warn(f"gather mode could not collect the other ranks' records: {exc!r}")

    def _post(self, identity: Identity, record: Optional[logging.LogRecord]) -> None:
        if not self._main_gone:
            try:
                if self._outbox is None:  # at exit, after our side closed: nobody would read it
                    raise RuntimeError("the process is exiting")
                if self._outbox.post(*records.encode(identity, record)):
                    return
                _warn("the main process has finished; this rank prints its own in_order records from now on")
            except Exception as exc:  # undeliverable: print it here rather than lose it
                _warn(f"gather mode could not send a record to the main process, printing it on this rank: {exc!r}")
            self._main_gone = True
        self._print_here(record)

    @staticmethod
    def _print_here(record: Optional[logging.LogRecord]) -> None:
        """This process's own handlers: for a record that cannot reach the main process."""
        if record is not None:
            try:
                records.emit(record)
            except Exception as exc:
                warn_once(("gather-emit", type(exc)), f"a log record could not be emitted: {exc!r}")

    def release(self) -> None:
        """Stop and join this process's background store threads; they must not outlive the job's teardown.

        Called before the default process group is destroyed (`teardown`) and at exit (`close`). A
        thread still inside a store call when the interpreter finalizes aborts the process (issue 24,
        `transport.Cleaner`). Each wait is bounded by the store connection's timeout; the session
        itself stays usable (a later gather-mode post is delivered, not cleaned up).
        """
        bound = SETTINGS.timeout() + 5.0
        with self.lock:  # no in_order call meanwhile: nothing new is handed to a thread
            if self._outbox is not None and not self._outbox.close(bound):
                _warn(f"the in_order clean-up thread did not stop within {bound:g} s; the process may abort at exit")

    def close(self) -> None:
        """At exit. Main process: emit what was delivered, seal the queues. Every rank: stop our threads, drop our side.

        Done here, while the store's server is certainly up, rather than at interpreter teardown, so
        our connection stays out of the launcher's shutdown. Registered at the first in_order call, it
        runs before the exit handlers registered earlier (torch's, accelerate's), and every exit
        handler runs before the interpreter finalizes.
        """
        self.release()
        with self.lock:
            if self._collector is not None:
                try:
                    self._collector.flush()
                except Exception as exc:  # the store is gone at exit: nothing more can be delivered
                    _warn(f"gather mode could not flush records at exit: {exc!r}")
            self._outbox = self._collector = self._store = self._checkin = None


GATHER = GatherSession()
