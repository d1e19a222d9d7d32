"""Promise: `is_patched()` and `unpatch()` know only this package's own wrapper. Another library's wrapt wrapper on
`MultiProcessAdapter.log`, below or above ours, is neither taken for ours nor removed, and keeps working. Beneath a
plain `functools.wraps` wrapper, which calls ours through its closure, ours cannot be spliced out: `unpatch()` leaves
it, `is_patched()` stays True (it still runs), and one warning says so.

In-process against the installed accelerate, one process (no ranks): a single-process `PartialState`, so both
wrappers and upstream's body really run.
"""

import functools
import logging
import warnings
from typing import Any, Callable

import pytest
import wrapt
from accelerate import PartialState
from accelerate.logging import MultiProcessAdapter, get_logger

import accelerate_inorder_fix as fix
from accelerate_inorder_fix import _wrapper


class Theirs:
    """Another library's instrumentation: counts the calls it sees, then calls what it wraps."""

    def __init__(self):
        self.calls = 0

    def __call__(self, wrapped, instance, args, kwargs):
        self.calls += 1
        return wrapped(*args, **kwargs)

    def install(self):
        wrapt.wrap_function_wrapper(MultiProcessAdapter, "log", self)
        return MultiProcessAdapter.__dict__["log"]


@pytest.fixture
def adapter(caplog):
    """A logger through accelerate's adapter, single process; `log` and the patch put back as they were."""
    was_patched = fix.is_patched()
    fix.unpatch()
    upstream = MultiProcessAdapter.__dict__["log"]
    PartialState(cpu=True)
    caplog.set_level(logging.INFO, logger="aif.stacking")
    yield get_logger("aif.stacking")
    PartialState._reset_state()
    fix.unpatch()
    MultiProcessAdapter.log = upstream
    if was_patched:
        fix.patch()
    assert fix.is_patched() == was_patched


def _messages(caplog):
    """The messages logged, without the `[RANK n] ` prefix that accelerate 1.13+ adds."""
    return [r.getMessage().split("] ", 1)[-1] for r in caplog.records]


def test_another_wrapper_is_not_ours(adapter):
    theirs = Theirs()
    theirs.install()
    assert fix.is_patched() is False
    fix.unpatch()  # nothing of ours to remove: theirs stays
    assert isinstance(MultiProcessAdapter.__dict__["log"], wrapt.FunctionWrapper)
    adapter.info("plain")
    assert theirs.calls == 1


def test_ours_below_theirs(adapter, caplog):
    fix.patch()
    ours = MultiProcessAdapter.__dict__["log"]
    theirs = Theirs()
    outer = theirs.install()
    assert outer.__wrapped__ is ours and fix.is_patched()
    adapter.info("both", in_order=True)
    assert theirs.calls == 1 and _messages(caplog) == ["both"]

    fix.unpatch()
    assert fix.is_patched() is False
    assert MultiProcessAdapter.__dict__["log"] is outer  # theirs stays on top, ours spliced out beneath
    assert not isinstance(outer.__wrapped__, wrapt.FunctionWrapper)  # upstream's own function now
    adapter.info("theirs only")
    assert theirs.calls == 2 and _messages(caplog)[-1] == "theirs only"

    fix.patch()  # again, with theirs on top: ours goes on top of theirs
    assert fix.is_patched() and MultiProcessAdapter.__dict__["log"].__wrapped__ is outer


def test_ours_above_theirs(adapter, caplog):
    theirs = Theirs()
    inner = theirs.install()
    fix.patch()  # recognises upstream's body beneath their wrapper
    ours = MultiProcessAdapter.__dict__["log"]
    assert ours is not inner and ours.__wrapped__ is inner and fix.is_patched()
    adapter.info("both")
    adapter.info("in order", in_order=True)
    assert _messages(caplog) == ["both", "in order"]
    # Plain calls go down through theirs; the in_order call is ours alone (upstream's in_order path beneath
    # theirs is the bug being fixed).
    assert theirs.calls == 1

    fix.unpatch()
    assert fix.is_patched() is False and MultiProcessAdapter.__dict__["log"] is inner
    adapter.info("theirs only")
    assert _messages(caplog)[-1] == "theirs only" and theirs.calls == 2


def test_patch_twice_installs_one_wrapper(adapter):
    fix.patch()
    first = MultiProcessAdapter.__dict__["log"]
    fix.patch()
    assert MultiProcessAdapter.__dict__["log"] is first
    fix.unpatch()
    fix.unpatch()
    assert not isinstance(MultiProcessAdapter.__dict__["log"], wrapt.FunctionWrapper)


def _plain_wrapper_above(calls: list[str]) -> Callable[..., Any]:
    """Another library's instrumentation without wrapt: a `functools.wraps` function around `MultiProcessAdapter.log`."""
    inner = MultiProcessAdapter.log

    @functools.wraps(inner)
    def log(self: MultiProcessAdapter, *args: Any, **kwargs: Any) -> Any:
        calls.append("theirs")
        return inner(self, *args, **kwargs)

    MultiProcessAdapter.log = log
    return log


@pytest.fixture
def ours_ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each in_order record our wrapper emits (its `emit_at_once`, which upstream's body never makes)."""
    seen: list[str] = []
    emit = _wrapper.emit_at_once

    def spy(call: Any) -> None:
        seen.append(str(call.log.msg))
        emit(call)

    monkeypatch.setattr(_wrapper, "emit_at_once", spy)
    return seen


def test_unpatch_beneath_a_plain_wrapper_leaves_ours_running_and_says_so_once(adapter, caplog, ours_ran):
    fix.patch()
    ours = MultiProcessAdapter.__dict__["log"]
    calls: list[str] = []
    plain = _plain_wrapper_above(calls)
    with pytest.warns(RuntimeWarning, match="cannot take its wrapper out") as caught:
        fix.unpatch()
    assert len(caught) == 1 and caught[0].filename == __file__  # the warning points at the unpatch() call
    assert MultiProcessAdapter.__dict__["log"] is plain and fix.is_patched() is True
    adapter.info("still fixed", in_order=True)
    assert calls == ["theirs"] and ours_ran == ["still fixed"] and _messages(caplog) == ["still fixed"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second unpatch() changes nothing and does not warn again
        fix.unpatch()
    assert fix.is_patched() is True

    MultiProcessAdapter.log = ours  # the other library removes its wrapper: ours is on top again
    fix.unpatch()
    assert fix.is_patched() is False
    adapter.info("upstream again", in_order=True)
    assert ours_ran == ["still fixed"] and _messages(caplog)[-1] == "upstream again"


def test_unpatch_beneath_a_wrapt_wrapper_splices_ours_out(adapter, caplog, ours_ran):
    fix.patch()
    theirs = Theirs()
    outer = theirs.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fix.unpatch()
    assert fix.is_patched() is False and MultiProcessAdapter.__dict__["log"] is outer
    adapter.info("theirs only", in_order=True)
    assert ours_ran == [] and theirs.calls == 1 and _messages(caplog) == ["theirs only"]
