"""The main process's in_order mode, written to the job's store and read by every rank.

One word per agreement: `mode/started` as soon as the job's process group is up (`on_start`), `mode` at
the main process's first in_order call, `mode/<n>` at its n-th switch (`switch_key`). A few bytes each,
one per switch: the store stays bounded, and the last process to exit deletes them (`close_words`). The first is what lets a rank's first call take the main
process's mode without waiting for the main process to make that call.
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, Callable, Optional

from .._diagnostics import warn_once
from .connection import SHORTEST_WAIT, Store
from .errors import is_timeout
from .hooks import TorchHook


MODE_KEY = "mode"
CLOSED_KEY = "mode/closed"  # how many of the job's processes have closed their session (`close_words`)
STARTED = -1  # the `switch` of the word written when the process group started (`publish_started`)


def switch_key(switch: int) -> str:
    """The key of the main process's word at its `switch`-th mode switch (0: the first call's agreement;
    `STARTED`: when the process group started)."""
    if switch == STARTED:
        return f"{MODE_KEY}/started"
    return MODE_KEY if switch == 0 else f"{MODE_KEY}/{switch}"


def publish_mode(store: Store, mode: str, switch: int = 0) -> None:
    """The main process's mode word, for every rank's first in_order call (or its `switch`-th switch)."""
    store.set(switch_key(switch), mode)


def close_words(store: Store, world_size: int) -> None:
    """At a process's exit (its session closing): count it; the job's last process deletes the mode words.

    Every rank reads a word only before its session closes (its first call, a switch), so once all
    `world_size` have closed nobody reads one again: the store keeps no key of this module after the job.
    A process that never made an in_order call never counts, and the words stay (a few bytes).
    """
    if store.add(CLOSED_KEY, 1) < world_size:
        return
    for key in (switch_key(STARTED), MODE_KEY, CLOSED_KEY):
        store.delete_key(key)
    switch = 1
    while store.delete_key(switch_key(switch)):  # the main process wrote them in order, from 1
        switch += 1


def read_mode(store: Store, seconds: float, switch: int = 0) -> Optional[str]:
    """The main process's mode word, waiting up to `seconds`; None when it did not come in time (a store
    that fails otherwise raises: its callers say so).

    Ranks wait on these keys, so they are never `peek`ed (a `compare_set` wakes a key's waiters, and the
    woken rank would read a word that is not there): `check` wakes nobody. A wait shorter than
    `SHORTEST_WAIT` is none (c10d reads a wait under 1 ms as no timeout at all).
    """
    key = switch_key(switch)
    deadline = time.monotonic() + seconds
    while not store.check([key]):
        left = deadline - time.monotonic()
        if left < SHORTEST_WAIT:
            return None
        try:
            store.wait([key], datetime.timedelta(seconds=left))
        except RuntimeError as exc:
            if is_timeout(exc):
                return None
            raise
    return bytes(store.get(key)).decode()


def _after_init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    _run_started()
    return result


def _run_started() -> None:
    for callback in HOOK.callbacks():
        try:
            callback()
        except Exception as exc:  # never into the caller's start-up
            warn_once(f"could not note the in_order mode at start-up: {exc!r}", key=("started", type(exc)))


HOOK = TorchHook("init_process_group", _after_init)


def on_start(callback: Callable[[], None]) -> None:
    """Call `callback` once the default process group is up: now if it is, else after `init_process_group`.

    A name bound earlier (`from torch.distributed import init_process_group`) keeps the original: the
    first in_order call then agrees as it would without this (waiting for the main process's word).

    Args:
        callback: notes this process's mode setting (`InOrderSession.process_group_started`).
    """
    HOOK.add(callback)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _run_started()


def publish_started(mode: str) -> None:
    """On the main process (global rank 0): its mode word now, on the process group's own connection (one `set`)."""
    import torch.distributed as dist

    from .connection import process_group_connection

    store = process_group_connection()
    if store is not None and dist.get_rank() == 0:
        store.set(switch_key(STARTED), mode)
