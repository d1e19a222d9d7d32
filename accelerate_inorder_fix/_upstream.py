"""The upstream `MultiProcessAdapter.log` bodies this package was tested against, and what the wrapper
must know about the installed one.

The fingerprint is taken from the installed source, not from `accelerate.__version__`: a fork or a
vendored copy may carry any version string, and only the code tells what the patch would replace.
Comments, blank lines, indentation and the docstring do not count; every other token does.

`UpstreamBody` is everything the wrapper needs about the installed accelerate, computed once when the
patch is installed and bound into the wrapper as one frozen value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import io
import sys
import textwrap
import tokenize
from types import CodeType, FrameType
from typing import Any, Callable, Optional

import wrapt


# fingerprint -> the upstream releases that ship that exact body (checked against every tag).
KNOWN_BODIES = {
    "de4f5bcfc04522c7": "0.20.0-0.30.0",
    "301aa7733fb21c20": "0.30.1-1.12.x",
    "f2af81207b574031": "1.13.0-1.16.x",
}

_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def fingerprint_source(source: str) -> str:
    """Fingerprint the source text of one function definition."""
    tokens = [
        t for t in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline) if t.type not in _SKIPPED
    ]
    # Drop the docstring: the first token after the signature's closing ':' when it is a string
    # that stands alone as a statement.
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.string in "([{":
            depth += 1
        elif tok.string in ")]}":
            depth -= 1
        elif tok.string == ":" and depth == 0:
            if i + 1 < len(tokens) and tokens[i + 1].type == tokenize.STRING:
                del tokens[i + 1]
            break
    text = " ".join(tok.string for tok in tokens)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def fingerprint(func: Callable[..., Any]) -> Optional[str]:
    """Fingerprint a function object, or return None when its source cannot be read."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    try:
        return fingerprint_source(source)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def known_release_line(func: Callable[..., Any]) -> Optional[str]:
    """The upstream release line whose `log` body `func` is, or None when it is not one we know."""
    found = fingerprint(func)
    return None if found is None else KNOWN_BODIES.get(found)


@dataclasses.dataclass(frozen=True)
class UpstreamBody:
    """What the wrapper must know about the installed `log`.

    Args:
        release_line: the upstream releases with this exact body, or None when it is unknown (forced).
        wrapper_frames: Python frames a wrapt method wrapper puts between the method's caller and the
            wrapper: 0 with wrapt's C extension, more with its pure-Python fallback.
        warning_once_code: code object of upstream's `warning_once` (None before 0.24): one frame of
            accelerate's own between the user and `log`, which upstream reports as the caller.
        stacked: another library's wrapper sits on `log` beneath ours; its plain calls must reach it.
    """

    release_line: Optional[str]
    wrapper_frames: int = 0
    warning_once_code: Optional[CodeType] = None
    stacked: bool = False

    @property
    def known(self) -> bool:
        return self.release_line is not None

    @property
    def restatable(self) -> bool:
        """The wrapper may restate the plain path instead of calling down: a known body, nobody between."""
        return self.known and not self.stacked


def count_wrapper_frames() -> int:
    """How many Python frames a wrapt method wrapper adds between a method's caller and the wrapper."""

    class Probe:
        def method(self) -> int:
            return 0

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> int:
        frame: Optional[FrameType] = sys._getframe(1)
        depth = 0
        while frame is not None and frame.f_code is not call_probe.__code__:
            frame = frame.f_back
            depth += 1
        return depth

    def call_probe() -> int:
        return Probe().method()

    wrapt.wrap_function_wrapper(Probe, "method", wrapper)
    return call_probe()


def body_of(adapter_class: type) -> UpstreamBody:
    """The `UpstreamBody` of `adapter_class.log` as installed now (not yet wrapped by us)."""
    original = adapter_class.__dict__.get("log")
    warning_once = getattr(adapter_class.__dict__.get("warning_once"), "__wrapped__", None)
    return UpstreamBody(
        release_line=known_release_line(original) if original is not None else None,
        wrapper_frames=count_wrapper_frames(),
        warning_once_code=getattr(warning_once, "__code__", None),
        stacked=hasattr(original, "__wrapped__"),
    )
