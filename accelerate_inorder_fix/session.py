"""This process's in_order session: the job's mode, the store of the current process group, each site's count.

One call: the wrapper makes an `_call.InOrderCall` and hands it to `InOrderSession.call`, which logs it at
once on a process that is not a rank of the job's default process group (a child forked while that group
existed: a DataLoader worker), or else numbers it at its site and hands it to its mode's side, opened
once per process group (`barrier.side.BarrierSide`, `gather.collector.GatherSide`). A session lives as long as
its process group: `destroy_process_group()` ends it (gather mode's keys deleted), the next group opens a new one
under a key prefix of its own. The mode is fixed once per job: the main process writes its word (mode
and prefix) when its process group starts (a hook on `init_process_group`; else at its first in_order
call), every other rank reads it at its first in_order call, waiting at most the call's T.
The rules for threads, forks, launchers and stores: docs/promises.md.
"""

from __future__ import annotations

import atexit
import collections
import os
import re
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any, Callable, Optional, Protocol

from ._call import InOrderCall, emit_at_once
from ._callsite import Site
from ._diagnostics import warn_once
from ._origin import Origin
from .barrier.side import BarrierSide
from .barrier.turns import PlainBarriers
from .config import COLLAPSE_ENV, MODE_ENV, MODES, SETTINGS, TIMEOUT_ENV, Settings, spans_hosts, speaks_for_host
from .gather.collector import GatherSide
from .store import connection, teardown
from .store.connection import Connection
from .store.hooks import TorchHook


WORD_KEY = "session"  # the main process's word, `<mode> <prefix>`, under `connection.PREFIX`
OpenStore = Callable[[float], tuple[Optional[Connection], Optional[str]]]


class Side(Protocol):
    """What takes a call: a mode's side, `Side(store, rank, world_size)`, whose `call` and `close` (if it has
    one) never raise; or `PlainBarriers`."""

    def call(self, call: InOrderCall) -> None: ...


