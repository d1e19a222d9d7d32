"""Barrier mode's emit, and its calls without a check-in.

Each rank emits its own record through its own logger, exactly as upstream's working path does, at
most once whichever step of the call gets to it (`EmitOnce`). A call checked in through the job's
store is `side.BarrierSide.call`. Without a store to check in through, the N turns run between
upstream's own `wait_for_everyone()` barriers, as upstream's do (`PlainBarriers`); a process that is
not a rank, or whose exit began, emits at once (`AT_ONCE`).
"""

from __future__ import annotations

from typing import Any, Optional

from .._call import InOrderCall, LogArgs, ThisCall, log_for_this_call
from .._diagnostics import warn_once
from .._origin import Origin


class EmitOnce:
    """This rank's record of one in_order call, put out through its own logger by `emit`, at most once.

    Args:
        log: what the user logged.
        origin (`Origin`, *optional*): this rank's: the record also gets `rank` and `hostname` attributes
            (its message is upstream's).
    """

    def __init__(self, log: LogArgs, origin: Optional[Origin] = None) -> None:
        self.log, self.origin = log, origin
        self.out = False

    def emit(self) -> None:
        """Put the record out, unless an earlier step did. A filter or handler that raises is said once:
        the call's turns and barriers after it must still run."""
        if self.out:
            return
        self.out = True
        try:
            log_for_this_call(self.log, ThisCall(self.origin, keep=False))
        except Exception as exc:
            warn_once(f"a log record could not be emitted: {exc!r}", key=("emit", type(exc)))


class AtOnce:
    """A call that waits for nobody: its record goes out at once."""

    def call(self, call: InOrderCall) -> None:
        EmitOnce(call.log, call.origin).emit()


AT_ONCE = AtOnce()


def _barrier(state: Any) -> bool:
    """Upstream's own synchronisation. False when it failed (the job is already broken)."""
    try:
        state.wait_for_everyone()
    except Exception as exc:
        warn_once(f"in_order synchronisation failed, logging unordered: {exc!r}", key=("barrier", type(exc)))
        return False
    return True


class PlainBarriers:
    """A job without a c10d store: the call's N turns, each followed by upstream's barrier on every rank.

    Args:
        state: accelerate's `PartialState`.
    """

    def __init__(self, state: Any) -> None:
        self.state = state

    def call(self, call: InOrderCall) -> None:
        """A rank emits in its own turn, and every rank takes the barrier after each turn."""
        record = EmitOnce(call.log, call.origin)
        for turn in range(self.state.num_processes):
            if turn == self.state.process_index:
                record.emit()
            if not _barrier(self.state):
                record.emit()  # unless our turn came already: emit unordered rather than lose the record
                return
