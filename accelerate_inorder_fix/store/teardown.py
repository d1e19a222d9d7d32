"""End the in_order session before torch tears its process group down: a hook on `destroy_process_group`.

`InOrderSession.end` closes the session's side (gather mode's keys deleted) just before the
default process group is destroyed (`accelerator.end_training()`, `destroy_process_group()`); a later
`init_process_group` opens a new session. The hook (`hooks.TorchHook`) is installed when a session
opens. A name bound earlier (`from torch.distributed import destroy_process_group`) keeps the original:
the session then ends at the next group's first call, or at exit. The hook never raises into the caller.
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
                warn_once(f"could not end the in_order session before destroy: {exc!r}", key=("teardown", type(exc)))
    return wrapped(*args, **kwargs)


HOOK = TorchHook("destroy_process_group", _before_destroy)


def on_destroy(end: Callable[[], None]) -> None:
    """Call `end` before the default process group is destroyed; installs the hook once (idempotent).

    Args:
        end: ends a session (`InOrderSession.end`).
    """
    HOOK.add(end)
