"""One rank's `LogRecord` in gather mode: built by the rank's own logger, sent as JSON, rebuilt on the main process.

A rank's record is made by its real `Logger.log` call (`_call.log_for_this_call`), so level, filters,
caller, `extra`, `exc_info` and record factories behave as on the barrier path; the message is then
rendered and tagged (`[RANK n] `, led by `[host] ` on several hosts; before accelerate 1.13 the tag is
ours, added whatever the user's text begins with). On the wire the record is its attributes as JSON,
never code (those every record has by place, `FIELDS`): the store has no authentication, so the main
process checks what it reads and refuses anything else (`MalformedRecord`). A record over `MAX_RECORD`
bytes is cut, largest values first, and says so (`... [truncated 3.1 MB]`).
"""

from __future__ import annotations

import functools
import json
import json.scanner
import logging
import operator
import threading
from typing import Any, Optional

from .._call import LogArgs, ThisCall, log_for_this_call
from .._callsite import Identity
from .._origin import RANK_TAG, Origin


VERSION = 6
FIELDS = (
    "name", "msg", "levelname", "levelno", "pathname", "filename", "module", "exc_text", "stack_info", "lineno", "funcName",
    "created", "msecs", "relativeCreated", "thread", "threadName", "processName", "process", "rank", "hostname",
)  # fmt: skip
_BY_PLACE = frozenset(FIELDS)
MAX_RECORD = 4 * 1024 * 1024  # a record's bytes on the wire; past them it is cut (`shrink`)
SMALL = 256  # a value this short on the wire is never cut
_NOT_SENT = frozenset({"args", "exc_info", "message"})  # the message and traceback travel rendered
_RESERVED = frozenset(dir(logging.LogRecord))  # methods and dunders: never set from the wire
_IGNORED = _RESERVED | _BY_PLACE  # names in the object of others that a record never sends there
_KINDS = {  # what the main process relies on, with the types it needs (the usual first)
    "name": (str,), "msg": (str,), "levelno": (int,), "exc_text": (type(None), str), "stack_info": (type(None), str),
    "rank": (int,), "hostname": (str,),
}  # fmt: skip
_CHECKED = operator.itemgetter(*map(FIELDS.index, _KINDS))
_USUAL = tuple(kinds[0] for kinds in _KINDS.values())
_RANK = FIELDS.index("rank")
_HEAD = (int, int, str, str, int, dict)  # version, count, file, function, line, the other attributes
_EMPTY = dict.fromkeys((*FIELDS, "args", "exc_info"))
_PARSE = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # `json.loads`'s own scanner, bare
_TRACEBACKS = logging.Formatter()
Read = tuple[Identity, Optional[logging.LogRecord], str]  # its call, the record (None: nothing to print), thread


class MalformedRecord(ValueError):
    """Bytes read from a rank's queue that are not a record of this format (foreign or damaged)."""


@functools.lru_cache(maxsize=None)
def upstream_tags() -> bool:
    """Whether accelerate's `MultiProcessAdapter.process` writes the `[RANK n] ` tag itself (1.13 and later)."""
    import accelerate

    major, minor = (
        int("".join(c for c in part if c.isdigit()) or 0) for part in accelerate.__version__.split(".")[:2]
    )
    return (major, minor) >= (1, 13)


def capture(log: LogArgs, origin: Origin) -> Optional[logging.LogRecord]:
    """The record this rank's logger makes for the call, rendered and tagged; None when its level or filters drop it.

    Args:
        log: what the user logged. origin: this rank and its host.
    """
    this_call = ThisCall(origin, keep=True)
    log_for_this_call(log, this_call)
    record = this_call.record
    if record is not None:
        text, tag = message(record), RANK_TAG.format(origin.rank)
        if type(record) is not logging.LogRecord:  # a factory's `getMessage` would render the text once more
            record = logging.LogRecord.__new__(logging.LogRecord)
            record.__dict__.update(vars(this_call.record))
        if not (upstream_tags() and isinstance(record.msg, str) and record.msg.startswith(tag)):
            text = tag + text  # 1.13+: `process` wrote it (unless the adapter is not accelerate's)
        record.msg, record.args = (f"[{origin.hostname}] {text}" if origin.several_hosts else text), None
    return record


