"""The contract: what `MultiProcessAdapter.log` does once patched.

A collective must be reached by every rank on the same control path, whatever that rank will print.
Upstream puts the in_order barriers behind rank-local conditions (`_should_log`, `isEnabledFor`), so a
rank that prints nothing skips them and the job deadlocks or desynchronises. Here the synchronisation
comes first and unconditionally; each rank's own level, filters and handlers only decide whether it
emits its record in its turn.

- `in_order=False`: upstream's own behaviour, restated for the known bodies (no extra frame).
- `in_order=True`: a collective call on every rank; `main_process_only` is ignored (as in 1.13+).
  Barrier mode checks the call in through the job's store (`gather.GATHER.check_in`), then, when every
  rank has made it, takes N turns of upstream's `wait_for_everyone()`; when some rank has not within
  the timeout, nobody enters a barrier and each rank emits at once. Gather mode hands the record to
  `gather.GATHER`, which also holds the mode every rank agreed on and the per-process call lock.
"""

from __future__ import annotations

from typing import Any, Callable

from . import _callsite
from ._callsite import Site
from ._diagnostics import warn_once
from ._upstream import UpstreamBody
from .config import SETTINGS, Settings
from .gather import GATHER, GatherSession


def _emit(adapter: Any, level: int, msg: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Emit one record through the rank's own logger, exactly as upstream's working path does."""
    if not adapter.isEnabledFor(level):
        return
    try:
        msg, kwargs = adapter.process(msg, _callsite.counted_from_here(kwargs))
        adapter.logger.log(level, msg, *args, **kwargs)
    except Exception as exc:  # a filter or handler that raises must not skip the barrier after it
        warn_once(("emit", type(exc)), f"a log record could not be emitted: {exc!r}")


def _barrier(state: Any) -> bool:
    """Upstream's own synchronisation. False when it failed (the job is already broken)."""
    try:
        state.wait_for_everyone()
    except Exception as exc:
        warn_once(("barrier", type(exc)), f"in_order synchronisation failed, logging unordered: {exc!r}")
        return False
    return True


def _in_turns(
    state: Any, adapter: Any, level: int, msg: Any, args: tuple[Any, ...], kwargs: dict[str, Any], first_turn: int
) -> None:
    """Barrier mode: a rank emits in its own turn, and every rank takes the barrier after each turn.

    Rank 0 has emitted before the check-in; turns start at `first_turn` (1 when the check-in stood for
    the barrier after rank 0's turn).
    """
    rank = state.process_index
    for turn in range(first_turn, state.num_processes):
        if turn == rank and rank != 0:
            _emit(adapter, level, msg, args, kwargs)
        if not _barrier(state):
            if turn < rank:  # our turn has not come: emit unordered rather than lose the record
                _emit(adapter, level, msg, args, kwargs)
            return


def _barrier_mode(
    state: Any,
    settings: Settings,
    gather: GatherSession,
    site: Site,
    adapter: Any,
    level: int,
    msg: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Barrier mode: rank 0's turn, the check-in, then the other turns -- or, the call given up, no barrier.

    Rank 0's turn is first whatever the verdict: it emits before it checks in, so that a `go`, which every
    rank reads after rank 0's check-in, also says rank 0's record is out.
    """
    if state.process_index == 0:
        _emit(adapter, level, msg, args, kwargs)
    verdict = gather.check_in(state, settings, site)
    if verdict == "skip":  # some rank will not come: nobody enters a barrier of this call
        if state.process_index != 0:
            _emit(adapter, level, msg, args, kwargs)
    else:
        _in_turns(state, adapter, level, msg, args, kwargs, first_turn=1 if verdict == "go" else 0)


def make_log_wrapper(
    body: UpstreamBody, settings: Settings = SETTINGS, gather: GatherSession = GATHER
) -> Callable[..., Any]:
    """The wrapt wrapper for `MultiProcessAdapter.log(level, msg, *args, **kwargs)`, bound to `body`.

    Imports accelerate: call it once accelerate.logging is loaded.
    """
    from accelerate.state import PartialState

    @_callsite.mark_wrapper
    def log_in_order(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        in_order = kwargs.get("in_order")
        if not PartialState._shared_state or not (in_order or body.restatable):
            # Upstream's RuntimeError, word for word; or the plain path of a forced unknown body, or of
            # another library's wrapper beneath ours, which must see its calls (the in_order path is
            # replaced all the same). What we call calls `Logger.log`, a frame further from the user.
            kwargs["stacklevel"] = _callsite.caller_stacklevel(body, kwargs)
            return wrapped(*args, **_callsite.counted_from_here(kwargs, callee=True))
        if not in_order:
            # The plain path, every log call of a job. The three known upstream bodies agree on it:
            # drop what the level drops, gate on main_process_only, emit through process(). Restated
            # here rather than delegated, so no extra frame sits between the user and logging (a
            # frame costs findCaller more than this whole wrapper).
            level = args[0]
            if not instance.isEnabledFor(level):
                return None
            kwargs.pop("in_order", None)
            if not instance._should_log(kwargs.pop("main_process_only", True)):
                return None
            kwargs["stacklevel"] = _callsite.caller_stacklevel(body, kwargs)
            msg, kwargs = instance.process(args[1], kwargs)
            instance.logger.log(level, msg, *args[2:], **kwargs)
            return None

        level, msg, *rest = args
        kwargs.pop("in_order")
        kwargs.pop("main_process_only", None)
        # As if this wrapper called `Logger.log`: `_emit` and the gather session count their own frames.
        kwargs["stacklevel"] = _callsite.caller_stacklevel(body, kwargs)
        state = PartialState()
        if state.num_processes <= 1:
            _emit(instance, level, msg, rest, kwargs)
            return None
        # One in_order call at a time per process: each call's N barriers pair up across ranks even
        # when several threads log, and a gather call's record and count stay together.
        with gather.lock:
            site = _callsite.call_site(body)
            if gather.mode(state, settings) == "gather":
                gather.log(state, instance, level, msg, rest, kwargs, site)
                return None
            _barrier_mode(state, settings, gather, site, instance, level, msg, tuple(rest), kwargs)
        return None

    return log_in_order
