"""Start-up hook of accelerate-inorder-fix: patch accelerate in every process, at no start-up cost.

`_accelerate_inorder_fix_startup.pth`, installed beside this module in site-packages, holds `LINE`,
which `site` runs when the interpreter starts (a `sitecustomize.py` can run it too). The line imports
nothing: it puts a tiny finder on `sys.meta_path` that answers only for `accelerate.logging`. Only when
a process first imports `accelerate.logging` does that finder import this module (`take_over()`), which
reads the switches and puts its own finder (`_Finder`) in the line's place; that one wraps
the real loader, and once `accelerate.logging` has run it imports `accelerate_inorder_fix`, which
patches `MultiProcessAdapter.log` at once. So every process of the environment that imports accelerate
is patched before its first `get_logger(...).info(...)`, including the ranks that `torchrun`,
`accelerate launch` and `multiprocessing` start, and no training script changes.

Why the line and not this module at start-up: finding, reading and running even an empty module at
start-up costs about as much as the whole budget (0.3 ms per `python -c pass`, benchmarks/RESULTS-startup.md);
a process that never imports accelerate pays only for the line. Why a top-level module and not part of the package:
`import accelerate_inorder_fix` imports wrapt and patches; this module imports nothing beyond `os` and
`sys` (already loaded by `site`).

Nothing here raises into the process: a failure prints one line on stderr and the process runs
unpatched. `ACCELERATE_INORDER_FIX=0` (or `off`, `false`, `no`) leaves the hook unarmed, and the
package's own `switch()` reads the variable through this module, so both agree on the words.
`ACCELERATE_INORDER_FIX_STARTUP=0` leaves only the hook unarmed (the test suite runs so).
"""

import os
import sys


# Types for mypy only: importing `typing` would cost every interpreter's start-up (mypy reads any
# `TYPE_CHECKING` as true), and the annotations below are strings, never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Optional


SWITCH_ENV = "ACCELERATE_INORDER_FIX"
STARTUP_ENV = "ACCELERATE_INORDER_FIX_STARTUP"
OFF_WORDS = ("0", "off", "false", "no")
TARGET = "accelerate.logging"
PACKAGE = "accelerate_inorder_fix"
PTH_NAME = "_accelerate_inorder_fix_startup.pth"
MODULE = "_accelerate_inorder_fix_startup"
# The attribute that marks the line's finder on sys.meta_path.
MARK = "accelerate_inorder_fix_hook"

# Run by the line's finder the first time accelerate.logging is looked for (compiled then, never at
# start-up), with the finder's locals: n, p, t (the lookup) and d (where the answer goes). It hands over
# to this module, or says in one line why it cannot and takes the line's finder off for good.
_GUARD = (
    "try:\n"
    f" import {MODULE} as m; d['r'] = m.take_over(n, p, t)\n"
    "except Exception as e:\n"
    " import sys\n"
    " for f in list(sys.meta_path):\n"
    f"  hasattr(f, {MARK!r}) and sys.meta_path.remove(f)\n"
    " sys.stderr and sys.stderr.write('accelerate-inorder-fix: start-up hook not loaded (%s: %s); this process "
    "runs unpatched\\n' % (type(e).__name__, e))\n"
)

# The one line of the .pth file, also the line a sitecustomize.py may hold: it only puts the line's
# finder (marked with MARK) first on sys.meta_path. Every grammar construct in it costs start-up time
# (`site` compiles the line in every process), hence no switch check here: `take_over()` reads the
# switches when accelerate.logging is imported, and leaves accelerate alone when they say so.
# It never raises. `site` may run it twice (Python 3.11 reads a venv's site-packages twice); the
# second finder is taken off with the first.
LINE = (
    f"import sys; sys.meta_path.insert(0, type(sys.implementation)({MARK}=True, "
    f"find_spec=lambda n, p=None, t=None, d={{}}: n == {TARGET!r} and not exec({_GUARD!r}) "
    "and d.pop('r', None) or None))"
)


# What the hook did in this process; read by `accelerate_inorder_fix.hook_status.status()`.
#   armed: the real finder was installed; fired: accelerate.logging loaded while armed;
#   imported_package: the hook (not user code) imported the package; error: the one line reported.
state: "dict[str, object]" = {"armed": False, "fired": False, "imported_package": False, "error": None}


def switch() -> str:
    """'off', 'force' or 'on', from `ACCELERATE_INORDER_FIX` (unset means 'on')."""
    value = os.environ.get(SWITCH_ENV, "").strip().lower()
    if value in OFF_WORDS:
        return "off"
    if value == "force":
        return "force"
    return "on"


def startup_switch() -> str:
    """'off' when `ACCELERATE_INORDER_FIX_STARTUP` turns the start-up hook (only) off, else 'on'."""
    return "off" if os.environ.get(STARTUP_ENV, "").strip().lower() in OFF_WORDS else "on"


def line_armed() -> bool:
    """True when the line's finder is on `sys.meta_path`, waiting for accelerate.logging.

    It arms the hook then unless a switch is off (`switch()`, `startup_switch()`).
    """
    return any(hasattr(f, MARK) for f in sys.meta_path)


