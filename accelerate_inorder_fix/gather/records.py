"""One rank's `LogRecord` in gather mode: built by the rank's own logger, carried as plain data.

The record is made by the rank's real `Logger.log` call, so caller file/line/function, `extra`,
`exc_info`, `stack_info`, a custom `makeRecord` or record factory and the logger's own level, filters
and `disabled` flag all behave exactly as on the barrier path. Only the last step differs: a filter
appended for the duration of the call keeps the record instead of letting this rank's handlers see it.
The main process later hands it to its own handlers.

On the wire a record is JSON, never code. The job's c10d store has no authentication: anything that can
reach the master port can write into a rank's queue, so whatever the main process reads there is
untrusted. JSON decoding builds only str, int, float, bool, None, lists and dicts: it runs no code and
imports nothing, whatever the bytes say. Bytes that are not a record of this format raise
`MalformedRecord`; the collector turns that into one warning and no record for the call.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

from .._callsite import one_frame_deeper


# The wire format's version: a main process refuses payloads of any other (nodes must run one release).
VERSION = 1

# Record attributes that arrive as data are JSON's own types, exactly (a subclass, e.g. an IntEnum,
# travels as its repr); a container nested deeper, or holding more items in all, travels as its repr.
_SCALARS = (str, int, float, bool, type(None))
MAX_DEPTH = 32
MAX_ITEMS = 100_000

# Names the main process's record must keep as LogRecord defines them (methods, dunders): a payload
# attribute with one of these names is dropped, never set on the record.
_RESERVED = frozenset(dir(logging.LogRecord))

# What the main process itself relies on when it emits a record (routing, level, message, traceback):
# a payload without it is refused; a record sent from a rank always has it.
_REQUIRED = {"name": (str,), "levelno": (int,), "msg": (str,)}
_TEXT = {"exc_text": (str, type(None)), "stack_info": (str, type(None))}

_TRACEBACKS = logging.Formatter()


class MalformedRecord(ValueError):
    """Bytes read from a rank's queue that are not a record of this format (foreign or damaged)."""


class _Catch:
    """A logger filter that, for one thread, keeps the record and stops it before the handlers.

    Other threads logging through the same logger meanwhile pass it untouched.
    """

    def __init__(self):
        self.thread = threading.get_ident()
        self.record = None

    def filter(self, record):
        if threading.get_ident() != self.thread:
            return True
        self.record = record
        return False


def capture(adapter, level, msg, args, kwargs):
    """The record this rank's logger makes for the call, or None when its level/filters drop it.

    Called by a function that the wrapper calls directly (as `_wrapper._emit` is), so the caller
    `stacklevel` in `kwargs` needs one more frame for this one.
    """
    if not adapter.isEnabledFor(level):
        return None
    msg, kwargs = adapter.process(msg, one_frame_deeper(dict(kwargs)))
    logger = adapter.logger
    catch = _Catch()
    # Appended last: the logger's own filters run first, and one that rejects stops the record here
    # exactly as it would stop it before the handlers.
    logger.addFilter(catch)
    try:
        logger.log(level, msg, *args, **kwargs)
    finally:
        logger.removeFilter(catch)
    return catch.record


def _message(record: logging.LogRecord) -> str:
    try:
        return str(record.getMessage())
    except Exception as exc:  # a bad %-format must still reach the main process, not vanish
        return f"{_repr(record.msg)} % {_repr(record.args)} (could not be formatted: {type(exc).__name__}: {exc})"


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a __repr__ that raises must not cost the record
        return f"<{type(value).__qualname__} object; repr() failed: {type(exc).__name__}>"


def _is_data(value: Any) -> bool:
    """True when `value` is JSON's own data: scalars, lists, and dicts with str keys, of those.

    Bounded in depth and size, so a self-referencing or huge container costs little: it is not data.
    """
    pending = [(value, 0)]
    items = 0
    while pending:
        item, depth = pending.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind not in (list, dict) or depth >= MAX_DEPTH:
            return False
        items += len(item)
        if items > MAX_ITEMS:
            return False
        if kind is dict:
            if not all(type(key) is str for key in item):
                return False
            item = item.values()
        pending.extend((child, depth + 1) for child in item)
    return True


def _as_data(value: Any) -> Any:
    """`value` itself when it is plain data, otherwise its repr (as `%s` in a format shows a tuple, say)."""
    return value if _is_data(value) else _repr(value)


