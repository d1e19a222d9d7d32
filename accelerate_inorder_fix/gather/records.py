"""One rank's `LogRecord` in gather mode: built by the rank's own logger, carried as plain data.

The record is made by the rank's real `Logger.log` call, so caller file/line/function, `extra`,
`exc_info`, `stack_info`, a custom `makeRecord` or record factory and the logger's own level, filters
and `disabled` flag all behave exactly as on the barrier path. Only the last step differs: a filter
appended for the duration of the call keeps the record instead of letting this rank's handlers see it.
The main process later hands it to its own handlers.
"""

from __future__ import annotations

import logging
import pickle
import threading

from .._callsite import one_frame_deeper


# Protocol 4 is understood by every Python this package supports, so nodes may differ in patch level.
PICKLE_PROTOCOL = 4

_TRACEBACKS = logging.Formatter()


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


def _message(record):
    try:
        return record.getMessage()
    except Exception as exc:  # a bad %-format must still reach the main process, not vanish
        return f"{record.msg!r} % {record.args!r} (could not be formatted: {exc!r})"


def to_bytes(identity, record):
    """Serialise `(identity, record)` for the wire; `record` may be None (the "nothing" marker).

    As `logging.handlers.QueueHandler.prepare` does: the message is merged with its args and the
    traceback is rendered here, on the rank that raised, since neither args nor traceback objects
    survive a trip to another process. Attributes that do not pickle travel as their repr.
    """
    if record is None:
        return pickle.dumps((identity, None), PICKLE_PROTOCOL)
    data = dict(record.__dict__)
    data["msg"], data["args"] = _message(record), None
    if record.exc_info and not record.exc_text:
        data["exc_text"] = _TRACEBACKS.formatException(record.exc_info)
    data["exc_info"] = None
    data.pop("message", None)
    try:
        return pickle.dumps((identity, data), PICKLE_PROTOCOL)
    except Exception:  # an `extra` value that does not pickle: send its repr instead
        for key, value in data.items():
            try:
                pickle.dumps(value, PICKLE_PROTOCOL)
            except Exception:
                data[key] = repr(value)
        return pickle.dumps((identity, data), PICKLE_PROTOCOL)


def from_bytes(payload):
    """`(identity, LogRecord or None)` from `to_bytes` output."""
    identity, data = pickle.loads(payload)
    return identity, (logging.makeLogRecord(data) if data is not None else None)


def emit(record):
    """Hand a record to the main process's handlers for its logger (its level already decided)."""
    name = record.name
    logger = logging.getLogger() if name == "root" else logging.getLogger(name)
    logger.callHandlers(record)
