"""Where the start-up hook is, whether it is active, and the `sitecustomize` route.

The hook itself lives in the top-level module `_accelerate_inorder_fix_startup` (it must load without
this package); this module only reports on it, for people and for the `status` command:

    python -m accelerate_inorder_fix.hook_status                       # status of this environment
    python -m accelerate_inorder_fix.hook_status --print-sitecustomize # the line for sitecustomize.py

The `sitecustomize` route is for interpreters that do not read the site-packages `.pth` files, e.g.
a package installed with `pip install --target DIR` and found through `PYTHONPATH`: append the printed
line to a `sitecustomize.py` on the path (the existing one, if there is one; a second would shadow it).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import _accelerate_inorder_fix_startup as _hook

from ._patcher import is_patched


DISTRIBUTION = "accelerate-inorder-fix"
PTH_NAME = _hook.PTH_NAME


def sitecustomize_line() -> str:
    """The line that arms the hook from a `sitecustomize.py` (the same line as the `.pth`)."""
    return _hook.LINE


def hook_path() -> Optional[str]:
    """Path of the `.pth` file pip installed for this distribution, or None when there is none.

    Read from the installed distribution's RECORD, so it names the file of this install (wheel or
    editable) and not a stray copy; it may name a file that has since been deleted.
    """
    from importlib import metadata

    try:
        files = metadata.distribution(DISTRIBUTION).files or ()
    except metadata.PackageNotFoundError:  # running from a source tree, not installed
        return None
    for entry in files:
        if entry.name == PTH_NAME:
            return os.path.abspath(str(entry.locate()))
    return None


def hook_installed() -> bool:
    """True when the `.pth` file is present, i.e. new processes of this environment get the hook."""
    path = hook_path()
    return path is not None and os.path.isfile(path)


def patched_by() -> Optional[str]:
    """How this process got its patch: 'start-up hook', 'import' or None (not patched).

    'import' covers user code that imported the package or called `patch()` before accelerate was
    loaded; 'start-up hook' means the hook imported the package when accelerate.logging loaded.
    """
    if not is_patched():
        return None
    return "start-up hook" if _hook.state["imported_package"] else "import"


def status() -> dict[str, Any]:
    """Everything `status` reports about this process, as a dict of plain values.

    - hook_file / hook_installed: the `.pth` of this environment and whether it is there;
    - switch: 'on', 'off' or 'force' from ACCELERATE_INORDER_FIX (the environment override);
    - startup_switch: 'off' when ACCELERATE_INORDER_FIX_STARTUP turns only the start-up hook off;
    - hook_armed: the hook ran at start-up in this process and watches for (or saw) accelerate.logging
      (False when switched off or not installed);
    - hook_fired: accelerate.logging has been imported since, and the hook handed over to the package;
    - hook_error: the one line a failed hook printed, or None;
    - accelerate_imported / patched / patched_by: the state of `MultiProcessAdapter.log` now.
    """
    switch, startup_switch = _hook.switch(), _hook.startup_switch()
    return {
        "hook_file": hook_path(),
        "hook_installed": hook_installed(),
        "switch": switch,
        "startup_switch": startup_switch,
        "hook_armed": _hook.state["armed"] or (_hook.line_armed() and "off" not in (switch, startup_switch)),
        "hook_fired": _hook.state["fired"],
        "hook_error": _hook.state["error"],
        "accelerate_imported": _hook.TARGET in sys.modules,
        "patched": is_patched(),
        "patched_by": patched_by(),
    }


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m accelerate_inorder_fix.hook_status [--print-sitecustomize]`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--print-sitecustomize"]:
        print(sitecustomize_line())
        return 0
    if args:
        print("usage: python -m accelerate_inorder_fix.hook_status [--print-sitecustomize]", file=sys.stderr)
        return 2
    for key, value in status().items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
