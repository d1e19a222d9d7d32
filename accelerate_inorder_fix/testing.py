"""Test in_order logging in one process: an in-memory store, simulated ranks, the live side, and one reset.

`reset()` puts this package back as `import accelerate_inorder_fix` left it: the process's session
ended and let go of (atexit, torch's hook), `configure()` forgotten, warnings not yet said, the patch as
the environment asks. Call it between tests that configure the package or make in_order calls.
`side()` is this process's open side (`BarrierSide` or `GatherSide`, None before its first in_order call
of a process group): a job test's look at what the package opened, without reaching into the session.

`InMemoryStore` stands in for the part of torch's c10d `Store` that this package uses (thread-safe; a
blocking call waits on a condition with its timeout, and raises `StoreTimeout` at its deadline; it
imports no torch). `simulated_ranks(n)` gives n ranks of one job in this process, each with a session of
its own on one such store: what the ranks agree on, without launching processes.

    from accelerate_inorder_fix import testing
    from accelerate_inorder_fix.config import Settings

    settings = Settings()
    settings.configure(mode="gather")
    main, other = testing.simulated_ranks(2)
    assert main.mode(settings) == "gather"      # the main process's word goes to the store first
    assert other.mode(Settings()) == "gather"   # another rank takes it (and says its own setting differs)
    for rank in (main, other):
        rank.close()
    testing.reset()

The ordering of records across ranks is a property of real processes: the package's job tests prove
it on real jobs; an in-memory store proves logic, not delivery.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from ._diagnostics import DIAGNOSTICS
from ._patcher import PATCHER, auto_patch
from .config import SETTINGS, Settings
from .session import SESSION, STARTED, InOrderSession
from .store import teardown
from .store.connection import Connection


__all__ = [
    "InMemoryStore",
    "SimulatedRank",
    "StoreTimeout",
    "UnbatchedInMemoryStore",
    "reset",
    "side",
    "simulated_ranks",
]

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

    def prefixed(self, prefix: str) -> _Prefixed:
        """This store with `prefix` before every key (as torch's `PrefixStore`)."""
        return _Prefixed(self, prefix)


class _Prefixed:
    """A store's calls, with `prefix` before every key they name."""

    def __init__(self, store: UnbatchedInMemoryStore, prefix: str) -> None:
        self._store, self._prefix = store, prefix

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        prefix = self._prefix

        def prefixed(keys: Any, *rest: Any) -> Any:
            named = [prefix + k for k in keys] if isinstance(keys, (list, tuple)) else prefix + keys
            return method(named, *rest)

        return prefixed


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
        group: the job's process group (any object, the same for every rank; a new one is a new session).
    """

    def __init__(
        self, process_index: int, num_processes: int, store: UnbatchedInMemoryStore, group: object = None
    ) -> None:
        self.process_index = process_index
        self.num_processes = num_processes
        self.is_main_process = process_index == 0
        self.group = store if group is None else group
        self.session = InOrderSession(lambda timeout: (Connection(store, "", timeout), None), lambda: self.group)

    def mode(self, settings: Settings = SETTINGS) -> Optional[str]:
        """The job's mode as this rank's next in_order call takes it (None: the main process's word did
        not come within the timeout, and the call would be logged at once).

        Args:
            settings: this rank's settings (each rank of a real job has its own process and its own).
        """
        self.session.side(self, settings, settings.timeout())
        return self.session.mode

    def close(self) -> None:
        """End this rank's session as the process's exit would, and let go of it (atexit, torch's hook)."""
        self.session.reset()


def simulated_ranks(n: int, store: Optional[UnbatchedInMemoryStore] = None) -> list[SimulatedRank]:
    """`n` ranks of one job on one in-memory store (a new `InMemoryStore` unless `store` is given).

    Args:
        n: the job's size.
        store: the job's store, to inspect it or to hand in an `UnbatchedInMemoryStore`.
    """
    shared = InMemoryStore() if store is None else store
    return [SimulatedRank(r, n, shared) for r in range(n)]


def side() -> Optional[Any]:
    """This process's open side: its `BarrierSide` or `GatherSide`; None when no session is open."""
    return SESSION.current_side


def reset() -> None:
    """Put this package back in its import-time state, for the next test.

    The process's session ended and new (nothing registered with atexit or torch's hook), every
    `configure()` forgotten, every warning unsaid, and the patch as `import accelerate_inorder_fix`
    made it (on unless `ACCELERATE_INORDER_FIX` says off).
    """
    SESSION.reset()
    teardown.HOOK.reset()
    STARTED.reset()
    SETTINGS.reset()
    DIAGNOSTICS.reset()
    PATCHER.unpatch()
    auto_patch()
