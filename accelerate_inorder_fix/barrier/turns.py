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


def emit(
    adapter: Any,
    level: int,
    msg: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    origin: Optional[Origin] = None,
) -> None:
    """Emit one record through the rank's own logger, exactly as upstream's working path does.

    `origin`: the record also gets `rank` and `hostname` attributes (its message is upstream's).
    """
    if not adapter.isEnabledFor(level):
        return
    stamping = None
    try:
        msg, kwargs = adapter.process(msg, _callsite.counted_from_here(kwargs))
        if origin is not None:
            stamping = Stamping(origin)
            adapter.logger.addFilter(stamping)
        adapter.logger.log(level, msg, *args, **kwargs)
    except Exception as exc:  # a filter or handler that raises must not skip the barrier after it
        warn_once(("emit", type(exc)), f"a log record could not be emitted: {exc!r}")
    finally:
        if stamping is not None:
            adapter.logger.removeFilter(stamping)


def _barrier(state: Any) -> bool:
    """Upstream's own synchronisation. False when it failed (the job is already broken)."""
    try:
        state.wait_for_everyone()
    except Exception as exc:
        warn_once(("barrier", type(exc)), f"in_order synchronisation failed, logging unordered: {exc!r}")
        return False
    return True


def take_turns(
    state: Any,
    adapter: Any,
    level: int,
    msg: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    first_turn: int,
    origin: Optional[Origin] = None,
) -> None:
    """A rank emits in its own turn, and every rank takes the barrier after each turn from `first_turn` on."""
    rank = state.process_index
    for turn in range(first_turn, state.num_processes):
        if turn == rank and rank != 0:
            emit(adapter, level, msg, args, kwargs, origin)
        if not _barrier(state):
            if turn < rank:  # our turn has not come: emit unordered rather than lose the record
                emit(adapter, level, msg, args, kwargs, origin)
            return


class Turns(Protocol):
    """A `go` call's turns after rank 0's (`handoff.Handoff`)."""

    def take_turns(self, emit: Callable[[], None]) -> None: ...


def barrier_call(
    state: Any,
    check_in: Callable[[], Union[str, Turns]],
    adapter: Any,
    level: int,
    msg: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    origin: Optional[Origin] = None,
) -> None:
    """One rank's in_order call in barrier mode: rank 0's turn, the check-in, then the other turns.

    Args:
        state: accelerate's `PartialState`.
        check_in (`Callable[[], str | Turns]`): checks this call in; the go's `Turns`, `"skip"` or `"plain"`
            (`side.BarrierSide`).
        adapter: the `MultiProcessAdapter` the user called; `level`, `msg`, `args`, `kwargs` as it got them.
        origin (`Origin`, *optional*): this rank's, set on its record as `rank` and `hostname`.
    """
    if state.process_index == 0:
        emit(adapter, level, msg, args, kwargs, origin)
    outcome = check_in()
    if not isinstance(outcome, str):
        outcome.take_turns(lambda: emit(adapter, level, msg, args, kwargs, origin))
    elif outcome == "skip":  # some rank will not come: nobody waits for anyone in this call
        if state.process_index != 0:
            emit(adapter, level, msg, args, kwargs, origin)
    else:
        take_turns(state, adapter, level, msg, args, kwargs, 0, origin)
