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

Every record says where it comes from (`_origin.Origin`): its `rank` and `hostname` attributes, and,
in its message, the `[RANK n] ` tag accelerate 1.13+ gives (added here on older releases), led by
`[host] ` on a job over several hosts. A record read from rank r's queue must say `rank` r and name a host.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Union

from .._call import LogArgs, ThisCall, log_for_this_call
from .._callsite import Identity
from .._origin import Origin


# The wire format's version: a main process refuses payloads of any other (nodes must run one release).
# Version 2: a record is a JSON list in a fixed order (`FIELDS`, then an object of the rest), not an
# object: names are not sent with every record, and the main process decodes each several times faster.
# Version 3: a record read from a rank's queue carries its `rank` and `hostname` (`Origin`).
VERSION = 3

# The attributes every LogRecord has, sent by position.
FIELDS = (
    "name", "levelno", "msg", "levelname", "pathname", "filename", "module", "lineno", "funcName", "created",
    "msecs", "relativeCreated", "thread", "threadName", "processName", "process", "exc_text", "stack_info",
)  # fmt: skip

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
_CHECKED = [(FIELDS.index(key), key, kinds) for key, kinds in {**_REQUIRED, **_TEXT}.items()]
_NAME, _LEVELNO, _MSG, _EXC_TEXT = (FIELDS.index(key) for key in ("name", "levelno", "msg", "exc_text"))
_TEXT_AT = [(FIELDS.index(key), kinds) for key, kinds in _TEXT.items()]
_SCALAR_SET = frozenset(_SCALARS)
_CHECKED += [(len(FIELDS), "args", (type(None),)), (len(FIELDS) + 1, "exc_info", (type(None),))]

# The main process builds a record as a blank LogRecord and the payload's attributes: `FIELDS` by
# position, `args` and `exc_info` None (the message and traceback arrive rendered), then the others.
_NEW_RECORD = logging.LogRecord.__new__
_ATTRIBUTES = (*FIELDS, "args", "exc_info")
_NOT_EXTRA = _RESERVED | set(_ATTRIBUTES)
_NOT_OTHER = _NOT_EXTRA | {"message"}  # what a rank does not send among the others

_TRACEBACKS = logging.Formatter()


class MalformedRecord(ValueError):
    """Bytes read from a rank's queue that are not a record of this format (foreign or damaged)."""


def capture(log: LogArgs, origin: Optional[Origin] = None) -> Optional[logging.LogRecord]:
    """The record this rank's logger makes for the call, or None when its level/filters drop it.

    Made by the rank's own logger and kept before its handlers (`_call.log_for_this_call`). `origin`:
    the message is tagged (after upstream's `process`, as 1.13+ tags it) and the record stamped.
    """
    this_call = ThisCall(origin, keep=True)
    log_for_this_call(log, this_call, tag=True)
    return this_call.record


def _message(record: logging.LogRecord) -> str:
    try:
        return str(record.getMessage())
    except Exception as exc:  # a bad %-format must still reach the main process, not vanish
        return f"{_repr(record.msg)} % {_repr(record.args)} (could not be formatted: {type(exc).__name__}: {exc})"


def settle_message(record: logging.LogRecord) -> None:
    """The main process's own record, made printable as a rank's is sent: a message whose %-format fails
    becomes the text `_message` gives, with no args, instead of a `--- Logging error ---` in a handler.

    Args:
        record: left as it is when its message formats.
    """
    try:
        record.getMessage()
    except Exception:
        record.msg, record.args = _message(record), None


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


def _record_values(record: logging.LogRecord) -> list[Any]:
    """The record as plain data in wire order: `FIELDS`, `args` and `exc_info` (None), then the others.

    As `logging.handlers.QueueHandler.prepare` does: the message is merged with its args and the
    traceback is rendered here, on the rank that raised, since neither args nor traceback objects can
    travel to another process.
    """
    attributes = record.__dict__
    values = [attributes.get(field) for field in FIELDS]
    if not _SCALAR_SET.issuperset(map(type, values)):  # one C-level test: most records hold only scalars
        values = [value if type(value) in _SCALARS else _as_data(value) for value in values]
    values[_NAME] = str(record.name)
    values[_LEVELNO] = int(record.levelno)  # a level may be an IntEnum: the main process compares ints
    values[_MSG] = _message(record)
    if record.exc_info and not record.exc_text:
        values[_EXC_TEXT] = _TRACEBACKS.formatException(record.exc_info)
    for place, kinds in _TEXT_AT:  # whatever a record factory put there, the main process gets text (or None)
        if type(values[place]) not in kinds:
            values[place] = _repr(values[place])
    others = {
        key: value if type(value) in _SCALARS else _as_data(value)
        for key, value in attributes.items()
        if key not in _NOT_OTHER
    }
    values += [None, None, others]
    return values


