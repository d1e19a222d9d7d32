"""The contract: what `MultiProcessAdapter.log` does once patched.

A collective must be reached by every rank on the same control path, whatever that rank will print.
Upstream puts the in_order barriers behind rank-local conditions (`_should_log`, `isEnabledFor`), so a
rank that prints nothing skips them and the job deadlocks or desynchronises. Here the synchronisation
comes first and unconditionally; each rank's own level, filters and handlers only decide whether it
emits its record in its turn.

- `in_order=False`: upstream's own behaviour, restated for the known bodies (no extra frame).
- `in_order=True`: a collective call on every rank; `main_process_only` is ignored (as in 1.13+).
  The session (`session.SESSION`) holds the mode every rank agreed on and the per-process call lock.
  Barrier mode (`barrier.turns.barrier_call`) checks the call in through the job's store, then, when
  every rank has made it, takes turns between upstream's `wait_for_everyone()`; when some rank has
  not within the timeout, nobody enters a barrier and each rank emits at once. Gather mode
  (`session.gather_call`) sends the record to the main process, which prints every rank's.
"""

from __future__ import annotations

from typing import Any, Callable

from . import _callsite
from ._upstream import UpstreamBody
from .barrier.turns import Record, barrier_call
from .config import SETTINGS, Settings
from .session import SESSION, InOrderSession


def make_log_wrapper(
    body: UpstreamBody, settings: Settings = SETTINGS, session: InOrderSession = SESSION
) -> Callable[..., Any]:
    """The wrapt wrapper for `MultiProcessAdapter.log(level, msg, *args, **kwargs)`, bound to `body`.

    Imports accelerate: call it once accelerate.logging is loaded.
    """
    from accelerate.state import PartialState

    session.watch_start()

    @_callsite.mark_wrapper
    def patched_log(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
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
        # As if this wrapper called `Logger.log`: `Record` and the gather side count their own frames.
        kwargs["stacklevel"] = _callsite.caller_stacklevel(body, kwargs)
        state = PartialState()
        if state.num_processes <= 1:
            Record(instance, level, msg, tuple(rest), kwargs, session.origin(state))()
            return None
        # One in_order call at a time per process: each call's N barriers pair up across ranks even
        # when several threads log, and a gather call's record and count stay together.
        with session.lock:
            site = _callsite.call_site(body)
            if session.mode(state, settings) == "gather":
                session.gather_call(state, settings, site, instance, level, msg, tuple(rest), kwargs)
            else:
                record = Record(instance, level, msg, tuple(rest), kwargs, session.origin(state))
                barrier_call(state, lambda: session.check_in(state, settings, site, record), record)
        return None

    return patched_log
