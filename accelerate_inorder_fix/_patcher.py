"""Install and remove the patch on `accelerate.logging.MultiProcessAdapter.log`.

Modelled on OpenTelemetry's `BaseInstrumentor`: one object (`PATCHER`) owns the patch; it is
idempotent, reversible, and steps aside with a warning (never an exception) when the installed `log`
is not a body it was tested against. wrapt's post-import hook applies a patch asked for before
accelerate is imported.

Only the wrapper this object installed counts as "patched": another library may wrap `log` with wrapt
too, above or below ours, and is neither mistaken for us nor removed by `unpatch()`. Ours can be taken
out from beneath a wrapt proxy (its `__wrapped__` is what it calls), not from beneath a plain function
(a `functools.wraps` wrapper calls ours through its closure, whatever its `__wrapped__` says): there
`unpatch()` leaves ours in place, `is_patched()` stays True, and one warning says so.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import wrapt

from . import _upstream
from ._wrapper import make_log_wrapper
from .config import check_switches, switch


TARGET_MODULE = "accelerate.logging"
# What every wrapt wrapper is: `BaseObjectProxy` from wrapt 2 (where `ObjectProxy` is a subclass of it).
_WRAPT_PROXY: type = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)


class UnknownAccelerateWarning(UserWarning):
    """The installed accelerate has a `log` body this package was not tested against."""


def _adapter_class() -> Optional[type]:
    module = sys.modules.get(TARGET_MODULE)
    return getattr(module, "MultiProcessAdapter", None) if module is not None else None


def _accelerate_version() -> str:
    module = sys.modules.get("accelerate")
    return str(getattr(module, "__version__", "unknown"))


def _wrapper_chain(obj: Any) -> Iterator[Any]:
    """`obj`, then what it wraps (`__wrapped__`), and so on: wrapt's wrappers and functools' alike.

    A wrapper made around `MultiProcessAdapter.log` (not the class's own entry) wraps wrapt's *bound*
    wrapper of it: the chain goes on through the wrapper it was bound from (`_self_parent`).
    """
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        parent = getattr(obj, "_self_parent", None) if isinstance(obj, _WRAPT_PROXY) else None
        if parent is not None:
            obj = parent
            continue
        yield obj
        obj = getattr(obj, "__wrapped__", None)


class Patcher:
    """Owns the patch: whether it is wanted, and the one wrapper object it installed."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._wanted = False
        self._force = False
        self._hook_registered = False
        self._warned = False
        self._warned_stuck = False
        self._installed: Optional[wrapt.FunctionWrapper[Any, Any]] = None

    def _ours_in(self, cls: type) -> bool:
        return self._installed is not None and any(
            w is self._installed for w in _wrapper_chain(cls.__dict__.get("log"))
        )

    def _apply(self, module: Any = None) -> None:
        """Install the wrapper if wanted; called directly or as wrapt's post-import hook."""
        with self._lock:
            cls = _adapter_class()
            if not self._wanted or cls is None or self._ours_in(cls):
                return
            body = _upstream.body_of(cls)
            if not body.known and not (self._force or switch() == "force"):
                self._warn_unknown()
                return
            self._installed = wrapt.FunctionWrapper(cls.__dict__["log"], make_log_wrapper(body))
            setattr(cls, "log", self._installed)

    def _warn_unknown(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"accelerate-inorder-fix: accelerate {_accelerate_version()} has a MultiProcessAdapter.log this "
            "package was not tested against; leaving it unpatched (set ACCELERATE_INORDER_FIX=force or call "
            "patch(force=True) to patch anyway).",
            UnknownAccelerateWarning,
            stacklevel=4,
        )

    def patch(self, force: bool = False) -> None:
        with self._lock:
            self._wanted = True
            self._force = self._force or bool(force)
            if _adapter_class() is not None:
                self._apply()
            elif not self._hook_registered:
                self._hook_registered = True
                wrapt.register_post_import_hook(self._apply, TARGET_MODULE)

    def unpatch(self) -> None:
        with self._lock:
            self._wanted = self._force = False
            cls = _adapter_class()
            if cls is None or not self._ours_in(cls):
                return
            ours = self._installed
            if ours is None:  # `_ours_in` said it is there
                return
            chain = list(_wrapper_chain(cls.__dict__["log"]))
            index = next(i for i, w in enumerate(chain) if w is ours)
            if index == 0:
                setattr(cls, "log", ours.__wrapped__)
            elif isinstance(chain[index - 1], _WRAPT_PROXY):  # calls what `__wrapped__` holds: splice
                chain[index - 1].__wrapped__ = ours.__wrapped__
            else:
                self._warn_stuck(chain[index - 1])
                return
            self._installed = None
            self._warned_stuck = False

    def _warn_stuck(self, above: Any) -> None:
        if self._warned_stuck:
            return
        self._warned_stuck = True
        warnings.warn(
            f"accelerate-inorder-fix: unpatch() cannot take its wrapper out from beneath {above!r}, which is "
            "not a wrapt proxy and calls it directly; the fix stays active (remove that wrapper first, then "
            "call unpatch() again).",
            RuntimeWarning,
            stacklevel=4,
        )

    def is_patched(self) -> bool:
        cls = _adapter_class()
        return cls is not None and self._ours_in(cls)


PATCHER = Patcher()


def patch(force: bool = False) -> None:
    """Patch `MultiProcessAdapter.log` now, or as soon as `accelerate.logging` is imported.

    Idempotent.

    Args:
        force (`bool`, *optional*, defaults to `False`): patch a `log` body this package does not
            recognise too (otherwise it is left alone with one `UnknownAccelerateWarning`).
    """
    PATCHER.patch(force=force)


def unpatch() -> None:
    """Restore the original `MultiProcessAdapter.log` and cancel a pending patch.

    Only this package's own wrapper is removed; another library's wrapper on `log` stays. Beneath a
    wrapper that is not a wrapt proxy (a plain `functools.wraps` function) ours cannot be taken out:
    it stays, `is_patched()` stays True, and one `RuntimeWarning` says so.
    """
    PATCHER.unpatch()


def is_patched() -> bool:
    """True when this package's wrapper is on `MultiProcessAdapter.log` in this process.

    False while accelerate is not imported yet, even if a patch is pending.
    """
    return PATCHER.is_patched()


def auto_patch() -> None:
    """What `import accelerate_inorder_fix` does: patch unless `ACCELERATE_INORDER_FIX` is off."""
    check_switches()
    if switch() != "off":
        patch()
