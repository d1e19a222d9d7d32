"""One in_order call, as the wrapper makes it: what the user logged, where from, and its bounds.

The wrapper makes one `InOrderCall` per in_order call; the session numbers it at its site and hands it to
its mode's side (`barrier.side.BarrierSide.call`, `gather.collector.GatherSide.call`), or logs it here at once
(`emit_at_once`). Every record is built the same way (`log_for_this_call`): through the user's own adapter
and logger, with a filter that sees only this call's record (`ThisCall`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from ._callsite import Identity, Site, counted_from_here
from ._diagnostics import warn_once
from ._origin import Origin


class LogArgs(NamedTuple):
    """The arguments of one `MultiProcessAdapter.log` call, as the wrapper got them (`in_order` and
    `main_process_only` taken out, `stacklevel` counted from the wrapper)."""

    adapter: Any
    level: int
    msg: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class InOrderCall:
    """One rank's in_order call.

    Attributes:
        site: the user's call site, the same on every rank.
        log: what the user logged.
        origin: this rank's rank and host, for its record.
        timeout: `ACCELERATE_INORDER_TIMEOUT` when the call began.
        count: how many times this process has called from `site` in its session, this one included
            (the session numbers it); with `site`, the call's identity.
    """

    site: Site
    log: LogArgs
    origin: Origin
    timeout: float
    count: int = 0

    @property
    def identity(self) -> Identity:
        """The call's identity in its mode: its site and its number there."""
        return (self.site, self.count)


class ThisCall:
    """A logger filter for one call: on this thread it stamps the record with `origin` (if any) and, with
    `keep`, keeps it and stops it before the handlers; other threads' records pass untouched.

    Appended last, for the duration of one call: the logger's own filters see the record as before.
    """

    def __init__(self, origin: Optional[Origin], keep: bool) -> None:
        self.origin, self.keep = origin, keep
        self.thread = threading.get_ident()
        self.record: Optional[logging.LogRecord] = None

    def filter(self, record: logging.LogRecord) -> bool:
        if threading.get_ident() != self.thread:
            return True
        if self.origin is not None:
            self.origin.stamp(record)
        if self.keep:
            self.record = record
        return not self.keep


def log_for_this_call(log: LogArgs, this_call: ThisCall) -> bool:
    """Log `log` through its adapter and logger as upstream's working path does, with `this_call` appended
    to the logger's filters meanwhile. False when the adapter's level drops it (nothing is logged).

    Raises what the adapter, the logger's filters or its handlers raise. `kwargs["stacklevel"]` counts
    from the wrapper, which this function is some frames below (`_callsite`: the frames are counted).
    """
    adapter = log.adapter
    if not adapter.isEnabledFor(log.level):
        return False
    msg, kwargs = adapter.process(log.msg, counted_from_here(log.kwargs))
    logger = adapter.logger
    logger.addFilter(this_call)
    try:
        logger.log(log.level, msg, *log.args, **kwargs)
    finally:
        logger.removeFilter(this_call)
    return True


def emit_at_once(call: InOrderCall) -> None:
    """Log `call`'s record on this rank now, as upstream's working path does. Never raises: a filter or
    handler that raises is said once per exception type."""
    try:
        log_for_this_call(call.log, ThisCall(call.origin, keep=False))
    except Exception as exc:
        warn_once(f"a log record could not be emitted: {exc!r}", key=("emit", type(exc)))