def message(record: logging.LogRecord) -> str:
    """The record's message with its args; a %-format that fails shows as text, not as a traceback."""
    try:
        return str(record.getMessage())
    except Exception as exc:
        return f"{_repr(record.msg)} % {_repr(record.args)} (could not be formatted: {type(exc).__name__}: {exc})"


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a __repr__ that raises must not cost the record
        return f"<{type(value).__qualname__} value could not be sent: repr() failed: {type(exc).__name__}>"


def _dumps(value: Any) -> bytes:
    """`value` as JSON in UTF-8, a lone surrogate as its own bytes: every str arrives code unit for code unit
    (`\\ud83d\\ude00` escapes would be read back as one character).
    """
    return json.dumps(value, separators=(",", ":"), default=_repr, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _data(value: Any) -> Any:
    """`value` if json can write it (non-data inside becomes its repr), else its repr."""
    try:
        _dumps(value)
        return value
    except (ValueError, TypeError, RecursionError):  # a cycle, a non-str key, an int too long
        return _repr(value)


def _attributes(record: logging.LogRecord) -> dict[str, Any]:
    """What of `record` travels: its attributes, the message rendered, the traceback as text, a tuple as its repr."""
    attributes = {  # json would write a tuple as a list: it travels as its repr
        k: _repr(v) if isinstance(v, tuple) else v for k, v in vars(record).items() if k not in _NOT_SENT
    }
    attributes.update(name=str(record.name), levelno=int(record.levelno), msg=message(record))
    if record.exc_info and not record.exc_text:
        attributes["exc_text"] = _TRACEBACKS.formatException(record.exc_info)
    for key in ("exc_text", "stack_info"):  # whatever a record factory put there, the main process gets text
        if not isinstance(attributes.get(key), (str, type(None))):
            attributes[key] = _repr(attributes[key])
    return attributes


def _wire(identity: Identity, attributes: Optional[dict[str, Any]]) -> bytes:
    """`[VERSION, site, count, FIELDS' values or null, {the other attributes}]` as bytes (docs/gather-mode.md)."""
    site, count = identity
    if attributes is None:  # the empty marker names its thread (the main process pairs a thread's calls in order)
        return _dumps([VERSION, list(site), count, None, {"threadName": threading.current_thread().name}])
    others = {} if attributes.keys() <= _BY_PLACE else {k: v for k, v in attributes.items() if k not in _BY_PLACE}
    return _dumps([VERSION, list(site), count, list(map(attributes.get, FIELDS)), others])


def encode(identity: Identity, record: Optional[logging.LogRecord]) -> tuple[bytes, int]:
    """`(bytes on the wire, size before a cut)`: the call's identity and the record (None: no record to print).

    A record whose message is longer than the cut is cut without being written whole first.

    Args:
        identity: `((file, function, line), count)`. record: as `capture` made it.
    """
    attributes = None if record is None else _attributes(record)
    if attributes is None or len(attributes["msg"]) <= MAX_RECORD:
        try:
            payload = _wire(identity, attributes)
            if len(payload) <= MAX_RECORD or attributes is None:
                return payload, len(payload)
        except (ValueError, TypeError, RecursionError):  # a cycle, a non-str key, an int too long: `shrink` mends it
            pass
    return shrink(identity, attributes or {})


def _size(value: Any) -> int:
    """`len(_dumps(value))`; a text longer than the cut, as its UTF-8 bytes and quotes (at most that: it is cut anyway)."""
    if type(value) is str and len(value) > MAX_RECORD:
        return len(value.encode("utf-8", "surrogatepass")) + 2
    return len(_dumps(value))


def shrink(identity: Identity, attributes: dict[str, Any], limit: int = MAX_RECORD) -> tuple[bytes, int]:
    """`(bytes, size before the cut)`: the record with its largest values cut (in `attributes`) until it takes
    at most `limit` bytes. A text ends with `... [truncated 12.3 MB]`; other data becomes a note, data json
    cannot write its repr. Name, level, rank and host stay.
    """
    attributes.update({k: _data(v) for k, v in attributes.items() if type(v) is not str})
    sizes = {k: _size(v) for k, v in attributes.items() if k not in ("name", "levelno", "rank", "hostname")}
    size = first = len(_wire(identity, {**attributes, **dict.fromkeys(sizes)})) + sum(sizes.values()) - 4 * len(sizes)
    for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if size <= limit or sizes[name] <= SMALL:
            break
        value, others = attributes[name], size - sizes[name]
        if isinstance(value, str):
            attributes[name] = _cut(value, max(SMALL, limit - others))
        else:
            attributes[name] = f"<{type(value).__qualname__} value of {size_text(sizes[name])} not sent: too large>"
        size = others + _size(attributes[name])
    if size > limit:  # thousands of small attributes: only what the main process needs is kept
        kept: dict[str, Any] = {k: attributes[k] for k in ("name", "levelno", "rank", "hostname") if k in attributes}
        kept["msg"] = _cut(str(attributes.get("msg", "")), SMALL) + " (its other attributes were not sent: too large)"
        attributes = kept
    payload = _wire(identity, attributes)
    return (payload if len(payload) <= limit else shrink(identity, attributes, limit)[0]), first


def _cut(text: str, budget: int) -> str:
    """`text` cut to take at most `budget` bytes as JSON with its marker, which says how much went."""
    room = max(2, budget - 40)
    keep = min(len(text), room - 2)  # its quotes
    while keep > 0:
        size = len(_dumps(text[:keep]))
        if size <= room:
            break
        keep = min(keep - 1, keep * room // size)
    lost = len(text[keep:].encode("utf-8", "surrogatepass"))
    return f"{text[:keep]}... [truncated {size_text(lost)}]"


def size_text(size: int) -> str:
    """A byte count as people read it: `12.3 MB`, or bytes below a tenth of a megabyte."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def read(payload: bytes, rank: int) -> Read:
    """`(identity, record or None, its thread's name)` from `encode`'s bytes read from `rank`'s queue; else `MalformedRecord`.

    Only JSON is parsed (UTF-8, lone surrogates passed, as `encode` writes it); the record must say it is `rank`'s, name its
    host, and hold what the main process relies on (name, level, message, traceback text) with their types.
    """
    try:
        text = payload.decode("utf-8", "surrogatepass")
        document, end = _PARSE(text, 0)
        if end != len(text):
            raise ValueError("more after it")
    except (ValueError, RecursionError, AttributeError, StopIteration) as exc:
        raise MalformedRecord(f"{len(payload)} bytes that are not JSON ({type(exc).__name__})") from None
    try:
        version, (file, function, line), count, values, others = document
    except (ValueError, TypeError) as exc:
        raise MalformedRecord(f"not a version-{VERSION} record of accelerate-inorder-fix ({exc})") from None
    kinds = tuple(map(type, (version, count, file, function, line, others)))
    if kinds != _HEAD or version != VERSION:
        shown = ", ".join(kind.__name__ for kind in kinds)
        raise MalformedRecord(f"not a version-{VERSION} record (version, count, call site, others: {shown})")
    if values is None:
        thread = others.get("threadName")
        return ((file, function, line), count), None, thread if type(thread) is str else ""
    if type(values) is not list or len(values) != len(FIELDS):
        raise MalformedRecord(f"its record is not {len(FIELDS)} values and an object")
    kinds = tuple(map(type, _CHECKED(values)))
    if kinds != _USUAL:
        for key, kind in zip(_KINDS, kinds):
            if kind not in _KINDS[key]:
                raise MalformedRecord(f"its record's {key!r} is a {kind.__name__}")
    if values[_RANK] != rank:
        raise MalformedRecord(f"its record's 'rank' is {values[_RANK]}, not the rank of its queue")
    attributes = _EMPTY.copy()  # sized for every field: no resize as they go in
    attributes.update(zip(FIELDS, values))
    if others:
        if not _NOT_SENT.isdisjoint(others):
            raise MalformedRecord("its record sends args or exc_info")
        attributes.update({k: others[k] for k in others.keys() - _IGNORED})
    record = logging.LogRecord.__new__(logging.LogRecord)
    record.__dict__ = attributes
    thread = attributes["threadName"]
    return ((file, function, line), count), record, thread if type(thread) is str else ""


def emit(record: logging.LogRecord) -> None:
    """Hand a record to the handlers of its logger here; its level was decided on its rank."""
    _logger(record.name).callHandlers(record)


@functools.lru_cache(maxsize=256)
def _logger(name: str) -> logging.Logger:
    return logging.getLogger(None if name == "root" else name)
