"""The contract: what `MultiProcessAdapter.log` does once patched.

A collective must be reached by every rank on the same control path, whatever that rank will print.
Upstream puts the in_order barriers behind rank-local conditions (`_should_log`, `isEnabledFor`), so a
rank that prints nothing skips them and the job deadlocks or desynchronises. Here the synchronisation
comes first and unconditionally; each rank's own level, filters and handlers only decide whether it
emits its record in its turn.

- `in_order=False`: upstream's own body runs, untouched.
- `in_order=True`: a collective call on every rank; `main_process_only` is ignored (as in 1.13+).
"""

import logging
import sys

from accelerate.state import PartialState

from . import _config

# Frames a wrapt wrapper adds between the user's call and ours: 0 with wrapt's C extension, more with
# its pure-Python fallback. Set by the wiring when it installs the patch.
wrapper_frames = 0
# Code of upstream's `warning_once` (None before 0.24): one more frame of accelerate's own between
# the user and `log`, which upstream reports as the caller. Set by the wiring.
warning_once_code = None
# True when the installed body is one of the three known upstream ones (False: forced). Set by the wiring.
known_body = True
_WARNING_CODE = logging.LoggerAdapter.warning.__code__


def _default_stacklevel(depth):
    """Upstream's default (2: the frame above `log`), moved past `warning_once` when it is there.

    `depth`: frames between the caller of this function and `log_in_order`.
    """
    frame = sys._getframe(2 + depth + wrapper_frames)  # the frame that called `log`
    if frame.f_code is _WARNING_CODE and frame.f_back is not None and frame.f_back.f_code is warning_once_code:
        return 3
    return 2


_warned = set()


def _warn_once(key, text):
    """One line on stderr per problem and process: logging must never raise into user code."""
    if key not in _warned:
        _warned.add(key)
        sys.stderr.write(f"accelerate-inorder-fix: {text}\n")


def _emit(adapter, level, msg, args, kwargs):
    """Emit one record through the rank's own logger, exactly as upstream's working path does."""
    if not adapter.isEnabledFor(level):
        return
    try:
        msg, kwargs = adapter.process(msg, kwargs)
        adapter.logger.log(level, msg, *args, **kwargs)
    except Exception as exc:  # a filter or handler that raises must not skip the barrier after it
        _warn_once(("emit", type(exc)), f"a log record could not be emitted: {exc!r}")


def _barrier(state):
    """Upstream's own synchronisation. False when it failed (the job is already broken)."""
    try:
        state.wait_for_everyone()
    except Exception as exc:
        _warn_once(("barrier", type(exc)), f"in_order synchronisation failed, logging unordered: {exc!r}")
        return False
    return True


def _delegate(wrapped, args, kwargs):
    """Run upstream's own body. It sits one frame below us, so the caller moves up by one."""
    kwargs["stacklevel"] = (kwargs.get("stacklevel") or _default_stacklevel(1)) + 1 + wrapper_frames
    return wrapped(*args, **kwargs)


def log_in_order(wrapped, instance, args, kwargs):
    """wrapt wrapper for `MultiProcessAdapter.log(level, msg, *args, **kwargs)`."""
    in_order = kwargs.get("in_order")
    if not PartialState._shared_state or not (in_order or known_body):
        # Upstream's RuntimeError, word for word; or the plain path of a forced unknown body, which
        # we cannot restate (its in_order path is replaced all the same).
        return _delegate(wrapped, args, kwargs)
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
        kwargs["stacklevel"] = (kwargs.get("stacklevel") or _default_stacklevel(0)) + wrapper_frames
        msg, kwargs = instance.process(args[1], kwargs)
        instance.logger.log(level, msg, *args[2:], **kwargs)
        return None

    level, msg, *args = args
    kwargs.pop("in_order")
    kwargs.pop("main_process_only", None)
    # Upstream's stacklevel convention (0.30.1+): 1 is its own `log` frame. Ours is `_emit` (or the
    # gather code) called from this wrapper: one frame more.
    kwargs["stacklevel"] = (kwargs.get("stacklevel") or _default_stacklevel(0)) + 1 + wrapper_frames

    state = PartialState()
    if state.num_processes <= 1:
        _emit(instance, level, msg, args, kwargs)
        return None
    if _config.mode() == "gather":
        from . import _gather  # loaded only by the jobs that ask for it

        # Called from here, like `_emit`: the stacklevel above holds for it too.
        if _gather.usable():
            return _gather.log(instance, level, msg, args, kwargs)

    rank = state.process_index
    for turn in range(state.num_processes):
        if turn == rank:
            _emit(instance, level, msg, args, kwargs)
        if not _barrier(state):
            if turn < rank:
                _emit(instance, level, msg, args, kwargs)
            return None
    return None
