"""Barrier mode's one emit of a record, and the calls without a check-in (at once, or plain barriers).

`emit_at_once` is the one place barrier mode logs its rank's record, through its own logger as
upstream's working path does, never raising into user code. Without a store to check in through, the
N turns run between upstream's `wait_for_everyone()` barriers (`PlainBarriers`).
"""

from __future__ import annotations

from typing import Any

from .._call import InOrderCall, ThisCall, log_for_this_call
from .._diagnostics import warn_once


def emit_at_once(call: InOrderCall) -> None:
    """Log `call`'s record on this rank now; a filter or handler that raises is said once."""
    try:
        log_for_this_call(call.log, ThisCall(call.origin, keep=False))
    except Exception as exc:
        warn_once(f"a log record could not be emitted: {exc!r}", key=("emit", type(exc)))


class AtOnce:
    """A call that waits for nobody: its record goes out at once."""

    def call(self, call: InOrderCall) -> None:
        emit_at_once(call)


AT_ONCE = AtOnce()


class PlainBarriers:
    """A job without a c10d store: the call's N turns, each followed by upstream's barrier on every rank.

    Args:
        state: accelerate's `PartialState`.
    """

    def __init__(self, state: Any) -> None:
        self.state = state

    def call(self, call: InOrderCall) -> None:
        for turn in range(self.state.num_processes):
            if turn == self.state.process_index:
                emit_at_once(call)
            try:
                self.state.wait_for_everyone()
            except Exception as exc:
                warn_once(f"in_order synchronisation failed, logging unordered: {exc!r}", key=("barrier", type(exc)))
                if turn < self.state.process_index:
                    emit_at_once(call)  # its turn had not come: unordered rather than lost
                return
