"""The main process's in_order mode, written once to the job's store and read by every rank."""

from __future__ import annotations

import datetime
from typing import Optional

from .connection import Store


MODE_KEY = "mode"


def publish_mode(store: Store, mode: str) -> None:
    """The main process's mode word, for every rank's first in_order call."""
    store.set(MODE_KEY, mode)


def read_mode(store: Store, seconds: float) -> Optional[str]:
    """The main process's mode word, waiting up to `seconds`; None when it did not come in time."""
    try:
        store.wait([MODE_KEY], datetime.timedelta(seconds=seconds))
    except RuntimeError:  # DistStoreError on timeout
        return None
    return bytes(store.get(MODE_KEY)).decode()