# ASCII-only output: every str survives, lone surrogates too (file names decoded with surrogateescape).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _c_encoder() -> Any:
    """json's C encoder, made once, or None where this Python has none (or one of another signature).

    `JSONEncoder.encode` makes a new one in every call, which costs as much as encoding a short record;
    a rank encodes two documents per in_order call. Made without a circular-reference check (markers
    None), so it keeps no state between calls: everything encoded here is plain data from
    `_record_values`, whose containers `_is_data` has bounded in depth and size.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        return make(None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    except TypeError:
        return None


_C_ENCODER = _c_encoder()


def dumps(document: Any) -> bytes:
    """`document` as the ASCII JSON bytes `json.dumps(document, separators=(",", ":"))` gives."""
    if _C_ENCODER is None:
        return _ENCODER.encode(document).encode("ascii")
    return "".join(_C_ENCODER(document, 0)).encode("ascii")


def to_bytes(identity: Identity, record: Optional[logging.LogRecord]) -> bytes:
    """Serialise `(identity, record)` for the wire; `record` may be None (the "nothing" marker).

    `identity` is `((file name, function, line), count)`. A record attribute that is not plain data
    travels as its repr; one that cannot be written even then (an int too long for `str`) as a note
    saying so. The message always travels.
    """
    return encode(identity, record)[0]


def encode(identity: Identity, record: Optional[logging.LogRecord]) -> tuple[bytes, list[Any]]:
    """`(to_bytes(identity, record), the plain-data document those bytes are)`."""
    (filename, function, line), count = identity
    if record is None:
        document = [VERSION, [filename, function, line], count, None]
        return dumps(document), document
    values = _record_values(record)
    document = [VERSION, [filename, function, line], count, values]
    try:
        return dumps(document), document
    except ValueError:  # e.g. an int past the str-conversion limit: it cannot be written, say so
        extras = values[-1]
        for place, value in [*enumerate(values[:-1]), *extras.items()]:  # positions, then extras' names
            try:
                dumps(value)
            except ValueError as exc:
                note = f"<{type(value).__qualname__} value could not be sent: {exc}>"
                (values if type(place) is int else extras)[place] = note
        return dumps(document), document


def _identity(call: Any, count: Any) -> Identity:
    if type(call) is list and len(call) == 3 and type(count) is int:
        filename, function, line = call
        if type(filename) is str and type(function) is str and type(line) is int:
            return (filename, function, line), count
    raise MalformedRecord("its call identity is not ((file, function, line), count)")


def _check_origin(extras: dict[str, Any], rank: Optional[int]) -> None:
    """A record read from `rank`'s queue must say it is `rank`'s and name its host (anywhere else: if it says)."""
    if rank is None and "rank" not in extras and "hostname" not in extras:
        return
    sender, host = extras.get("rank"), extras.get("hostname")
    if type(sender) is not int or (rank is not None and sender != rank):
        raise MalformedRecord(f"its record's 'rank' is {_repr(sender)}, not the rank of its queue ({rank})")
    if type(host) is not str:
        raise MalformedRecord(f"its record's 'hostname' is {_repr(host)}, not a str")


def _record(values: Any, rank: Optional[int] = None) -> logging.LogRecord:
    if type(values) is not list or len(values) != len(FIELDS) + 3 or type(values[-1]) is not dict:
        raise MalformedRecord(f"its record is not a list of {len(FIELDS) + 2} fields and an object")
    for place, key, kinds in _CHECKED:
        if type(values[place]) not in kinds:
            raise MalformedRecord(f"its record's {key!r} is not a {kinds[0].__name__}")
    extras = values[-1]
    _check_origin(extras, rank)
    attributes = dict(zip(_ATTRIBUTES, values))  # FIELDS, then args and exc_info: None
    if extras:
        attributes.update({key: value for key, value in extras.items() if key not in _NOT_EXTRA})
    return rebuild(attributes)


def rebuild(attributes: dict[str, Any]) -> logging.LogRecord:
    """A `LogRecord` whose attributes are `attributes` (the dict itself, not a copy): a blank record, since
    `LogRecord.__init__` would compute again what the rank's record already says (time, thread, caller)."""
    record = _NEW_RECORD(logging.LogRecord)
    record.__dict__ = attributes
    return record


def from_document(document: Any, rank: Optional[int] = None) -> tuple[Identity, Optional[logging.LogRecord]]:
    """`(identity, LogRecord or None)` from a parsed payload; `MalformedRecord` if it is not one.

    `rank`: the queue it was read from; its record must carry `rank` (that one) and `hostname`.
    """
    if type(document) is not list or len(document) != 4 or type(document[0]) is not int or document[0] != VERSION:
        raise MalformedRecord(f"not a version-{VERSION} record of accelerate-inorder-fix")
    identity = _identity(document[1], document[2])
    data = document[3]
    return identity, (None if data is None else _record(data, rank))