def _record_data(record: logging.LogRecord) -> dict[str, Any]:
    """The record's attributes as plain data, ready for the main process's handlers.

    As `logging.handlers.QueueHandler.prepare` does: the message is merged with its args and the
    traceback is rendered here, on the rank that raised, since neither args nor traceback objects can
    travel to another process.
    """
    data = {
        key: value if type(value) in _SCALARS else _as_data(value)  # inline test: most values are scalars
        for key, value in record.__dict__.items()
        if key not in _RESERVED
    }
    data["name"] = str(record.name)
    data["levelno"] = int(record.levelno)  # a level may be an IntEnum: the main process compares ints
    data["msg"], data["args"] = _message(record), None
    if record.exc_info and not record.exc_text:
        data["exc_text"] = _TRACEBACKS.formatException(record.exc_info)
    data["exc_info"] = None
    data.pop("message", None)
    for key in _TEXT:  # whatever a record factory put there, the main process gets text (or None)
        if type(data.get(key)) not in _TEXT[key]:
            data[key] = _repr(data[key])
    return data


# ASCII-only output: every str survives, lone surrogates too (file names decoded with surrogateescape).
# One encoder for the process: it holds no state between calls, and building one per record costs more.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(document: dict[str, Any]) -> bytes:
    return _ENCODER.encode(document).encode("ascii")


def to_bytes(identity: tuple, record: Optional[logging.LogRecord]) -> bytes:
    """Serialise `(identity, record)` for the wire; `record` may be None (the "nothing" marker).

    `identity` is `((file name, function, line), count)`. A record attribute that is not plain data
    travels as its repr; one that cannot be written even then (an int too long for `str`) as a note
    saying so. The message always travels.
    """
    (filename, function, line), count = identity
    document = {"v": VERSION, "call": [[filename, function, line], count], "record": None}
    if record is None:
        return _dumps(document)
    data = document["record"] = _record_data(record)
    try:
        return _dumps(document)
    except ValueError:  # e.g. an int past the str-conversion limit: it cannot be written, say so
        for key, value in data.items():
            try:
                _dumps({key: value})
            except ValueError as exc:
                data[key] = f"<{type(value).__qualname__} value could not be sent: {exc}>"
        return _dumps(document)


def _identity(call: Any) -> tuple:
    if type(call) is list and len(call) == 2 and type(call[0]) is list and len(call[0]) == 3:
        (filename, function, line), count = call
        if type(filename) is str and type(function) is str and type(line) is int and type(count) is int:
            return (filename, function, line), count
    raise MalformedRecord("its call identity is not ((file, function, line), count)")


def _record(data: Any) -> logging.LogRecord:
    if type(data) is not dict:
        raise MalformedRecord("its record is not a JSON object")
    for key, kinds in _REQUIRED.items():
        if type(data.get(key)) not in kinds:
            raise MalformedRecord(f"its record's {key!r} is missing or not a {kinds[0].__name__}")
    for key, kinds in _TEXT.items():
        if type(data.get(key)) not in kinds:
            raise MalformedRecord(f"its record's {key!r} is not text")
    if not _RESERVED.isdisjoint(data):
        data = {key: value for key, value in data.items() if key not in _RESERVED}
    data["args"], data["exc_info"] = None, None
    return logging.makeLogRecord(data)


def from_bytes(payload: bytes) -> tuple[tuple, Optional[logging.LogRecord]]:
    """`(identity, LogRecord or None)` from `to_bytes` output.

    Only JSON is parsed: nothing in the payload is executed or imported. Anything else (serialised
    Python objects, truncated or foreign bytes, another version) raises `MalformedRecord`.
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise MalformedRecord(f"a payload of type {type(payload).__name__}, not bytes")
    try:
        document = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedRecord(f"{len(payload)} bytes that are not JSON ({type(exc).__name__})") from None
    if type(document) is not dict or type(document.get("v")) is not int or document["v"] != VERSION:
        raise MalformedRecord(f"not a version-{VERSION} record of accelerate-inorder-fix")
    identity = _identity(document.get("call"))
    data = document.get("record")
    return identity, (None if data is None else _record(data))


def emit(record: logging.LogRecord) -> None:
    """Hand a record to the main process's handlers for its logger (its level already decided)."""
    name = record.name
    logger = logging.getLogger() if name == "root" else logging.getLogger(name)
    logger.callHandlers(record)
