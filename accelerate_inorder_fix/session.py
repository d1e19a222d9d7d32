"""This process's in_order state: the mode the job agreed on, call counts, and the side of that mode.

Mode agreement. Ranks that disagree on the mode cannot work together (barriers on some ranks, store
posts on others). So at its first in_order call every rank takes the main process's mode, through the
job's c10d store: the main process writes its word, every other rank reads it, waiting at most
`ACCELERATE_INORDER_TIMEOUT` seconds (a barrier-mode rank would wait that long for the main process at
its first barrier anyway). A rank whose own setting differs says so in one line. A later
`configure(mode=...)`, or a change of `ACCELERATE_INORDER_MODE`, is taken as a deliberate switch made
on every rank, and followed, whatever the rank's setting was at its first call: every rank switches
at the same call, so no call runs in two modes.

Each mode has its side, opened at its first call on the same store connection: `barrier.BarrierSide`
(the check-in) and `gather.GatherSide` (posts or collection). A call's identity, its site and how many
times this process has called from there, is counted here, for both.

Threads: the in_order calls of one process take turns (`lock`), in both modes, so one call's N
barriers, or its capture and post, never interleave with another thread's.

Jobs with no c10d store (a backend torch.distributed does not run) skip the agreement and the
check-in (plain barriers, as upstream), and a gather setting falls back to barrier mode with one
warning. A forked process (a DataLoader worker) is not a rank: it logs its in_order records itself.
`SESSION` is the process's one session.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from typing import Any, Callable, Optional, Union

from ._callsite import Site
from ._diagnostics import warn_once
from ._origin import Origin
from .barrier.handoff import Handoff
from .barrier.side import BarrierSide
from .config import SETTINGS, Settings, spans_hosts
from .gather.side import GatherSide
from .store import connection, mode, teardown
from .store.connection import Store


def _warn(text: str) -> None:
    warn_once(("session", text), text)


class InOrderSession:
    """This process's in_order state: the agreed mode, its store connection, call counts, each mode's side.

    Args:
        open_store (`Callable[[float], tuple[Store | None, str | None]]`, *optional*): how to reach the
            job's store (`store.connection.open_store`; a unit test hands in its in-memory one).
    """

    def __init__(self, open_store: Callable[[float], tuple[Optional[Store], Optional[str]]] = connection.open_store):
        # Held for the whole of one in_order call, in both modes (re-entrant: a handler may log).
        self.lock = threading.RLock()
        self._open_store = open_store
        # (this process's setting then, its configure() generation then, the mode in use)
        self._agreement: Optional[tuple[str, int, str]] = None
        self._store: Optional[Store] = None
        self._store_reason: Optional[str] = "no in_order call yet"
        self._store_timeout = 30.0  # the timeout the store was opened with
        self._pid: Optional[int] = None  # the process that opened the store connection
        self._counts: collections.Counter[Site] = collections.Counter()
        self._barrier: Optional[BarrierSide] = None
        self._gather: Optional[GatherSide] = None
        self._gather_tried = False  # a gather side is opened once; without a store, never
        self._origin: Optional[Origin] = None  # this process's rank and host (`origin`)

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
        setting, generation, agreed = agreement
        if own != setting or settings.mode_generation != generation:  # a switch, made on every rank
            agreed = own
        if agreed == "gather" and self._gather_side(state, settings) is None:
            return "barrier"
        return agreed

    def _agree(self, state: Any, settings: Settings, own: str) -> str:
        """One bounded round trip through the job's store: the main process's mode, on every rank."""
        self._store_timeout = settings.timeout()
        store, self._store_reason = self._open_store(self._store_timeout)
        self._pid = os.getpid()
        if store is None:
            return own
        self._store = store
        atexit.register(self.close)
        teardown.on_destroy(self.release)
        rank = state.process_index
        try:
            if state.is_main_process:
                mode.publish_mode(store, own)
                return own
            main = mode.read_mode(store, settings.timeout())
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

    # -- what both modes share --------------------------------------------------------------

    def count(self, site: Site) -> int:
        """This process's number for its next call at `site`: with the site, the call's identity in both modes."""
        self._counts[site] += 1
        return int(self._counts[site])

    def forked(self) -> bool:
        """True in a forked child of the process that opened the store connection: it is not a rank."""
        return self._pid is not None and self._pid != os.getpid()

    def _reconnect(self) -> Store:
        """A fresh store connection for the check-in, after its own failed (`CheckIn.reconnect`)."""
        store, reason = self._open_store(self._store_timeout)
        if store is None:
            raise RuntimeError(reason)
        return store

    def origin(self, state: Any) -> Origin:
        """This process's rank and host, for its in_order records (the host as named at its first call)."""
        origin = self._origin
        if origin is None or origin.rank != state.process_index:
            origin = self._origin = Origin.of(state.process_index, spans_hosts())
        return origin

    # -- barrier mode -----------------------------------------------------------------------

    def check_in(self, state: Any, settings: Settings, site: Site, record: Callable[[], None]) -> Union[str, Handoff]:
        """Barrier mode: how this call's turns go.

        A `Handoff`: every rank checked in, the turns pass through the store (`barrier.handoff`);
        `"skip"`: some rank did not, nobody waits; `"plain"`: no store to check in through (plain
        barriers, as upstream). A forked process is not a rank: `"skip"`, with one line.
        """
        with self.lock:
            if self.forked():
                _warn("a forked process logs its in_order records at once, without barriers (it is not a rank)")
                return "skip"
            if self._store is None:
                return "plain"
            if self._barrier is None:
                self._barrier = BarrierSide(self._store, state.process_index, state.num_processes, self._reconnect)
            return self._barrier.check_in(site, settings.timeout(), record)

    # -- gather mode ------------------------------------------------------------------------

    def _gather_side(self, state: Any, settings: Settings) -> Optional[GatherSide]:
        if not self._gather_tried:
            with self.lock:
                if not self._gather_tried:
                    if self._store is None:
                        _warn(
                            f"gather mode needs a torch.distributed c10d store ({self._store_reason}); using barrier mode"
                        )
                    else:
                        self._gather = GatherSide(
                            self._store,
                            state.process_index,
                            state.num_processes,
                            settings.timeout(),
                            self.origin(state),
                        )
                    self._gather_tried = True
        return self._gather

    def gather_call(
        self,
        state: Any,
        settings: Settings,
        site: Site,
        adapter: Any,
        level: int,
        msg: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """One rank's in_order call in gather mode. `site` is the user's call site, the same on every rank."""
        with self.lock:
            side = self._gather_side(state, settings)
            if side is not None:  # `mode` said gather only with a side
                identity = (site, self.count(site))
                side.call(adapter, level, msg, args, kwargs, identity, settings.timeout(), forked=self.forked())

    # -- the end of the job -----------------------------------------------------------------

    def release(self) -> None:
        """Stop and join this process's background store threads; they must not outlive the job's teardown.

        Called before the default process group is destroyed (`teardown`) and at exit (`close`). A
        thread still inside a store call when the interpreter finalizes aborts the process (issue 24,
        `store.writer`). Each wait is bounded by the store connection's timeout; the session itself
        stays usable (a later gather-mode post is delivered, not cleaned up).
        """
        with self.lock:  # no in_order call meanwhile: nothing new is handed to a thread
            if self._gather is not None:
                self._gather.release(SETTINGS.timeout() + 5.0)

    def close(self) -> None:
        """At exit. Main process: emit what was delivered, seal the queues. Every rank: stop our threads, drop our store.

        Done here, while the store's server is certainly up, rather than at interpreter teardown, so
        our connection stays out of the launcher's shutdown. Registered at the first in_order call, it
        runs before the exit handlers registered earlier (torch's, accelerate's), and every exit
        handler runs before the interpreter finalizes.
        """
        self.release()
        with self.lock:
            if self._gather is not None:
                self._gather.close()
            self._store = self._barrier = None


SESSION = InOrderSession()
