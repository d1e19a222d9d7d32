"""The job's c10d store, as a session's sides use it: its keys under a prefix, a client connection per thread.

Every torch.distributed job has a key-value store (TCPStore, FileStore, HashStore, or a PrefixStore over
one). Both modes talk through it, never through a process group's collectives. A `Connection` puts
every key under `PREFIX` and the session's own prefix, and gives each thread its own client where torch
can clone one (a TCPStore holds its client lock for the whole of a `wait`, so a thread waiting at one
site would stall another's), with our timeout (T + `CLIENT_SLACK`) instead of the process group's.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from .errors import is_timeout


# A c10d store (torch's `Store`, a `PrefixStore` over one, or a test double): typed loosely, since
# torch's stubs do not export `PrefixStore` and a fake store is no subclass of `Store`.
Store = Any

PREFIX = "accelerate_inorder_fix/"
SHORTEST_WAIT = 0.002  # seconds: a shorter wait is none (c10d reads a wait under 1 ms as no timeout at all)
SLICE = 0.125  # of the wait's timeout T: the longest single store wait (`_sliced`)
CLIENT_SLACK = 5.0  # seconds: a cloned client's own timeout is T plus this (`_client_timeout`)
R = TypeVar("R")
UNSET = b"accelerate_inorder_fix:unset"  # compare_set with this as both values reads a key, never waits


class Connection:
    """A store whose keys are under `prefix`, with one client connection per thread (one shared where torch
    cannot clone the store's client, as for FileStore and HashStore, whose waits hold no lock).

    Args:
        store: the job's store (the process group's), or a test's store (which may offer `prefixed(prefix)`).
        prefix: put before every key.
        timeout: seconds, T; a cloned client's own timeout is T + `CLIENT_SLACK`.
    """

    def __init__(self, store: Store, prefix: str, timeout: float) -> None:
        self.store, self.prefix, self.timeout = store, prefix, timeout
        self._local = threading.local()

    def under(self, name: str) -> Connection:
        """The same store, its keys under `name/` within this one's."""
        return Connection(self.store, f"{self.prefix}{name}/", self.timeout)

    def own(self) -> Store:
        """This thread's client, prefixed: made at its first use. Raises `ConnectionError` within our timeout when
        the store's server is gone (a TCPStore client would try to reconnect for the process group's, 30 minutes)."""
        mine = getattr(self._local, "store", None)
        if mine is None:
            self._local.client = _clone(self.store, self.timeout)
            mine = self._local.store = _prefixed(self._local.client or self.store, self.prefix)
        return mine

    def get_within(self, key: str, seconds: float) -> bytes:
        """`get` of `key` waiting at most `seconds` for it (a timeout raises as `wait`'s does): on this thread's own
        client, its timeout set for the call (client-side, no request); on a shared one, a `wait` and a `get`."""
        mine, client = self.own(), self._local.client
        if client is None:  # the job's own client: its timeout is the process group's
            mine.wait([key], datetime.timedelta(seconds=seconds))
            return bytes(mine.get(key))
        client.set_timeout(datetime.timedelta(seconds=seconds))
        try:
            return bytes(mine.get(key))
        finally:
            client.set_timeout(_client_timeout(self.timeout))

    def fresh(self) -> Store:
        """This thread's client made anew, for a thread whose own failed (a failed TCPStore client stays failed)."""
        self._local.store = None
        return self.own()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.own(), name)

    def close(self) -> None:
        """Let go of every thread's client (a FileStore's file is removed only once nobody holds one)."""
        self.store, self._local = None, threading.local()


def open_store(timeout: float) -> tuple[Optional[Connection], Optional[str]]:
    """`(connection, None)` to this job's store under `PREFIX`, or `(None, reason)` when it has no c10d store.

    Args:
        timeout (`float`): seconds, T.
    """
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return None, f"torch.distributed is not available ({exc})"
    if not dist.is_available() or not dist.is_initialized():
        return None, "torch.distributed has no default process group"
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        store = None
    if store is None:
        return None, "the process group has no c10d store"
    return Connection(store, PREFIX, timeout), None


def default_group() -> Optional[object]:
    """The default process group now (None without one): a new one is a new session."""
    dist = sys.modules.get("torch.distributed")
    try:
        return None if dist is None or not dist.is_available() else dist.GroupMember.WORLD
    except AttributeError:
        return None


