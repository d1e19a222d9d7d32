"""Make Accelerate's `in_order` logging work on every rank, every time.

Importing this package patches `accelerate.logging.MultiProcessAdapter.log` (now, or when
`accelerate.logging` is first imported) so that `logger.info(msg, in_order=True)` is a collective
that every rank enters, whatever it will print: records come out in rank order and never deadlock.

    import accelerate_inorder_fix  # that's all

`ACCELERATE_INORDER_FIX=0` turns the automatic patch off; `patch()`, `unpatch()` and `is_patched()`
control it explicitly; `configure(mode=..., timeout=..., collapse=...)` picks the in_order mode,
its timeout, and whether gather mode prints identical records once.

Layers, each importing only those below it (import-linter checks them): `cli/` (the command line) ->
`hook_status` -> `_patcher` -> `_wrapper` (the patched log) -> `session` (the mode, call counts) ->
`barrier/` | `gather/` (the two modes) -> `store/` (the job's c10d store) -> `config`, `_callsite` ->
`_upstream`, `_diagnostics`.
"""

__version__ = "0.2.0.dev0"

from ._patcher import UnknownAccelerateWarning, is_patched, patch, unpatch
from ._patcher import auto_patch as _auto_patch
from .config import configure


__all__ = ["UnknownAccelerateWarning", "__version__", "configure", "is_patched", "patch", "unpatch"]

_auto_patch()