class InOrderSession:
    """This process's in_order state: its mode, the session of the current process group, each site's count.

    Args:
        open_store (`Callable[[float], tuple[Connection | None, str | None]]`, *optional*): how to reach
            the job's store (`store.connection.open_store`; `testing` hands in an in-memory one).
        default_group (`Callable[[], object | None]`, *optional*): the default process group now
            (`store.connection.default_group`).
    """

    def __init__(
        self,
        open_store: OpenStore = connection.open_store,
        default_group: Callable[[], Optional[object]] = connection.default_group,
    ) -> None:
        self._open_store, self._default_group = open_store, default_group
        self._lock = threading.Lock()  # the fields below; held across a store wait only while a session opens
        self._site_locks: collections.defaultdict[Site, threading.RLock] = collections.defaultdict(threading.RLock)
        self._counts: collections.Counter[Site] = collections.Counter()
        self._group: Optional[object] = None  # the process group of the open session
        self._base: Optional[Connection] = None  # the job's store, where the main process's word is
        self._store: Optional[Connection] = None  # the same, under this session's prefix
        self._side: Optional[Side] = None
        self._main = False
        self._mode: Optional[str] = None  # the main process's word, once read
        self._setting: Optional[str] = None  # this process's own setting then
        self._origin: Optional[Origin] = None
        self.member = True  # False in a child forked while its parent's process group existed
        self._closed = False  # at exit: calls are logged at once
        self._inherited: tuple[Any, ...] = ()  # a forked child's copy of its parent's store objects: never used

    def call(self, state: Any, settings: Settings, call: InOrderCall) -> None:
        """One in_order call of this process: numbered at its site and taken by its mode's side, or logged at once."""
        side = self.side(state, settings, call.timeout)
        if side is None and not self.member:
            warn_once("a forked process logs its in_order records at once, unordered (it is not a rank of the job)")
        if side is None and self._group is None:
            emit_at_once(call)
            return
        with self._site_locks[call.site]:  # re-entrant: a handler may log at the same site
            with self._lock:
                self._counts[call.site] += 1
                call.count = self._counts[call.site]
            if side is None:  # no word from the main process yet: numbered all the same, as the main's call is
                emit_at_once(call)
            else:
                side.call(call)

    def side(self, state: Any, settings: Settings, timeout: float) -> Optional[Side]:
        """The side of the current process group's session, opened now if need be; None: log at once.

        Args:
            timeout: the call's T: how long a rank waits for the main process's word, if it must.
        """
        if state.num_processes <= 1 or not self.member or self._closed:
            return None
        group = self._default_group()
        with self._lock:
            if group is None:
                return PlainBarriers(state)  # no c10d process group: upstream's own barriers
            if group is not self._group:
                self._end()
            if self._side is None:
                self._open(group, state, settings, timeout)
            side = self._side
        self._check_setting(state, settings)
        return side

    def started(self) -> None:
        """The default process group is up (`init_process_group` returned): the main process opens its session
        now, so its word is in the store before any rank's first in_order call (none waits for the main's)."""
        import torch.distributed as dist

        state = SimpleNamespace(process_index=dist.get_rank(), num_processes=dist.get_world_size())
        state.is_main_process = state.process_index == 0
        if state.is_main_process and state.num_processes > 1 and self.member and not self._closed:
            self.side(state, SETTINGS, 0.0)

    def _open(self, group: object, state: Any, settings: Settings, timeout: float) -> None:
        """This process group's session: the main process's word, its keys' prefix, the side of its mode."""
        base, reason = self._open_store(settings.timeout())
        if base is None:
            warn_once(f"in_order calls use plain barriers: {reason}")
            self._group, self._side = group, PlainBarriers(state)
            return
        word = self._word(base, state, settings, timeout)
        if word is None:
            self._group = group  # this call is logged at once (and counted); the next one looks for the word again
            return
        mode, prefix = word
        self._group, self._base, self._store = group, base, base.under(prefix)
        self._main = state.is_main_process
        rank, world_size = state.process_index, state.num_processes
        if mode == "gather":
            self._side = GatherSide(self._store, rank, world_size)
        else:
            self._side = BarrierSide(self._store, rank, world_size)
            if not self._main:
                self._side.logged_before_the_word(self._counts)
        atexit.unregister(self.close)
        atexit.register(self.close)  # registered after torch's and accelerate's exit handlers: runs before them
        teardown.on_destroy(self.end)

    def _word(self, base: Connection, state: Any, settings: Settings, timeout: float) -> Optional[tuple[str, str]]:
        """`(mode, prefix)`: the main process writes its own, every other rank reads it (waiting up to `timeout`)."""
        own, rank = self._mode or settings.mode(), state.process_index
        if state.is_main_process:
            word = (own, uuid.uuid4().hex[:12])
            try:
                base.set(WORD_KEY, " ".join(word))
            except Exception as exc:  # the store failed: nobody can read it
                warn_once(f"could not write the in_order mode to the job's store ({exc!r}); logging at once")
                return None
        else:
            try:
                blob = connection.read_until(base, WORD_KEY, time.monotonic() + timeout, timeout)
            except Exception as exc:  # the store failed
                blob = None
                warn_once(f"rank {rank}: could not read the main process's in_order mode ({exc!r})")
            if blob is None:
                warn_once(
                    f"rank {rank}: no word from the main process within {timeout:g} s ({TIMEOUT_ENV}); this rank "
                    "logs its in_order records at once until there is one",
                    key=("word", rank),
                )
                return None
            read = read_word(blob)
            if read is None:
                warn_once(
                    f"rank {rank}: the main process's in_order word in the job's store is not one ({blob[:40]!r}); "
                    "this rank logs its in_order records at once, unordered",
                    key=("word", "bad"),
                )
                return None
            word = read
            if word[0] != own:
                warn_once(
                    f"rank {rank}: in_order mode setting {own!r} (from {settings.mode_source()}) differs from the "
                    f"main process's; using the main process's mode, {word[0]}"
                )
        if self._mode is None:
            self._mode, self._setting = word[0], settings.mode()
        return word

    def _check_setting(self, state: Any, settings: Settings) -> None:
        """A mode set after the job's was fixed: said once, not taken. Collapse in barrier mode: said once a host
        (read at every call, so that a bad value of it is said on every host as the others are)."""
        if settings.collapse() and self._mode == "barrier" and speaks_for_host():
            warn_once(
                f"collapse ({COLLAPSE_ENV} or configure(collapse=True)) applies to gather mode only; "
                "in barrier mode each rank prints its own records",
                key=("collapse", "barrier"),
            )
        if self._setting is not None and settings.mode() != self._setting:
            warn_once(
                f"rank {state.process_index}: the in_order mode ({MODE_ENV} or configure(mode=...)) changed to "
                f"{settings.mode()!r} after this job's mode was fixed, when its process group started "
                f"(inside Accelerator(): set the mode before it); it stays {self._mode}",
                key=("mode", "fixed"),
            )

    @property
    def mode(self) -> Optional[str]:
        """The job's mode, once this process read it (the main process's word, written when its group started)."""
        return self._mode

    @property
    def current_side(self) -> Optional[Any]:
        """The open session's `BarrierSide` or `GatherSide` (None without one): for `testing.side`."""
        return self._side

    def origin(self, state: Any) -> Origin:
        """This process's rank and host, for its in_order records (the host as named at its first call)."""
        origin = self._origin
        if origin is None or origin.rank != state.process_index:
            origin = self._origin = Origin.of(state.process_index, spans_hosts())
        return origin

    def end(self) -> None:
        """End the current process group's session (before `destroy_process_group`): its side closed, its
        keys deleted. The next process group opens a new one."""
        with self._lock:
            self._end()

    def _end(self) -> None:
        side, base, store = self._side, self._base, self._store
        self._side = self._base = self._store = self._group = None
        self._counts.clear()
        close = getattr(side, "close", None)  # a barrier side without one keeps no thread
        if close is not None:
            close()
        if base is not None and self._main:
            try:
                base.delete_key(WORD_KEY)
            except Exception:  # noqa: BLE001 -- the store's server has gone, its keys with it
                pass
        for opened in (store, base):
            if opened is not None:
                opened.close()

    def close(self) -> None:
        """At exit: end the session; later in_order calls are logged at once (a rank may have gone)."""
        with self._lock:
            self._closed = True
            self._end()

    def after_fork_in_child(self) -> None:
        """In a forked child: fresh locks and no session. A rank of its parent's process group it is not,
        when that group existed at the fork (a DataLoader worker); a process forked before is (a launcher's)."""
        inherited = (self._base, self._store, self._side, self._inherited)
        member = self._default_group() is None
        self.__init__(self._open_store, self._default_group)  # type: ignore[misc]
        self._inherited, self.member = inherited, member

    def reset(self) -> None:
        """Close, and start again as a new session (`testing.reset`)."""
        self.close()
        atexit.unregister(self.close)
        teardown.HOOK.forget(self.end)
        STARTED.forget(self.started)
        self.__init__(self._open_store, self._default_group)  # type: ignore[misc]


