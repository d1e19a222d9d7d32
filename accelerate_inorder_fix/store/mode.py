"""The main process's in_order mode, written to the job's store and read by every rank.

One word per agreement: `mode` at the first in_order call, `mode/<n>` at the main process's n-th switch
(`switch_key`). A few bytes each, one per switch: the store stays bounded.
"""

from __future__ import annotations

import datetime
from typing import Optional

from .connection import SHORTEST_WAIT, Store, peek


MODE_KEY = "mode"


def switch_key(switch: int) -> str:
    """The key of the main process's word at its `switch`-th mode switch (0: the first call's agreement)."""
    return MODE_KEY if switch == 0 else f"{MODE_KEY}/{switch}"


def publish_mode(store: Store, mode: str, switch: int = 0) -> None:
    """The main process's mode word, for every rank's first in_order call (or its `switch`-th switch)."""
    store.set(switch_key(switch), mode)


def read_mode(store: Store, seconds: float, switch: int = 0) -> Optional[str]:
    """The main process's mode word, waiting up to `seconds`; None when it did not come in time.

    A wait shorter than `SHORTEST_WAIT` is none: the word is read if it is there, never waited for
    (c10d reads a wait under 1 ms as no timeout at all).
    """
    key = switch_key(switch)
    if seconds < SHORTEST_WAIT:
        blob = peek(store, key)  # nobody waits on a mode key: waking its waiters costs nothing
        return None if blob is None else blob.decode()
    try:
        store.wait([key], datetime.timedelta(seconds=seconds))
    except RuntimeError:  # DistStoreError on timeout
        return None
    return bytes(store.get(key)).decode()
