"""The contract: what `MultiProcessAdapter.log` does once patched.

A collective must be reached by every rank on the same control path, whatever that rank will print.
Upstream puts the in_order barriers behind rank-local conditions (`_should_log`, `isEnabledFor`), so a
rank that prints nothing skips them and the job deadlocks or desynchronises. Here the synchronisation
comes first and unconditionally; each rank's own level, filters and handlers only decide whether it
emits its record in its turn.

- `in_order=False`: upstream's own behaviour, restated for the known bodies (no extra frame).
- `in_order=True`: a collective call on every rank; `main_process_only` is ignored (as in 1.13+).
  The wrapper makes the call one `_call.InOrderCall` (its site, what was logged, this rank's origin,
  the timeout) and hands it to the session (`session.SESSION`), which holds the job's mode and the
  store of the current process group, numbers the call at its site, and gives it to that mode's side
  (or, on a single process or a process that is not a rank, logs it at once). Barrier mode
  (`barrier.side.BarrierSide.call`) checks the call in through the job's store; when every rank has
  made it, the ranks take turns handed over through the store (no collective); when some rank has not
  within the timeout, each rank emits at once. Gather mode (`gather.collector.GatherSide.call`) sends the
  record to the main process, which prints every rank's.
"""

from __future__ import annotations

from typing import Any, Callable

from . import _callsite
from ._call import InOrderCall, LogArgs
from ._upstream import UpstreamBody
from .config import SETTINGS, Settings
from .session import SESSION, InOrderSession, watch_start


def make_log_wrapper(
    body: UpstreamBody, settings: Settings = SETTINGS, session: InOrderSession = SESSION
) -> Callable[..., Any]:
    """The wrapt wrapper for `MultiProcessAdapter.log(level, msg, *args, **kwargs)`, bound to `body`.

    Imports accelerate: call it once accelerate.logging is loaded.
    """
    from accelerate.state import PartialState

    watch_start(session)

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
        # As if this wrapper called `Logger.log`: both modes count their own frames (`_call.log_for_this_call`).
        kwargs["stacklevel"] = _callsite.caller_stacklevel(body, kwargs)
        log = LogArgs(instance, level, msg, tuple(rest), kwargs)
        state = PartialState()
        call = InOrderCall(_callsite.call_site(body), log, session.origin(state), settings.timeout())
        session.call(state, settings, call)
        return None

    return patched_log