def read_word(blob: bytes) -> Optional[tuple[str, str]]:
    """`(mode, prefix)` of the main process's word `<mode> <prefix>`; None when `blob` is not such a word."""
    parts = blob.decode("utf-8", "replace").split(" ")
    if len(parts) != 2 or parts[0] not in MODES or not re.fullmatch(r"[0-9a-f]{12}", parts[1]):
        return None
    return parts[0], parts[1]


SESSION = InOrderSession()
os.register_at_fork(after_in_child=SESSION.after_fork_in_child)


def _after_init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    for started in STARTED.callbacks():
        try:
            started()
        except Exception as exc:  # never into the caller's start-up: the first in_order call writes the word
            warn_once(f"could not open the in_order session at start-up: {exc!r}", key=("started", type(exc)))
    return result


STARTED = TorchHook("init_process_group", _after_init)


def watch_start(session: InOrderSession = SESSION) -> None:
    """Open `session` as soon as a default process group is up: now if one is, and after each `init_process_group`.

    A name bound earlier (`from torch.distributed import init_process_group`) keeps the original: the main
    process then writes its word at its first in_order call, and a rank's first call may wait for it (T at most).
    """
    STARTED.add(session.started)
    if session._default_group() is not None:
        _after_init(lambda: None, None, (), {})
