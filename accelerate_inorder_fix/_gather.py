"""Gather mode (`ACCELERATE_INORDER_MODE=gather`): one writer, nobody but it waits, every wait bounded.

Each rank builds its own record with its own logger (`_records`), drops it if its own level or
filters do, and posts it -- or an empty marker, so the main process need not wait for it -- to its
queue in the job's c10d store (`_transport`). It returns at once. The main process, at its own call,
collects that call's records from every rank and emits them in rank order through its handlers
(`_collector`), waiting at most `ACCELERATE_INORDER_TIMEOUT` seconds for absent ones.

Jobs with no c10d store (a backend torch.distributed does not run) fall back to barrier mode, with
one warning.
"""

import atexit
import collections
import logging
import os
import sys

from accelerate.state import PartialState

from . import _collector, _config, _records, _transport

_state = {"decided": False, "usable": False, "store": None, "outbox": None, "collector": None, "logger": None}
_counts = collections.Counter()


def _warn(text):
    from ._inorder import _warn_once

    _warn_once(("gather", text), text)


def usable():
    """True when gather mode can run in this job; otherwise barrier mode, after one warning."""
    if not _state["decided"]:
        _state["decided"] = True
        state = PartialState()
        store, reason = _transport.open_store(_config.timeout())
        if store is None:
            _warn(f"gather mode needs a torch.distributed c10d store ({reason}); using barrier mode")
        else:
            _state["store"], _state["usable"] = store, True
            if state.is_main_process:
                inbox = _transport.Inbox(store, state.num_processes)
                _state["collector"] = _collector.Collector(inbox, state.num_processes, _config.timeout(), _warning)
            else:
                _state["outbox"] = _transport.Outbox(store, state.process_index)
            atexit.register(_at_exit)
    return _state["usable"]


def _adapter_frame(filename):
    # Frames between the user's code and the wrapper: logging's LoggerAdapter methods, accelerate's
    # own adapter (`warning_once`).
    return filename == logging.__file__ or filename.endswith(os.path.join("accelerate", "logging.py"))


def _call_site():
    """(file name, function, line) of the code that called the logger: the same on every rank.

    Only the call's identity across ranks; the record's own caller info comes from the logger.
    """
    from . import _inorder

    # This function, `log`, the wrapper, then wrapt's frames if it runs without its C extension.
    frame = sys._getframe(3 + _inorder.wrapper_frames)
    while frame is not None and _adapter_frame(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("?", "?", 0)
    return (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name, frame.f_lineno)


def _warning(text):
    """The main process's warning about a block: to its stream, through the in_order logger."""
    record = _collector.warning_record(_state["logger"] or "root", text)
    try:
        _records.emit(record)
    except Exception as exc:  # a broken handler: say it on stderr rather than lose it
        _warn(f"{text} (handler failed: {exc!r})")


def log(adapter, level, msg, args, kwargs):
    """One rank's in_order call in gather mode. Called directly by the wrapper (`_inorder`)."""
    site = _call_site()
    _counts[site] += 1
    identity = (site, _counts[site])
    try:
        record = _records.capture(adapter, level, msg, args, kwargs)
    except Exception as exc:  # a filter or formatter that raises: the call still counts, as a marker
        _warn(f"a log record could not be built: {exc!r}")
        record = None
    collector = _state["collector"]
    if collector is not None:
        _state["logger"] = adapter.logger.name
        collector.timeout = _config.timeout()  # `configure(timeout=...)` may come after the first call
        try:
            collector.block(identity, record)
        except Exception as exc:  # the store went away: emit our own record, never raise
            _warn(f"gather mode could not collect the other ranks' records: {exc!r}")
            if record is not None:
                _records.emit(record)
        return None
    try:
        if _state["outbox"] is None:  # at exit, after our connection closed: nobody would read it
            raise RuntimeError("the process is exiting")
        _state["outbox"].post(_records.to_bytes(identity, record))
    except Exception as exc:  # undeliverable: print it here rather than lose it
        _warn(f"gather mode could not send a record to the main process, printing it locally: {exc!r}")
        if record is not None:
            _records.emit(record)
    return None


def _at_exit():
    """Main process: emit what was delivered and not yet emitted. Every rank: close our connection.

    Closing it here, while the store's server is certainly up, rather than at interpreter teardown,
    keeps our connection out of the launcher's shutdown.
    """
    collector = _state["collector"]
    if collector is not None:
        try:
            collector.flush()
        except Exception as exc:  # the store is gone at exit: nothing more can be delivered
            _warn(f"gather mode could not flush records at exit: {exc!r}")
    _state.update(store=None, outbox=None, collector=None)