def hosted_by_rank0(store: Store) -> bool:
    """Whether `store` (a `Connection`, or a store) is a TCPStore whose server runs in rank 0's process, as under
    env://, tcp:// and torch.multiprocessing spawn (not torchrun's, whose agent hosts it): it goes when rank 0 goes."""
    base: Any = getattr(store, "store", store)
    while hasattr(base, "underlying_store"):  # a PrefixStore
        base = base.underlying_store
    return type(base).__name__ == "TCPStore" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def peek(store: Store, key: str) -> Optional[bytes]:
    """The value of `key`, or None when it has none: never waits, never creates it.

    It does wake the key's waiters (a TCPStore wakes them on any `compare_set`): use it on keys nobody
    waits on, or where a waiter checks again.
    """
    blob = bytes(store.compare_set(key, UNSET, UNSET))
    return None if blob == UNSET else blob


def wait_until(
    store: Store, keys: list[str], deadline: float, timeout: float, clock: Callable[[], float] = time.monotonic
) -> bool:
    """Whether every key in `keys` is in the store by `deadline` (on `clock`; T `timeout`): one `wait` while they
    come within a slice (`_sliced`), at the deadline one `check` (it wakes nobody). Raises what the store raises
    but a timeout."""
    came = _sliced(
        lambda seconds: store.wait(keys, datetime.timedelta(seconds=seconds)) or True, deadline, timeout, clock
    )
    return bool(store.check(keys)) if came is None else came


def read_until(
    store: Store, key: str, deadline: float, timeout: float, clock: Callable[[], float] = time.monotonic
) -> Optional[bytes]:
    """The value of `key` once it is in the store by `deadline` (None: it did not come), on a `Connection`: one `get`
    (`get_within`) while it comes within a slice (`_sliced`), at the deadline a `check` (and a `get`). b"": a write
    woke the wait and the key was gone by the read. Raises what the store raises but a timeout."""
    blob = _sliced(lambda seconds: bytes(store.get_within(key, seconds)), deadline, timeout, clock)
    return bytes(store.get(key)) if blob is None and store.check([key]) else blob


def _sliced(request: Callable[[float], R], deadline: float, timeout: float, clock: Callable[[], float]) -> Optional[R]:
    """`request(seconds)`, a store wait, made again in slices of at most `SLICE` T until it returns (None: `deadline`
    came first). torch's TCPStore client restarts its poll with the whole timeout after EINTR (a DataLoader worker's
    SIGCHLD, a Ctrl-C), so a signal stretches a wait past its deadline by one slice (T/8) at most, and a Ctrl-C
    raises within one. Cost: per slice that runs out, one more request (and its cancel), and torch's two
    `[c10d] waitForInput` lines (docs/c10d-warnings.md). A timeout is "not yet"; any other error raises."""
    while True:
        left = deadline - clock()
        if left < SHORTEST_WAIT:
            return None
        try:
            return request(min(left, max(timeout * SLICE, SHORTEST_WAIT)))
        except Exception as exc:
            if not is_timeout(exc):
                raise


def _prefixed(store: Store, prefix: str) -> Store:
    prefixed = getattr(store, "prefixed", None)  # a test's in-memory store
    if prefixed is not None:
        return prefixed(prefix)
    from torch.distributed import PrefixStore  # type: ignore[attr-defined]

    return PrefixStore(prefix, store)


def _clone(store: Store, timeout: float) -> Optional[Store]:
    """A new client connection to `store`'s server, its timeout ours (bounded); None without `clone`."""
    _reachable(store, timeout)
    try:
        own = store.clone()  # `clone` is not in every torch's stubs
    except (RuntimeError, AttributeError):
        return None
    own.set_timeout(_client_timeout(timeout))
    return own


def _client_timeout(timeout: float) -> datetime.timedelta:
    """A cloned client's own timeout, for any request not armed with its own: T + `CLIENT_SLACK`."""
    return datetime.timedelta(seconds=timeout + CLIENT_SLACK)


def _reachable(store: Store, timeout: float) -> None:
    """Raise `ConnectionError` if `store` is a TCPStore (or a prefix over one) whose server's port refuses a
    connection, or accepts none within `timeout`; other stores have no server to lose."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not isinstance(host, str) or not isinstance(port, int):
        return
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"the store's server at {host}:{port} is gone ({exc})") from None