def from_bytes(payload: bytes, rank: Optional[int] = None) -> tuple[Identity, Optional[logging.LogRecord]]:
    """`(identity, LogRecord or None)` from `to_bytes` output (`rank`: as `from_document`).

    Only JSON is parsed: nothing in the payload is executed or imported. Anything else (serialised
    Python objects, truncated or foreign bytes, another version) raises `MalformedRecord`.
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise MalformedRecord(f"a payload of type {type(payload).__name__}, not bytes")
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedRecord(f"{len(payload)} bytes that are not JSON ({type(exc).__name__})") from None
    return from_document(document, rank)


def decode(
    payload: bytes, rank: Optional[int] = None
) -> Union[tuple[Identity, Optional[logging.LogRecord]], MalformedRecord]:
    """`from_bytes(payload, rank)`, or the `MalformedRecord` saying why it is not a record (returned, not raised)."""
    try:
        return from_bytes(payload, rank)
    except MalformedRecord as exc:
        return exc


def logger_for(record: logging.LogRecord) -> logging.Logger:
    """The main process's logger of `record`'s name, whose handlers it goes to."""
    name = record.name
    # The logger exists already (made by this process's own in_order call or its configuration) in all
    # but the first call: read it without `getLogger`'s module lock.
    logger = logging.root if name == "root" else logging.Logger.manager.loggerDict.get(name)
    return logger if isinstance(logger, logging.Logger) else logging.getLogger(name)


def emit(record: logging.LogRecord) -> None:
    """Hand a record to the main process's handlers for its logger (its level already decided)."""
    logger_for(record).callHandlers(record)


# The most bytes a rank's record may take on the wire. TCPStore refuses a request over 8 MiB
# (8,388,608 bytes) and resets the rank's connection, after which that rank could send nothing more;
# a record travels in two requests (its copy and its key), each a few dozen bytes longer than the
# record. Half the store's limit leaves room for both and for whatever a later torch adds.
MAX_PAYLOAD = 4 * 1024 * 1024
_SMALL = 256  # a value at most this long on the wire is left whole by `shrink`
_TWO_BYTE_ESCAPES = ('"', "\\", "\n", "\r", "\t")
_KEPT_EXTRAS = ("rank", "hostname")  # what the main process checks on every record (`_check_origin`)


def size_text(size: int) -> str:
    """A byte count as people read it: `12.3 MB` (decimal), or bytes below a tenth of a megabyte."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def _cut(text: str, budget: int) -> str:
    """`text` cut so that, with its marker, it takes at most `budget` bytes as JSON; the marker says how much went.

    The JSON escaping of a character takes 1 to 12 bytes, so the cut is found in a few tries, each
    scaling the prefix by how far its encoded length overshot.
    """
    room = budget - 40  # the marker's own bytes
    keep = min(len(text), room)
    while keep > 0:
        size = len(dumps(text[:keep]))
        if size <= room:
            break
        keep = min(keep - 1, keep * room // size)
    lost = len(text[keep:].encode("utf-8", "surrogatepass"))
    return f"{text[:keep]}... [truncated {size_text(lost)}]"


def shrink(document: list[Any], size: int, limit: int = MAX_PAYLOAD) -> bytes:
    """Cut `document`'s record (in place) until it encodes in at most `limit` bytes; those bytes.

    The largest values go first: a text is cut and ends with `... [truncated 12.3 MB]`; other data
    (a long list in `extra`) is replaced by a note saying so. What the main process relies on (the
    record's name, level, origin) is never cut. Each value is encoded once to learn its size, and
    the record once more at the end (`size`: its encoded size now, known from the caller's `encode`).

    Args:
        document: from `encode`; its record's values are replaced where cut.
        size: `len(dumps(document))`.
        limit: the most bytes the result may take.
    """
    values = document[3]
    if values is None:
        return dumps(document)
    extras = values[-1]
    places: list[Union[int, str]] = [_MSG, _EXC_TEXT, FIELDS.index("stack_info"), *extras]
    sizes = {place: _encoded_size(values[place] if type(place) is int else extras[place]) for place in places}
    for kept in _KEPT_EXTRAS:
        sizes.pop(kept, None)
    for place in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if size <= limit or sizes[place] <= _SMALL:
            break
        holder: Any = values if type(place) is int else extras
        value = holder[place]
        if type(value) is str:
            holder[place] = _cut(value, max(_SMALL, sizes[place] - (size - limit)))
        else:
            holder[place] = f"<{type(value).__qualname__} value of {size_text(sizes[place])} not sent: too large>"
        size += len(dumps(holder[place])) - sizes[place]
    if size > limit:  # thousands of small extras: only what the main process needs is kept
        values[-1] = {key: extras[key] for key in _KEPT_EXTRAS if key in extras}
        values[_MSG] = _cut(values[_MSG], _SMALL) + " (its other attributes were not sent: too large)"
    payload = dumps(document)
    # An ASCII text's size was taken as its length: escapes (quotes, control characters) make it more.
    return payload if len(payload) <= limit else shrink(document, len(payload), limit)


def _encoded_size(value: Any) -> int:
    """`len(dumps(value))`; for ASCII text, counted without encoding it (at most the true size).

    A rank's record over the limit is encoded once already; encoding its 20 MB message again to
    learn its size would double what the oversized call costs the rank.
    """
    if type(value) is str and value.isascii():  # escaped: these take two bytes, other control characters six
        return len(value) + 2 + sum(map(value.count, _TWO_BYTE_ESCAPES))
    return len(dumps(value))
