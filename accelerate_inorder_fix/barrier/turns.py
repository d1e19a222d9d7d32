"""Barrier mode without a c10d store: the N turns between upstream's own `wait_for_everyone()` barriers.

A job whose process group has no c10d store (a backend torch.distributed does not run) cannot check in;
its in_order calls run as upstream's do, each rank's record through `_call.emit_at_once` in its turn.
"""

from __future__ import annotations

from typing import Any

from .._call import InOrderCall, emit_at_once
from .._diagnostics import warn_once


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
