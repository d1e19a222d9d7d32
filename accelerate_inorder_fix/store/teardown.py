"""Release our background threads before torch tears the job down: a hook on `destroy_process_group`.

A daemon thread of ours still inside a c10d store call when the interpreter finalizes aborts the
process (see `transport.Cleaner`). `GatherSession.release` stops and joins those threads; it runs at
exit (`atexit`, before the interpreter finalizes) and, through this hook, just before the default
process group is destroyed (`accelerator.end_training()`, `torch.distributed.destroy_process_group()`).

The hook is a wrapt wrapper on `torch.distributed.destroy_process_group` (the name user code and
accelerate call, and the one in `distributed_c10d`), installed once, when this process opens its
store session. A name bound earlier (`from torch.distributed import destroy_process_group`) keeps
the original: the atexit release still covers it. The hook never raises into the caller.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import wrapt

from .._diagnostics import warn_once


_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_lock = threading.Lock()
_releases: list[Callable[[], None]] = []
_installed: list[tuple[Any, Any]] = []  # (module, our wrapper there)


def _ends_the_job(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when this call destroys the default group: `destroy_process_group()` (every group) or WORLD's."""
    group = args[0] if args else kwargs.get("group")
    if group is None:
        return True
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return group is getattr(getattr(c10d, "GroupMember", None), "WORLD", None)


def _before_destroy(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _ends_the_job(args, kwargs):
        with _lock:
            releases = list(_releases)
        for release in releases:
            try:
                release()
            except Exception as exc:  # never into the caller's teardown
                warn_once(f"could not release in_order threads before destroy: {exc!r}", key=("teardown", type(exc)))
    return wrapped(*args, **kwargs)


def on_destroy(release: Callable[[], None]) -> None:
    """Call `release` before the default process group is destroyed; installs the hook once (idempotent)."""
    with _lock:
        if release not in _releases:
            _releases.append(release)
        for name in _MODULES:
            module = sys.modules.get(name)
            current = getattr(module, "destroy_process_group", None)
            if module is None or current is None or any(m is module and w is current for m, w in _installed):
                continue
            wrapper = wrapt.FunctionWrapper(current, _before_destroy)
            setattr(module, "destroy_process_group", wrapper)
            _installed.append((module, wrapper))
