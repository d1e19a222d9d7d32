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
`_upstream`, `_diagnostics`. `lint/` (the static check) stands apart: it imports nothing else of the package.
"""

__version__ = "0.2.0.dev0"

import sys as _sys


def _lint_only() -> bool:
    """Whether this process is `python -m accelerate_inorder_fix lint` or `accelerate-inorder-fix lint`.

    The lint is standard library only and must run where wrapt (and accelerate, torch) is not installed;
    such a process patches nothing, so the patcher is not imported. `python -m` sets `sys.argv[0]` to `-m`
    while it imports the package.
    """
    argv, whole = _sys.argv, getattr(_sys, "orig_argv", None)  # the interpreter's own arguments: Python 3.10+
    run_as_module = argv[0] == "-m" and (whole is None or "accelerate_inorder_fix" in whole)
    script = argv[0].replace("\\", "/").rsplit("/", 1)[-1].startswith("accelerate-inorder-fix")
    return len(argv) > 1 and argv[1] == "lint" and (run_as_module or script)


if not _lint_only():
    from ._patcher import UnknownAccelerateWarning, is_patched, patch, unpatch
    from ._patcher import auto_patch as _auto_patch
    from .config import configure

    _auto_patch()

__all__ = ["UnknownAccelerateWarning", "__version__", "configure", "is_patched", "patch", "unpatch"]
