"""The job's c10d store, on connections of our own: how both modes reach it.

Every torch.distributed job already has a key-value store (the rendezvous `TCPStore` torchrun and
`accelerate launch` start on the master node, reachable from every node). Both modes talk through it,
never through a process group's collectives: nothing is queued behind NCCL work, no CUDA stream is
synced. Every key is under `PREFIX`.

The connection is our own when this torch can clone one (`Store.clone`, torch 2.8+): a bounded wait
never holds the client lock the process group's own store traffic needs, and its timeout can be ours
without touching theirs. Otherwise it is the process group's connection. A background thread gets a
further connection of its own (`own_connection`), or does not run at all.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Optional


# A c10d store (torch's `Store`, a `PrefixStore` over one, or a test double): typed loosely, since
# torch's stubs do not export `PrefixStore` and a fake store is no subclass of `Store`.
Store = Any

PREFIX = "accelerate_inorder_fix/"
SHORTEST_WAIT = 0.002  # seconds: a shorter wait is none (c10d reads a wait under 1 ms as no timeout at all)
UNSET = b"accelerate_inorder_fix:unset"  # compare_set with this as both values reads a key, never waits


def open_store(timeout: float) -> tuple[Optional[Store], Optional[str]]:
    """`(store, None)` for this job, or `(None, reason)` when it has no c10d store to use.

    Args:
        timeout (`float`): seconds; the connection's own timeout is this plus 5 s, so no store call of
            ours outlives a dead server by more.
    """
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return None, f"torch.distributed is not available ({exc})"
    if not dist.is_available() or not dist.is_initialized():
        return None, "torch.distributed has no default process group"
    store = _default_store()
    if store is None:
        return None, "the process group has no c10d store"
    return dist.PrefixStore(PREFIX, _clone(store, timeout) or store), None  # type: ignore[attr-defined]


def reopen_store(timeout: float) -> tuple[Optional[Store], Optional[str]]:
    """`open_store`, after a connection of ours failed: only if the store's server takes a TCP connection
    within `timeout` s. Cloning a connection to a dead server would retry for the process group's
    timeout (minutes), since the clone connects before its own timeout is set.

    Args:
        timeout (`float`): seconds, the call's timeout.
    """
    reason = _unreachable(timeout)
    return (None, reason) if reason else open_store(timeout)


def _unreachable(timeout: float) -> Optional[str]:
    """Why the job's store server does not answer within `timeout` s; None when it does, or has no address."""
    store = _default_store()
    for _ in range(8):  # a PrefixStore over a PrefixStore ... over the TCPStore
        inner = getattr(store, "underlying_store", None)
        if inner is None:
            break
        store = inner
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not isinstance(host, str) or not isinstance(port, int):
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"the job's store server at {host}:{port} does not answer ({exc})"


def process_group_connection() -> Optional[Store]:
    """The process group's own connection, prefixed; None without one. For one write at start-up, never a wait."""
    store = _default_store()
    if store is None:
        return None
    from torch.distributed import PrefixStore  # type: ignore[attr-defined]

    return PrefixStore(PREFIX, store)


def own_connection(timeout: float) -> Optional[Store]:
    """One more connection of our own, prefixed, for a background thread; None when torch cannot clone.

    A background thread never uses the process group's connection: at `destroy_process_group` or at
    exit it would still be in a store call on it (`writer.BackgroundWriter.stop`).
    """
    store = _default_store()
    own = None if store is None else _clone(store, timeout)
    if own is None:
        return None
    from torch.distributed import PrefixStore  # type: ignore[attr-defined]

    return PrefixStore(PREFIX, own)


def peek(store: Store, key: str) -> Optional[bytes]:
    """The value of `key`, or None when it has none: never waits, never creates it.

    It does wake the key's waiters (a TCPStore wakes them on any `compare_set`): use it on keys nobody
    waits on, or where a waiter checks again.
    """
    blob = bytes(store.compare_set(key, UNSET, UNSET))
    return None if blob == UNSET else blob


def _default_store() -> Optional[Store]:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except (ImportError, RuntimeError, ValueError, AttributeError):
        return None


def _clone(store: Store, timeout: float) -> Optional[Store]:
    """A new client connection to `store`'s server, its timeout ours (bounded); None without `clone`."""
    try:
        own = store.clone()  # `clone` is not in every torch's stubs
    except (RuntimeError, AttributeError):
        return None
    own.set_timeout(datetime.timedelta(seconds=timeout + 5.0))
    return own
