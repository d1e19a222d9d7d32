"""What a failed store call means: a wait that reached its deadline, or a store that is gone.

Both modes wait on the job's store with a deadline and read "not there in time" as an answer (a rank
that is late, or never comes). Anything else a store call raises is a real failure (the server went
away, a bad key) and must not pass for a late rank. One test, here, so every wait reads it the same way.
"""

from __future__ import annotations

import sys


def is_timeout(exc: BaseException) -> bool:
    """Whether `exc`, raised by a store's `wait` or `get`, says the deadline passed (and nothing else).

    torch raises `DistStoreError` at a deadline and another `DistError` (`DistNetworkError`) for a lost
    connection. Older torch releases, and `testing.InMemoryStore`, raise a RuntimeError that says
    "timeout" ("Wait timeout", "Socket Timeout"). torch is not imported here: a store that raised has
    loaded it, and a test's in-memory store need not.

    Args:
        exc: the exception a store call raised.
    """
    dist = sys.modules.get("torch.distributed")
    store_error = getattr(dist, "DistStoreError", None)
    if store_error is not None and isinstance(exc, store_error):
        return True
    other_error = getattr(dist, "DistError", None)
    if other_error is not None and isinstance(exc, other_error):
        return False
    return isinstance(exc, RuntimeError) and "timeout" in str(exc).lower()
