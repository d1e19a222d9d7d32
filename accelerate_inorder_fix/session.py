"""This process's in_order state: the mode the job agreed on, call counts, and the side of that mode.

One call: the wrapper makes it (`_call.InOrderCall`) and hands it to `InOrderSession.call`, which only
chooses: the mode every rank agreed on (`mode`), the call's number at its site in that mode, and the
side that takes it (`side`): `barrier.side.BarrierSide.call` or `gather.side.GatherSide.call`, or, for
a process that cannot check in, plain barriers or an emit at once (`barrier.turns`).

Mode agreement. Ranks that disagree on the mode cannot work together (check-ins and turns on some ranks, store
posts on others). So at its first in_order call every rank takes the main process's mode, through the
job's c10d store: the main process writes its word, every other rank reads it. A rank whose own setting
differs says so in one line. A later `configure(mode=...)`, or a change of `ACCELERATE_INORDER_MODE`, is
a switch: the main process takes it at once and writes its word again (`mode.switch_key`); another rank
takes it at its next call once the main process's word for that switch says the same, so every rank
switches at the same call. A rank that switched alone (the main process did not switch within the
timeout) keeps the job's mode and says so once: no record is sent where nobody collects it.

Waits. An agreement (or switch) wait and the check-in after it share one deadline, T after the call
began (`InOrderCall.deadline`): a call some rank skips costs T there, not 2 T, even the first one (the divergence, all sites of
its step together, at most `bounds.DIVERGENCE`, 1.5 T).

Each mode has its side, opened at its first call on the same store connection: `barrier.side.BarrierSide`
(the check-in and the turns) and `gather.side.GatherSide` (posts or collection). A call's identity, its site
and how many times this process has called from there in its mode, is counted here, once, for both:
each mode numbers its own calls (the check-in's keys and gather's blocks each count from 1).

Threads: the in_order calls of one process take turns (`lock`), in both modes, so one call's N
turns, or its capture and post, never interleave with another thread's.

Jobs with no c10d store (a backend torch.distributed does not run) skip the agreement and the
check-in (plain barriers, as upstream), and a gather setting falls back to barrier mode with one
warning. A forked process (a DataLoader worker) is not a rank, whenever it was forked: it logs its
in_order records itself, at once, with a lock and state of its own (`os.register_at_fork`). After the
session closed at exit, in_order calls are logged at once too: plain barriers there could wait for a
rank that has gone (or is busy in its own exit handlers) until the process group's timeout.
`SESSION` is the process's one session.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from ._call import InOrderCall
from ._callsite import Site
from ._diagnostics import CallWarning, warn_once
from ._origin import Origin
from .barrier.side import BarrierSide
from .barrier.turns import AT_ONCE, PlainBarriers
from .config import MODE_ENV, SETTINGS, Settings, note_collapse_in_barrier_mode, spans_hosts
from .gather.side import GatherSide, print_in_child
from .store import connection, mode, teardown
from .store.connection import Store


class Side(Protocol):
    """What takes one in_order call in the mode chosen for it (`BarrierSide`, `GatherSide`, ...)."""

    def call(self, call: InOrderCall) -> None: ...


class _InChild:
    """A forked child's gather-mode call: printed in the child (`gather.side.print_in_child`)."""

    def call(self, call: InOrderCall) -> None:
        print_in_child(call)


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
        # After a failure: the job's own store only if its server answers (a dead one would hold a clone).
        self._reopen_store = connection.reopen_store if open_store is connection.open_store else open_store
        # (this process's setting then, its configure() generation then, the mode in use)
        self._agreement: Optional[tuple[str, int, str]] = None
        self._switches = 0  # mode switches since the agreement: the main process's word for each (`mode`)
        self._deadline: Optional[float] = None  # the current call's, when its agreement waited (`mode`)
        self._store: Optional[Store] = None
        self._world_size = 0  # the job's processes, known once the store is open (`close` counts itself out)
        self._store_reason: Optional[str] = "no in_order call yet"
        self._counts: collections.Counter[tuple[str, Site]] = collections.Counter()  # (mode, site): calls there
        self._barrier: Optional[BarrierSide] = None
        self._gather: Optional[GatherSide] = None
        self._gather_tried = False  # a gather side is opened once; without a store, never
        self._origin: Optional[Origin] = None  # this process's rank and host (`origin`)
        self._child = False  # a forked child of this process's rank: not a rank itself
        self._closed = False  # `close` ran (at exit): in_order calls log at once
        self._inherited: tuple[Any, ...] = ()  # a child's copy of its parent's store objects: kept, never used
        self._started: Optional[tuple[str, int]] = None  # this process's setting when the process group started
        self._unconfirmed = False  # agreed on the main process's word from the start; its first call's not read yet
        _reset_in_forked_children(self)

    # -- which mode -------------------------------------------------------------------------

    # -- one call -----------------------------------------------------------------------------

    def call(self, state: Any, settings: Settings, call: InOrderCall) -> None:
        """One in_order call of this process (a rank of a job of several): taken by its mode's side."""
        with self.lock:
            self.side(state, settings, call).call(call)

    def side(self, state: Any, settings: Settings, call: InOrderCall) -> Side:
        """What takes `call`: the side of the mode every rank agreed on, with the call numbered at its site in
        that mode and its deadline set (when its agreement waited); or, for a process that cannot check in,
        what logs it without a store: plain barriers (no store), at once (a forked child, or after `close`).
        """
        with self.lock:
            agreed = self.mode(state, settings, call)
            if self._child:  # not a rank: the store connection is its parent's
                if agreed == "gather":
                    return _InChild()
                warn_once("a forked process logs its in_order records at once, without barriers (it is not a rank)")
                return AT_ONCE
            call.count = self._count(agreed, call.site)
            if agreed == "gather" and self._gather is not None:  # `mode` says gather only with a side
                return self._gather
            note_collapse_in_barrier_mode()
            if self._closed:
                warn_once("in_order calls after this process's exit began are logged at once, without barriers")
                return AT_ONCE
            if self._store is None:
                return PlainBarriers(state)
            if self._barrier is None:
                self._barrier = BarrierSide(self._store, state.process_index, state.num_processes, self._reconnect)
            return self._barrier

    def _count(self, agreed: str, site: Site) -> int:
        """This process's number for its next call at `site` in mode `agreed`: with the site, the call's identity.
        Each mode numbers its own calls: a mode switch starts the other mode's count where it left it."""
        self._counts[(agreed, site)] += 1
        return int(self._counts[(agreed, site)])

    # -- which mode -------------------------------------------------------------------------

    def mode(self, state: Any, settings: Settings, call: Optional[InOrderCall] = None) -> str:
        """'barrier' or 'gather': the mode of this in_order call, the same on every rank.

        Args:
            call (`InOrderCall`, *optional*): the call; when its agreement (or switch) waited, its
                `deadline`, which its check-in keeps.
        """
        with self.lock:
            self._deadline = None
            agreed = self._agreed_mode(state, settings)
            if call is not None:
                call.deadline = self._deadline
            return agreed

    def _agreed_mode(self, state: Any, settings: Settings) -> str:
        own = settings.mode()
        if self._child:  # not a rank: its parent's mode, if agreed (`side`: logged without the store)
            return own if self._agreement is None else self._agreement[2]
        if self._closed:  # at exit: nothing to agree through (`side`: logged at once)
            return "barrier"
        agreement = self._agreement
        if agreement is None:
            self._deadline = time.monotonic() + settings.timeout()
            agreement = self._agreement = (own, settings.mode_generation, self._agree(state, settings, own))
        setting, generation, agreed = agreement
        if self._unconfirmed:
            agreed = self._confirm(state, agreed)
            agreement = self._agreement = (setting, generation, agreed)
        if own != setting or settings.mode_generation != generation:  # a switch: taken where the main takes it
            self._deadline = self._deadline or time.monotonic() + settings.timeout()
            agreed = self._switch(state, settings, own, agreed)
            self._agreement = (own, settings.mode_generation, agreed)
        if agreed == "gather" and self._gather_side(state, settings) is None:
            return "barrier"
        return agreed

    def _wait_left(self) -> float:
        """Seconds left to this call's deadline (0 when it has passed)."""
        return max(0.0, (self._deadline or 0.0) - time.monotonic())

    def _agree(self, state: Any, settings: Settings, own: str) -> str:
        """One bounded round trip through the job's store: the main process's mode, on every rank."""
        store, self._store_reason = self._open_store(settings.timeout())
        if store is None:
            return own
        self._store, self._world_size = store, state.num_processes
        atexit.register(self.close)
        teardown.on_destroy(self.release)
        rank = state.process_index
        try:
            if state.is_main_process:
                mode.publish_mode(store, own)
                self._changed_since_start(state, settings, own)
                return own
            main = mode.read_mode(store, 0.0)  # the main process's first call came first: no wait
            if main is None and self._started == (own, settings.mode_generation):
                # Nothing changed here since the start: take the main process's word from then (written
                # right after its own start, before its first call: a wait of milliseconds at most).
                main = mode.read_mode(store, self._wait_left(), mode.STARTED)
                self._unconfirmed = main is not None
            if main is None:
                main = mode.read_mode(store, self._wait_left())
        except Exception as exc:  # the store failed: nothing to agree through
            warn_once(f"rank {rank}: could not read the main process's in_order mode ({exc!r}); using {own} mode")
            return own
        if main not in ("barrier", "gather"):
            warn_once(
                f"rank {rank}: the main process did not publish its in_order mode within {settings.timeout():g} s "
                f"(ACCELERATE_INORDER_TIMEOUT); using this rank's setting, {own} mode"
            )
            return own
        if main != own:
            warn_once(
                f"rank {rank}: in_order mode setting {own!r} (from {settings.mode_source()}) differs from the "
                f"main process's; using the main process's mode, {main}"
            )
        return main

    def watch_start(self) -> None:
        """Note the mode as soon as the job's process group is up (`process_group_started`)."""
        mode.on_start(self.process_group_started)

    def process_group_started(self) -> None:
        """The job's process group is up: note this process's setting; the main process writes it to the store.

        A rank whose setting has not changed since then takes that word at its first in_order call, without
        waiting for the main process to make one (a call the main process skips costs a post nothing).
        """
        with self.lock:
            if self._agreement is not None or self._child or self._started is not None:
                return
            self._started = (SETTINGS.mode(), SETTINGS.mode_generation)
            mode.publish_started(self._started[0])

    def _changed_since_start(self, state: Any, settings: Settings, own: str) -> None:
        """Main process, first call: its setting changed since the word it wrote at the start. A rank that did not
        change its own may have taken that word (`_confirm` corrects it): if it was gather, keep a collector for
        what such a rank posted meanwhile (emitted at exit at the latest)."""
        if self._started is not None and self._started[0] == "gather" != own:
            self._gather_side(state, settings)

    def _confirm(self, state: Any, agreed: str) -> str:
        """A rank that agreed on the main process's word from the start: once the main process's first call's word
        is there (one read per call until then), follow it if it differs, and say so once."""
        try:
            main = mode.read_mode(self._store, 0.0)
        except Exception:  # noqa: BLE001 -- the store failed: the word from the start stands
            main = agreed
        if main is None:
            return agreed
        self._unconfirmed = False
        if main != agreed and main in ("barrier", "gather"):
            warn_once(
                f"rank {state.process_index}: the main process changed its in_order mode from {agreed} to {main} "
                "alone, after the job's process group started; following it from this call (a mode change must be "
                "made on every rank)"
            )
            return main
        return agreed

    def _switch(self, state: Any, settings: Settings, own: str, current: str) -> str:
        """This process's setting changed since its last call: the mode from this call on.

        The main process switches at once and writes its word for the switch. Another rank waits for
        that word (until this call's deadline) and takes the main process's mode; without it (the
        switch was made on this rank alone) it keeps `current`, says so once, and does not count it:
        a later switch made on every rank pairs with the main process's word again.
        """
        self._switches += 1
        store, rank = self._store, state.process_index
        if store is None:  # no agreement was possible: every rank follows its own setting
            return own
        try:
            if state.is_main_process:
                mode.publish_mode(store, own, self._switches)
                return own
            main = mode.read_mode(store, self._wait_left(), self._switches)
        except Exception as exc:  # the store failed: the switch cannot be agreed on
            main = None
            warn_once(f"rank {rank}: could not read the main process's in_order mode ({exc!r})")
        if main in ("barrier", "gather"):
            return main
        self._switches -= 1  # not made on the main process: its next switch is still this number
        warn_once(
            CallWarning(
                "",  # the site is not known here: the switch shows at the first call after it
                (rank,),
                f"switched to {own} mode (configure(mode=...) or {MODE_ENV}) and the main process did not within "
                f"{settings.timeout():g} s (ACCELERATE_INORDER_TIMEOUT)",
                settings.timeout(),
                f"the switch is refused: this rank keeps the job's in_order mode, {current}",
                "a mode switch must be made on every rank, before the same in_order call",
            )
        )
        return current

    # -- what both modes share --------------------------------------------------------------

    def forked(self) -> bool:
        """True in a forked child of a rank (forked before its first in_order call or after): it is not a rank."""
        return self._child

    def after_fork_in_child(self) -> None:
        """In a forked child: a lock of its own (a parent's thread may have held the parent's), no store.

        The parent's store objects are kept, never used nor closed: their sockets are the parent's.
        """
        self.lock = threading.RLock()
        self._child = True
        self._inherited = (self._store, self._barrier, self._gather, self._inherited)
        self._store = self._barrier = self._gather = None
        self._gather_tried = True

    def _reconnect(self) -> Store:
        """A fresh store connection, after one failed: the check-in's (`CheckIn.reconnect`), a post's
        (`GatherSide`).

        Opened as the first one was, with the timeout in effect now: its own timeout is that plus 5 s,
        never the process group's; and only if the store's server answers within it (`connection.reopen_store`).
        """
        store, reason = self._reopen_store(SETTINGS.timeout())
        if store is None:
            raise RuntimeError(reason)
        return store

    def origin(self, state: Any) -> Origin:
        """This process's rank and host, for its in_order records (the host as named at its first call)."""
        origin = self._origin
        if origin is None or origin.rank != state.process_index:
            origin = self._origin = Origin.of(state.process_index, spans_hosts())
        return origin

    # -- gather mode ------------------------------------------------------------------------

    def _gather_side(self, state: Any, settings: Settings) -> Optional[GatherSide]:
        if not self._gather_tried:
            with self.lock:
                if not self._gather_tried:
                    if self._store is None:
                        warn_once(
                            f"gather mode needs a torch.distributed c10d store ({self._store_reason}); using barrier mode"
                        )
                    else:
                        self._gather = GatherSide(self._store, state.process_index, state.num_processes)
                    self._gather_tried = True
        return self._gather

    # -- the end of the job -----------------------------------------------------------------

    def release(self) -> None:
        """Stop and join this process's background store threads; they must not outlive the job's teardown.

        Called before the default process group is destroyed (`teardown`) and at exit (`close`). A
        thread still inside a store call when the interpreter finalizes aborts the process
        (`store.writer`). Each wait is bounded by the store connection's timeout; the session itself
        stays usable (a later gather-mode post is delivered, not cleaned up).
        """
        with self.lock:  # gather mode runs no thread of its own any more
            return

    def close(self) -> None:
        """At exit. Main process: emit what was delivered, seal the queues. Every rank: stop our threads, drop our store.

        Done here, while the store's server is certainly up, rather than at interpreter teardown, so
        our connection stays out of the launcher's shutdown. Registered at the first in_order call, it
        runs before the exit handlers registered earlier (torch's, accelerate's), and every exit
        handler runs before the interpreter finalizes.
        """
        self.release()
        with self.lock:
            self._closed = True
            if self._gather is not None:
                self._gather.close()
            store, self._store, self._barrier = self._store, None, None
            if store is not None and self._world_size:
                try:
                    mode.close_words(store, self._world_size)
                except Exception:  # the store's server has gone (its host exited first), its keys with it
                    return

    def reset(self) -> None:
        """Close, let go of atexit and torch's teardown hook, and start again as a new session
        (`accelerate_inorder_fix.testing.reset`: the next test's process is a new one)."""
        self.close()
        atexit.unregister(self.close)
        teardown.HOOK.forget(self.release)
        mode.HOOK.forget(self.process_group_started)
        vars(self).update(vars(InOrderSession(self._open_store)))


def _reset_in_forked_children(session: InOrderSession) -> None:
    """Make `session` a forked child's own in every child forked from now on (`after_fork_in_child`)."""
    ref = weakref.ref(session)

    def in_child() -> None:
        alive = ref()
        if alive is not None:
            alive.after_fork_in_child()

    os.register_at_fork(after_in_child=in_child)


SESSION = InOrderSession()
