"""The wiring: install and remove the patch on `accelerate.logging.MultiProcessAdapter.log`.

Modelled on OpenTelemetry's `BaseInstrumentor`: idempotent, reversible, and it steps aside with a
warning (never an exception) when the installed `log` is not a body it was tested against.
"""

import sys
import warnings

import wrapt

from . import _config, _fingerprint

TARGET_MODULE = "accelerate.logging"


class UnknownAccelerateWarning(UserWarning):
    """The installed accelerate has a `log` body this package was not tested against."""


_state = {"wanted": False, "force": False, "hook_registered": False, "warned": False}


def _adapter_class():
    module = sys.modules.get(TARGET_MODULE)
    return getattr(module, "MultiProcessAdapter", None) if module is not None else None


def _installed(cls):
    return isinstance(cls.__dict__.get("log"), wrapt.FunctionWrapper)


def _count_wrapper_frames():
    """How many Python frames a wrapt method wrapper puts between the method's caller and the wrapper.

    0 with wrapt's C extension; more with its pure-Python fallback. The in_order path must know it to
    keep the caller file/line of a record on the user's call site.
    """

    class Probe:
        def method(self):
            return None

    def wrapper(wrapped, instance, args, kwargs):
        frame, depth = sys._getframe(1), 0
        while frame is not None and frame.f_code is not call_probe.__code__:
            frame, depth = frame.f_back, depth + 1
        return depth

    def call_probe():
        return Probe().method()

    wrapt.wrap_function_wrapper(Probe, "method", wrapper)
    return call_probe()


def _accelerate_version():
    try:
        import accelerate

        return getattr(accelerate, "__version__", "unknown")
    except Exception:  # a broken accelerate is reported by accelerate itself, not by a log patch
        return "unknown"


def _apply(module=None):
    """Install the wrapper if wanted; called directly or as the post-import hook."""
    if not _state["wanted"]:
        return
    cls = _adapter_class()
    if cls is None or _installed(cls):
        return
    original = cls.__dict__.get("log")
    force = _state["force"] or _config.switch() == "force"
    known = original is not None and _fingerprint.known_release_line(original) is not None
    if not known and (original is None or not force):
        if not _state["warned"]:
            _state["warned"] = True
            warnings.warn(
                f"accelerate-inorder-fix: accelerate {_accelerate_version()} has a "
                "MultiProcessAdapter.log this package was not tested against; leaving it unpatched "
                "(set ACCELERATE_INORDER_FIX=force or call patch(force=True) to patch anyway).",
                UnknownAccelerateWarning,
                stacklevel=2,
            )
        return
    from . import _inorder

    _inorder.known_body = known
    _inorder.wrapper_frames = _count_wrapper_frames()
    warning_once = getattr(cls.__dict__.get("warning_once"), "__wrapped__", None)
    _inorder.warning_once_code = getattr(warning_once, "__code__", None)
    wrapt.wrap_function_wrapper(cls, "log", _inorder.log_in_order)


def patch(force=False):
    """Patch `MultiProcessAdapter.log` now, or as soon as `accelerate.logging` is imported.

    Idempotent. With `force=True` a `log` body this package does not recognise is patched too.
    """
    _state["wanted"] = True
    _state["force"] = _state["force"] or bool(force)
    if _adapter_class() is not None:
        _apply()
    elif not _state["hook_registered"]:
        _state["hook_registered"] = True
        wrapt.register_post_import_hook(_apply, TARGET_MODULE)


def unpatch():
    """Restore the original `MultiProcessAdapter.log` object and cancel a pending patch."""
    _state["wanted"] = False
    _state["force"] = False
    cls = _adapter_class()
    if cls is not None and _installed(cls):
        setattr(cls, "log", cls.__dict__["log"].__wrapped__)


def is_patched():
    """True when `MultiProcessAdapter.log` is the fixed one in this process.

    False while accelerate is not imported yet, even if a patch is pending.
    """
    cls = _adapter_class()
    return cls is not None and _installed(cls)


def auto_patch():
    """What `import accelerate_inorder_fix` does: patch unless `ACCELERATE_INORDER_FIX` is off."""
    if _config.switch() != "off":
        patch()
