"""All caller-frame arithmetic: which frame is the user's call site.

`logging` reports the caller through `stacklevel`: 1 is the frame that calls `Logger.log`. Between the
user's `logger.info(...)` and us stand `LoggerAdapter.info`, upstream's `log` (now our wrapper), wrapt's
frames when it runs without its C extension, and for `warning_once` one more frame of accelerate's own.
Every function here takes `depth`: how many frames stand between its caller and the wrapper, so that
the arithmetic lives in one place and each caller only counts its own frames.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ._upstream import UpstreamBody


_WARNING_CODE = logging.LoggerAdapter.warning.__code__
_ACCELERATE_LOGGING = os.path.join("accelerate", "logging.py")


def _frame_above_wrapper(body: UpstreamBody, depth: int):
    # 0 is this helper, 1 its caller here, 2 + depth the wrapper, 3 + depth the frame that called it.
    return sys._getframe(3 + depth + body.wrapper_frames)


def default_stacklevel(body: UpstreamBody, depth: int) -> int:
    """Upstream's default `stacklevel` (2: the frame above `log`), moved past `warning_once`.

    `depth`: frames between this function's caller and the wrapper (0: the wrapper calls it).
    """
    frame = _frame_above_wrapper(body, depth)  # the frame that called `log`
    if frame.f_code is _WARNING_CODE and frame.f_back is not None and frame.f_back.f_code is body.warning_once_code:
        return 3
    return 2


def caller_stacklevel(body: UpstreamBody, kwargs: dict[str, Any], log_depth: int) -> int:
    """The `stacklevel` for a `Logger.log` call made `log_depth` frames below the wrapper.

    Called by the wrapper itself. A user's own `stacklevel` counts from upstream's `log` frame, as
    upstream's does; the frames between the wrapper and the call to `Logger.log` are added.
    """
    return (kwargs.get("stacklevel") or default_stacklevel(body, 1)) + log_depth + body.wrapper_frames


def _is_adapter_frame(filename: str) -> bool:
    # logging's LoggerAdapter methods and accelerate's own adapter (`warning_once`).
    return filename == logging.__file__ or filename.endswith(_ACCELERATE_LOGGING)


def call_site(body: UpstreamBody, depth: int) -> tuple[str, str, int]:
    """(file name, function, line) of the user's code that called the logger: the same on every rank.

    `depth`: frames between this function's caller and the wrapper (0: the wrapper calls it).
    Only the call's identity across ranks; the record's own caller info comes from the logger.
    """
    frame = _frame_above_wrapper(body, depth)
    while frame is not None and _is_adapter_frame(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("?", "?", 0)
    return (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name, frame.f_lineno)


def one_frame_deeper(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` for a `Logger.log` call made one frame further from the user than planned."""
    kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
    return kwargs
