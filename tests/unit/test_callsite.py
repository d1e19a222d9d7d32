"""`_callsite`: the frame arithmetic on fake stacks (through its `_getframe` seam), no real logging.

One rule: the wrapper's `stacklevel` counts as if it called `Logger.log`; whoever does call it adds the
frames up to the wrapper, found by its code object; the call site is the first frame above the wrapper,
wrapt's frames and the logging adapters.
"""

import logging
from types import SimpleNamespace

import pytest

from accelerate_inorder_fix import _callsite
from accelerate_inorder_fix._upstream import UpstreamBody


def _code(name, filename="train.py"):
    return compile("pass", filename, "exec").replace(co_name=name)


WRAPPER = _code("log_in_order")
WARNING_ONCE = _code("warning_once", "accelerate/logging.py")


def _stack(*codes):
    """Fake frames, outermost first; returns the innermost."""
    frame = None
    for line, code in enumerate(codes, 1):
        frame = SimpleNamespace(f_code=code, f_back=frame, f_lineno=line)
    return frame


def _body(wrapper_frames=0, warning_once_code=None):
    return UpstreamBody(
        release_line="1.x", wrapper_frames=wrapper_frames, warning_once_code=warning_once_code, stacked=False
    )


@pytest.fixture
def stack(monkeypatch):
    """Install a fake stack: frame 1 (the caller of the `_callsite` function) is its innermost frame."""
    monkeypatch.setattr(_callsite, "_WRAPPER_IDS", {id(WRAPPER)})

    def install(*codes):
        innermost = _stack(*codes)
        monkeypatch.setattr(_callsite, "_getframe", lambda depth: innermost)

    return install


USER = _code("train_step")
INFO = logging.LoggerAdapter.info.__code__
WARNING = logging.LoggerAdapter.warning.__code__


def test_frames_between_the_wrapper_and_the_logging_call_are_counted_not_written(stack):
    for ours in range(4):
        stack(USER, INFO, WRAPPER, *[_code(f"ours{i}") for i in range(ours)])
        assert _callsite.counted_from_here({"stacklevel": 2})["stacklevel"] == 2 + ours
        assert _callsite.counted_from_here({"stacklevel": 2}, callee=True)["stacklevel"] == 3 + ours


def test_the_callers_kwargs_are_not_changed(stack):
    stack(USER, INFO, WRAPPER, _code("_emit"))
    given = {"stacklevel": 2}
    assert _callsite.counted_from_here(given) == {"stacklevel": 3} and given == {"stacklevel": 2}


def test_outside_a_wrapper_nothing_is_added(stack):
    stack(USER, INFO, _code("elsewhere"))
    assert _callsite.counted_from_here({"stacklevel": 2}) == {"stacklevel": 2}
    assert _callsite.call_site(_body()) == ("?", "?", 0)


def test_upstream_default_is_2_and_3_under_warning_once_past_wrapt_frames(stack):
    for wrapt_frames in (0, 2):
        wrapt = [_code(f"wrapt{i}", "wrapt/wrappers.py") for i in range(wrapt_frames)]
        stack(USER, INFO, *wrapt, WRAPPER)
        assert _callsite.caller_stacklevel(_body(wrapt_frames), {}) == 2 + wrapt_frames
        stack(USER, WARNING_ONCE, WARNING, *wrapt, WRAPPER)
        body = _body(wrapt_frames, WARNING_ONCE)
        assert _callsite.caller_stacklevel(body, {}) == 3 + wrapt_frames
        assert _callsite.caller_stacklevel(body, {"stacklevel": 5}) == 5 + wrapt_frames  # the user's own


def test_a_warning_not_from_warning_once_keeps_the_default(stack):
    stack(USER, WARNING, WRAPPER)
    assert _callsite.caller_stacklevel(_body(0, WARNING_ONCE), {}) == 2


def test_the_call_site_is_the_first_frame_above_the_adapters(stack):
    adapter = compile("pass", logging.__file__, "exec").replace(co_name="info")
    stack(USER, adapter, _code("wrapt0", "wrapt/wrappers.py"), WRAPPER, _code("ours"))
    assert _callsite.call_site(_body(1)) == ("train.py", "train_step", 1)
