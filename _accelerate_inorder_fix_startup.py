"""Start-up hook of accelerate-inorder-fix: patch accelerate in every process, at no start-up cost.

`_accelerate_inorder_fix_startup.pth`, installed beside this module in site-packages, runs `install()`
when the interpreter starts (a `sitecustomize.py` can run the same line, see `LINE`). `install()` puts a
small finder on `sys.meta_path` that waits for `accelerate.logging`: the moment that module has been
loaded, the finder imports `accelerate_inorder_fix`, which patches `MultiProcessAdapter.log` at once
because the module is already there. So every process of the environment that imports accelerate is
patched before its first `get_logger(...).info(...)`, including the ranks that `torchrun`,
`accelerate launch` and `multiprocessing` spawn start, and no training script changes.

Why a top-level module and not part of the package: `import accelerate_inorder_fix` imports wrapt
(about 90 ms) and patches; start-up must only pay for this file. It therefore imports nothing beyond
`os` and `sys` (already loaded by `site`), and never raises: a failure prints one line on stderr and
the process runs unpatched.

`ACCELERATE_INORDER_FIX=0` (or `off`, `false`, `no`) leaves the hook unarmed, and `import
accelerate_inorder_fix` does not patch either; the package's own `switch()` reads the variable through
this module, so both agree on the words. `ACCELERATE_INORDER_FIX_STARTUP=0` leaves only the hook
unarmed: the package stays installed and patches when a script imports it (the test-suite runs so, to
see accelerate as it is before any patch).
"""

import os
import sys


SWITCH_ENV = "ACCELERATE_INORDER_FIX"
STARTUP_ENV = "ACCELERATE_INORDER_FIX_STARTUP"
OFF_WORDS = ("0", "off", "false", "no")
TARGET = "accelerate.logging"
PACKAGE = "accelerate_inorder_fix"
PTH_NAME = "_accelerate_inorder_fix_startup.pth"

# The one line of the .pth file, also the line a sitecustomize.py may hold. `site` runs a .pth line
# that starts with "import" and prints a full traceback when it raises, so the line catches its own
# failures (this module missing or broken) and says so in one line instead. `site` may run the line
# twice (Python 3.11 reads a venv's site-packages twice), hence the sys.modules check; a failed
# import leaves None there, so the second pass stays silent too.
LINE = (
    "import sys; exec(\"n = '_accelerate_inorder_fix_startup'\\nif n not in sys.modules:\\n try:\\n"
    "  __import__(n).install()\\n except Exception as e:\\n  sys.modules[n] = None\\n"
    "  sys.stderr.write('accelerate-inorder-fix: start-up hook not loaded (%s: %s); this process runs "
    "unpatched\\\\n' % (type(e).__name__, e))\")"
)

# What happened in this process; read by `accelerate_inorder_fix.startup.status()`.
#   armed: the finder was installed; fired: accelerate.logging loaded while armed;
#   imported_package: the hook (not user code) imported the package; error: the one line reported.
state = {"switch": None, "armed": False, "fired": False, "imported_package": False, "error": None}


def switch():
    """'off', 'force' or 'on', from `ACCELERATE_INORDER_FIX` (unset means 'on')."""
    value = os.environ.get(SWITCH_ENV, "").strip().lower()
    if value in OFF_WORDS:
        return "off"
    if value == "force":
        return "force"
    return "on"


def startup_switch():
    """'off' when `ACCELERATE_INORDER_FIX_STARTUP` turns the start-up hook (only) off, else 'on'."""
    return "off" if os.environ.get(STARTUP_ENV, "").strip().lower() in OFF_WORDS else "on"


def _report(what, exc):
    """The single stderr line of a failed hook; the process goes on unpatched."""
    line = f"accelerate-inorder-fix: start-up hook {what} ({type(exc).__name__}: {exc}); this process runs unpatched"
    state["error"] = line  # kept even when there is no stderr to write to (pythonw, closed fd)
    if sys.stderr is not None:
        try:
            sys.stderr.write(line + "\n")
        except (OSError, ValueError):
            return


def _disarm():
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:  # already removed, by us or by the user
        pass


def _patch_now():
    """accelerate.logging is loaded: hand over to the package, which patches on import."""
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

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def create_module(self, spec):
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
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

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET or self._busy:
            return None
        self._busy = True
        try:
            spec = self._real_spec(fullname, path, target)
            if spec is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchAfterExec(spec.loader)
            return spec
        except Exception as exc:
            # Our own failure must not change the import: step aside, and the ordinary finders
            # (which raise their own errors, if any) do the work.
            _disarm()
            _report("failed while accelerate.logging was imported", exc)
            return None
        finally:
            self._busy = False

    def _real_spec(self, fullname, path, target):
        index = next((i for i, f in enumerate(sys.meta_path) if f is self), -1)
        for finder in sys.meta_path[index + 1 :]:
            find = getattr(finder, "find_spec", None)
            if find is None:  # a legacy find_module-only finder: out of scope since Python 3.4
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def __repr__(self):
        return f"<accelerate-inorder-fix start-up hook for {TARGET}>"


_FINDER = _Finder()


def install():
    """Arm the hook in this process (the .pth line calls it). Idempotent; never raises.

    Returns True when the hook is armed (or accelerate was already imported and the patch was handed
    over at once), False when `ACCELERATE_INORDER_FIX` is off or the hook failed.
    """
    try:
        state["switch"] = switch()
        if state["switch"] == "off" or startup_switch() == "off":
            return False
        if state["armed"]:
            return True
        state["armed"] = True
        if TARGET in sys.modules:  # a late sitecustomize: accelerate is already there
            _patch_now()
        else:
            sys.meta_path.insert(0, _FINDER)
        return True
    except Exception as exc:
        _report("could not be installed", exc)
        return False


def uninstall():
    """Disarm the hook in this process (a patch already applied stays: `accelerate_inorder_fix.unpatch()`)."""
    _disarm()
    state["armed"] = False