def _report(what: str, exc: BaseException) -> None:
    # The single stderr line of a failed hook; the process goes on unpatched.
    line = f"accelerate-inorder-fix: start-up hook {what} ({type(exc).__name__}: {exc}); this process runs unpatched"
    state["error"] = line  # kept even when there is no stderr to write to (pythonw, closed fd)
    if sys.stderr is not None:
        try:
            sys.stderr.write(line + "\n")
        except (OSError, ValueError):
            return


def _drop_line_finders() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not hasattr(f, MARK)]


def _disarm() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if f is not _FINDER and not hasattr(f, MARK)]


def _patch_now() -> None:
    # accelerate.logging is loaded: hand over to the package, which patches on import.
    _disarm()
    state["fired"] = True
    already = PACKAGE in sys.modules
    try:
        __import__(PACKAGE)
    except Exception as exc:
        _report("could not apply the patch", exc)
        return
    state["imported_package"] = not already


class _PatchAfterExec:
    """Wraps the real loader of accelerate.logging: run it, put it back, then patch.

    Anything but `create_module`/`exec_module` is the real loader's, and once the module has run,
    its `__loader__` and `__spec__.loader` are the real loader again, so `inspect`, `linecache` and
    `importlib.reload` never see this class.
    """

    def __init__(self, real: "Any") -> None:
        self._real = real

    def __getattr__(self, name: str) -> "Any":
        return getattr(self._real, name)

    def create_module(self, spec: "ModuleSpec") -> "Optional[ModuleType]":
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        try:
            self._real.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._real
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._real
        # Reached only when accelerate.logging ran to the end; a failed import stays armed and
        # the next attempt is watched again.
        _patch_now()


class _Finder:
    """A `sys.meta_path` entry that answers only for accelerate.logging, only to watch it load.

    It asks the finders after it for the real spec (so editable installs, zip imports and other
    hooks keep working) and wraps that spec's loader. A finder consulted from inside (wrapt's hook
    finder calls `importlib.util.find_spec` again) meets `_busy` and is answered with None.
    """

    _busy = False

    def find_spec(
        self, fullname: str, path: "Optional[Sequence[str]]" = None, target: "Optional[ModuleType]" = None
    ) -> "Optional[ModuleSpec]":
        if fullname != TARGET or self._busy:
            return None
        self._busy = True
        try:
            spec = self._real_spec(fullname, path, target)
            if spec is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchAfterExec(spec.loader)  # type: ignore[assignment]  # a Loader by duck typing
            return spec
        except Exception as exc:
            # Our own failure must not change the import: step aside, and the ordinary finders
            # (which raise their own errors, if any) do the work.
            _disarm()
            _report("failed while accelerate.logging was imported", exc)
            return None
        finally:
            self._busy = False

    def _real_spec(
        self, fullname: str, path: "Optional[Sequence[str]]", target: "Optional[ModuleType]"
    ) -> "Optional[ModuleSpec]":
        index = next((i for i, f in enumerate(sys.meta_path) if f is self), -1)
        for finder in sys.meta_path[index + 1 :]:
            find = getattr(finder, "find_spec", None)
            if find is None:  # a legacy find_module-only finder: out of scope since Python 3.4
                continue
            spec: "Optional[ModuleSpec]" = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def __repr__(self) -> str:
        return f"<accelerate-inorder-fix start-up hook for {TARGET}>"


_FINDER = _Finder()


def install() -> bool:
    """Arm the hook in this process: the real finder, first on `sys.meta_path`. Idempotent; never raises.

    The line's finder calls it (through `take_over()`) when accelerate.logging is first looked for;
    it can also be called directly. Returns True when the hook is armed (or accelerate was already
    imported and the patch was handed over at once), False when a switch is off or the hook failed.
    """
    try:
        if switch() == "off" or startup_switch() == "off":
            return False
        if not state["armed"]:
            state["armed"] = True
            if TARGET in sys.modules:  # a late sitecustomize: accelerate is already there
                _patch_now()
                return True
            # In the place of the line's finder, if there is one: another hook may have gone first since.
            index = next((i for i, f in enumerate(sys.meta_path) if hasattr(f, MARK)), 0)
            sys.meta_path.insert(index, _FINDER)
        _drop_line_finders()
        return True
    except Exception as exc:
        _report("could not be installed", exc)
        return False


def take_over(
    fullname: "Optional[str]" = None, path: "Optional[Sequence[str]]" = None, target: "Optional[ModuleType]" = None
) -> "Optional[ModuleSpec]":
    """Called by the line's finder for accelerate.logging: arm the real finder, and answer with it.

    When a switch is off, the line's finder is taken off and accelerate is left alone.
    """
    if not install():
        _drop_line_finders()
        return None
    if fullname is None or _FINDER not in sys.meta_path:
        return None
    return _FINDER.find_spec(fullname, path, target)


def uninstall() -> None:
    """Disarm the hook in this process (a patch already applied stays: `accelerate_inorder_fix.unpatch()`)."""
    _disarm()
    state["armed"] = False
