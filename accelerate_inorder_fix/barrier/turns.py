"""Barrier mode's turns: each rank emits through its own logger, in rank order.

Rank 0's turn comes first whatever the verdict: it emits before it checks the call in, so that a `go`,
which every rank reads after rank 0's check-in, also says rank 0's record is out. Then, on `go` (a
`Turns` from the check-in), the other ranks take their turns point to point through the job's store
(`handoff`): no collective. On `skip` each rank emits at once. On `plain` (no store to check in
through) the N turns run between upstream's own `wait_for_everyone()` barriers, as upstream's do.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Union

from .. import _callsite
from .._diagnostics import warn_once
from .._origin import Origin, Stamping


class Record:
    """This rank's record of one in_order call, emitted through its own logger exactly as upstream's working
    path does: out at most once, whichever step gets to it first (its turn in the check-in or after it,
    a skip, a failure).

    Args:
        adapter: the `MultiProcessAdapter` the user called; `level`, `msg`, `args`, `kwargs` as it got them.
        origin (`Origin`, *optional*): this rank's: the record also gets `rank` and `hostname` attributes
            (its message is upstream's).
    """

    def __init__(
        self,
        adapter: Any,
        level: int,
        msg: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        origin: Optional[Origin] = None,
    ) -> None:
        self.adapter, self.level, self.msg, self.args, self.kwargs = adapter, level, msg, args, kwargs
        self.origin = origin
        self.out = False

    def __call__(self) -> None:
        if not self.out:
            self.out = True
            self._emit()

    def _emit(self) -> None:
        adapter = self.adapter
        if not adapter.isEnabledFor(self.level):
            return
        stamping = None
        try:
            msg, kwargs = adapter.process(self.msg, _callsite.counted_from_here(self.kwargs))
            if self.origin is not None:
                stamping = Stamping(self.origin)
                adapter.logger.addFilter(stamping)
            adapter.logger.log(self.level, msg, *self.args, **kwargs)
        except Exception as exc:  # a filter or handler that raises must not skip the barrier after it
            warn_once(f"a log record could not be emitted: {exc!r}", key=("emit", type(exc)))
        finally:
            if stamping is not None:
                adapter.logger.removeFilter(stamping)


def _barrier(state: Any) -> bool:
    """Upstream's own synchronisation. False when it failed (the job is already broken)."""
    try:
        state.wait_for_everyone()
    except Exception as exc:
        warn_once(f"in_order synchronisation failed, logging unordered: {exc!r}", key=("barrier", type(exc)))
        return False
    return True


def take_turns(state: Any, record: Callable[[], None]) -> None:
    """Without a store: a rank emits in its own turn, and every rank takes the barrier after each turn."""
    for turn in range(state.num_processes):
        if turn == state.process_index:
            record()
        if not _barrier(state):
            record()  # unless our turn came already: emit unordered rather than lose the record
            return


class Turns(Protocol):
    """A `go` call's turns after rank 0's (`handoff.Handoff`)."""

    def take_turns(self, record: Callable[[], None]) -> None: ...


def barrier_call(state: Any, check_in: Callable[[], Union[str, Turns]], record: Record) -> None:
    """One rank's in_order call in barrier mode: rank 0's turn, the check-in, then the other turns.

    Args:
        state: accelerate's `PartialState`.
        check_in (`Callable[[], str | Turns]`): checks this call in, and may take this rank's turn with
            `record` then (`handoff.turn_on_wake`); the go's `Turns`, `"skip"` or `"plain"` (`side.BarrierSide`).
        record (`Record`): this rank's record of the call.
    """
    if state.process_index == 0:
        record()
    outcome = check_in()
    if not isinstance(outcome, str):
        outcome.take_turns(record)
    elif outcome == "skip":  # some rank will not come: nobody waits for anyone in this call
        record()
    else:
        take_turns(state, record)
