"""Release our background threads before torch tears the job down: a hook on `destroy_process_group`.

A daemon thread of ours still inside a c10d store call when the interpreter finalizes aborts the
process (the clean-up thread, `writer.BackgroundWriter`). `InOrderSession.release` stops and joins
those threads; it runs at exit (`atexit`, before the interpreter finalizes) and, through this hook,
just before the default process group is destroyed (`accelerator.end_training()`,
`torch.distributed.destroy_process_group()`).

The hook (`hooks.TorchHook`) is installed once, when this process opens its store session. A name
bound earlier (`from torch.distributed import destroy_process_group`) keeps the original: the atexit
release still covers it. The hook never raises into the caller.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from .._diagnostics import warn_once
from .hooks import TorchHook


def _ends_the_job(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when this call destroys the default group: `destroy_process_group()` (every group) or WORLD's."""
    group = args[0] if args else kwargs.get("group")
    if group is None:
        return True
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return group is getattr(getattr(c10d, "GroupMember", None), "WORLD", None)


def _before_destroy(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _ends_the_job(args, kwargs):
        for release in HOOK.callbacks():
            try:
                release()
            except Exception as exc:  # never into the caller's teardown
                warn_once(f"could not release in_order threads before destroy: {exc!r}", key=("teardown", type(exc)))
    return wrapped(*args, **kwargs)


HOOK = TorchHook("destroy_process_group", _before_destroy)


def on_destroy(release: Callable[[], None]) -> None:
    """Call `release` before the default process group is destroyed; installs the hook once (idempotent).

    Args:
        release: stops and joins a session's background threads.
    """
    HOOK.add(release)
