"""Test in_order logging in one process: an in-memory store, simulated ranks, and one reset.

`reset()` puts this package back as `import accelerate_inorder_fix` left it: the process's session
closed and let go of (atexit, torch's hooks), `configure()` forgotten, warnings not yet said, the patch
as the environment asks. Call it between tests that configure the package or make in_order calls.

`InMemoryStore` stands in for the part of torch's c10d `Store` that this package uses (thread-safe; a
blocking call waits on a condition with its timeout, and raises `StoreTimeout` at its deadline; it
imports no torch). `simulated_ranks(n)` gives n ranks of one job in this process, each with a session of
its own on one such store: what the ranks agree on, without launching processes.

    from accelerate_inorder_fix import testing
    from accelerate_inorder_fix.config import Settings

    settings = Settings()
    settings.configure(mode="gather")
    main, other = testing.simulated_ranks(2)
    assert main.agree(settings) == "gather"      # the main process's word goes to the store first
    assert other.agree(Settings()) == "gather"   # another rank takes it (and says its own setting differs)
    for rank in (main, other):
        rank.close()
    testing.reset()

The ordering of records across ranks is a property of real processes: the package's job tests prove
it under torchrun; an in-memory store proves logic, not delivery.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from ._diagnostics import DIAGNOSTICS
from ._patcher import PATCHER, auto_patch
from .config import SETTINGS, Settings
from .session import SESSION, InOrderSession
from .store import mode, teardown


__all__ = ["InMemoryStore", "SimulatedRank", "StoreTimeout", "UnbatchedInMemoryStore", "reset", "simulated_ranks"]

Value = Union[bytes, str, int]


class StoreTimeout(RuntimeError):
    """What `wait` and `get` raise at their deadline, in the words of torch's own (`store.errors.is_timeout`)."""


def _bytes(value: Value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _seconds(timeout: Union[datetime.timedelta, float]) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


class UnbatchedInMemoryStore:
    """The calls every torch release's store has (no `append`, `multi_get`, `multi_set`).

    Args:
        timeout: seconds a `get` waits for a missing key (a `wait` without its own timeout too).
    """

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.data: dict[str, bytes] = {}
        self.calls: list[tuple[str, int]] = []  # (method, number of keys): what the code under test asked for
        self._changed = threading.Condition()

    def _log(self, method: str, keys: int = 1) -> None:
        self.calls.append((method, keys))

    def set(self, key: str, value: Value) -> None:
        with self._changed:
            self._log("set")
            self.data[key] = _bytes(value)
            self._changed.notify_all()

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """torch's semantics: set `desired` when the value is `expected` (absent counts as b""); return the value now."""
        expected, desired = _bytes(expected), _bytes(desired)
        with self._changed:
            self._log("compare_set")
            current = self.data.get(key)
            if current == expected or (current is None and expected == b""):
                self.data[key] = desired
                self._changed.notify_all()
                return desired
            return expected if current is None else current

    def _wait_for(self, keys: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if not self._changed.wait_for(
            lambda: all(k in self.data for k in keys), max(0.0, deadline - time.monotonic())
        ):
            missing = sorted(set(keys) - set(self.data))
            raise StoreTimeout(f"wait timeout after {timeout * 1000:.0f}ms, keys: {missing}")

    def get(self, key: str) -> bytes:
        with self._changed:
            self._log("get")
            self._wait_for([key], self.timeout)
            return self.data[key]

    def wait(self, keys: Iterable[str], timeout: Optional[Union[datetime.timedelta, float]] = None) -> None:
        keys = list(keys)
        with self._changed:
            self._log("wait", len(keys))
            self._wait_for(keys, self.timeout if timeout is None else _seconds(timeout))

    def check(self, keys: Sequence[str]) -> bool:
        with self._changed:
            self._log("check", len(keys))
            return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self._changed:
            self._log("delete_key")
            return self.data.pop(key, None) is not None

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            self._log("add")
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def num_keys(self) -> int:
        with self._changed:
            return len(self.data)


class InMemoryStore(UnbatchedInMemoryStore):
    """With the batched calls of torch 2.x stores too: `append`, `multi_get`, `multi_set`."""

    def append(self, key: str, value: Value) -> None:
        with self._changed:
            self._log("append")
            self.data[key] = self.data.get(key, b"") + _bytes(value)
            self._changed.notify_all()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        with self._changed:
            self._log("multi_get", len(keys))
            self._wait_for(list(keys), self.timeout)
            return [self.data[k] for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        with self._changed:
            self._log("multi_set", len(keys))
            for k, v in zip(keys, values):
                self.data[k] = _bytes(v)
            self._changed.notify_all()


class SimulatedRank:
    """One rank of a simulated job: what the package reads of accelerate's state, and a session of its own.

    Args:
        process_index: this rank (0 is the main process).
        num_processes: the job's size.
        store: the job's store, shared by every rank of the job.
    """

    def __init__(self, process_index: int, num_processes: int, store: UnbatchedInMemoryStore) -> None:
        self.process_index = process_index
        self.num_processes = num_processes
        self.is_main_process = process_index == 0
        self.session = InOrderSession(open_store=lambda timeout: (store, None))

    def agree(self, settings: Settings = SETTINGS) -> str:
        """The mode this rank's next in_order call runs in, agreed with the main process through the store.

        Args:
            settings: this rank's settings (each rank of a real job has its own process and its own).
        """
        with self.session.lock:
            return self.session.mode(self, settings)

    def close(self) -> None:
        """End this rank's session as the process's exit would, and let go of it (atexit, torch's hooks)."""
        self.session.reset()


def simulated_ranks(n: int, store: Optional[UnbatchedInMemoryStore] = None) -> list[SimulatedRank]:
    """`n` ranks of one job on one in-memory store (a new `InMemoryStore` unless `store` is given).

    Args:
        n: the job's size.
        store: the job's store, to inspect it or to hand in an `UnbatchedInMemoryStore`.
    """
    shared = InMemoryStore() if store is None else store
    return [SimulatedRank(r, n, shared) for r in range(n)]


def reset() -> None:
    """Put this package back in its import-time state, for the next test.

    The process's session closed and new (nothing registered with atexit or torch's hooks), every
    `configure()` forgotten, every warning unsaid, and the patch as `import accelerate_inorder_fix`
    made it (on unless `ACCELERATE_INORDER_FIX` says off).
    """
    SESSION.reset()
    teardown.HOOK.reset()
    mode.HOOK.reset()
    SETTINGS.reset_to_import()
    DIAGNOSTICS.reset()
    PATCHER.unpatch()
    auto_patch()
