"""All caller-frame arithmetic: which frame is the user's call site, and what `stacklevel` points there.

The stack of an in_order call, innermost last (a plain call has no frames of ours below the wrapper):

    user code               logger.info("...", in_order=True)     <- the call site: records point here
    LoggerAdapter.info      logging's own frame (findCaller skips logging's frames, they count 0)
    [warning_once]          accelerate's frame, only for `warning_once` (upstream's default is then 3)
    [wrapt frames]          `body.wrapper_frames`: 0 with wrapt's C extension
    patched_log             our wrapper (upstream's `log`): found by its code object, never by a count
    [our frames]            `InOrderSession.call` -> `BarrierSide.call` (-> `_call.emit_at_once`) or `GatherSide.call`
                            (-> `records.capture`) -> `_call.log_for_this_call`
    ... -> Logger.log       `stacklevel` 1 is the frame that calls it

One counting rule. The wrapper sets `stacklevel` as if it called `Logger.log` itself: the user's own
(which counts from upstream's `log` frame, as upstream's does) or upstream's default, plus wrapt's
frames (`caller_stacklevel`). The function that does call `Logger.log` then adds the frames between
itself and the wrapper, counted by walking up to the wrapper's frame (`counted_from_here`). Nobody
writes a frame count: a helper added between the wrapper and `Logger.log` is counted by the walk.

`_getframe` is the one way in: unit tests put a chain of fake frames there.
"""

from __future__ import annotations

import logging
import os
import sys
from types import CodeType
from typing import Any, Callable, Optional

from ._upstream import UpstreamBody


Site = tuple[str, str, int]  # (file name, function, line) of the user's in_order call
Identity = tuple[Site, int]  # a call: its site, and how many times this rank has called from there


_getframe: Callable[[int], Any] = sys._getframe  # the seam: frame 1 is the caller of the function that calls it
# Our wrapper's code (every wrapper made shares it), kept alive, and looked up by id: hashing a code
# object hashes its bytecode, microseconds on every call.
_WRAPPER_CODES: list[CodeType] = []
_WRAPPER_IDS: set[int] = set()
_WARNING_CODE = logging.LoggerAdapter.warning.__code__
_ACCELERATE_LOGGING = os.path.join("accelerate", "logging.py")
_LIMIT = 64  # frames walked at most: a wrapper further up than this is not ours to count from


def mark_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `function` as the wrapper the arithmetic counts from (its frame, found by its code).

    Every wrapper a patch makes shares one code object: it is kept once, however often the package is
    patched again (`unpatch()` then `patch()`, `testing.reset()`).
    """
    if id(function.__code__) not in _WRAPPER_IDS:
        _WRAPPER_CODES.append(function.__code__)
        _WRAPPER_IDS.add(id(function.__code__))
    return function


def _up_to_wrapper(frame: Any) -> tuple[Any, int]:
    """(the nearest wrapper frame at or above `frame`, frames between them), or (None, 0) if none."""
    for below in range(_LIMIT):
        if frame is None:
            break
        if id(frame.f_code) in _WRAPPER_IDS:
            return frame, below
        frame = frame.f_back
    return None, 0


def _above_wrapper(wrapper: Any, body: UpstreamBody) -> Any:
    """The frame that called upstream's `log`: above the wrapper and wrapt's own frames."""
    frame = wrapper.f_back
    for _ in range(body.wrapper_frames):  # none with wrapt's C extension
        if frame is None:
            return None
        frame = frame.f_back
    return frame


def _default_stacklevel(wrapper: Any, body: UpstreamBody) -> int:
    """Upstream's default `stacklevel` (2: the frame above `log`), moved past `warning_once` (3).

    `wrapper` is the wrapper's own frame: this runs on every plain call, so nothing here walks.
    """
    above = _above_wrapper(wrapper, body)
    if above is not None and above.f_code is _WARNING_CODE:
        caller = above.f_back
        if caller is not None and caller.f_code is body.warning_once_code:
            return 3
    return 2


def caller_stacklevel(body: UpstreamBody, kwargs: dict[str, Any]) -> int:
    """The `stacklevel` for a `Logger.log` call made by the wrapper itself; called by the wrapper only.

    A function below the wrapper that makes the call adds its own frames (`counted_from_here`).
    """
    level: int = kwargs.get("stacklevel") or _default_stacklevel(_getframe(1), body)  # frame 1: the wrapper
    return level + body.wrapper_frames


def counted_from_here(kwargs: dict[str, Any], callee: bool = False) -> dict[str, Any]:
    """A copy of `kwargs` whose `stacklevel` (set by the wrapper) counts from the caller of this function.

    The caller calls `Logger.log` itself; with `callee`, the function it calls next does (one frame more).
    Called outside any wrapper, `kwargs` come back unchanged.
    """
    _, below = _up_to_wrapper(_getframe(1))
    kwargs = dict(kwargs)
    if "stacklevel" in kwargs:
        kwargs["stacklevel"] += below + callee
    return kwargs


def _is_adapter_frame(filename: str) -> bool:
    # logging's LoggerAdapter methods and accelerate's own adapter (`warning_once`).
    return filename == logging.__file__ or filename.endswith(_ACCELERATE_LOGGING)


def call_site(body: UpstreamBody) -> Site:
    """(file name, function, line) of the user's code that called the logger: the same on every rank.

    Only the call's identity across ranks; the record's own caller info comes from the logger.
    """
    wrapper, _ = _up_to_wrapper(_getframe(1))
    frame = _above_wrapper(wrapper, body) if wrapper is not None else None
    while frame is not None and _is_adapter_frame(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("?", "?", 0)
    return (_file_name(frame), frame.f_code.co_name, frame.f_lineno)


_FILE_NAMES: dict[tuple[Any, Any], str] = {}  # (code, module name) -> `_file_name`: once per call site
_FILE_NAMES_KEPT = 4096  # then forgotten and made again: code made at run time (exec) must not pile up


def _file_name(frame: Any) -> str:
    """The file of `frame` as its module's path under its import root (`pkg/sub/train.py`), the same on every
    host whatever the absolute paths; two files of one basename differ there. A script (`__main__`), or
    code without a module, is named by its basename. Worked out once per code and module (`_FILE_NAMES`)."""
    module = getattr(frame, "f_globals", {}).get("__name__")
    key = (frame.f_code, module if isinstance(module, str) else None)
    name = _FILE_NAMES.get(key)
    if name is None:
        if len(_FILE_NAMES) >= _FILE_NAMES_KEPT:
            _FILE_NAMES.clear()
        name = _FILE_NAMES[key] = _module_file_name(frame.f_code.co_filename, key[1])
    return name


def _module_file_name(filename: str, module: Optional[str]) -> str:
    """`_file_name` of code in file `filename` of module `module` (its name, or None)."""
    base: str = os.path.basename(filename)
    if module is None or module == "__main__":
        return base
    package = module if base == "__init__.py" else module.rpartition(".")[0]
    return f"{package.replace('.', '/')}/{base}" if package else base
