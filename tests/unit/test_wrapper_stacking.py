"""Promise: `is_patched()` and `unpatch()` know only this package's own wrapper. Another library's wrapt wrapper on
`MultiProcessAdapter.log`, below or above ours, is neither taken for ours nor removed, and keeps working.

In-process against the installed accelerate, one process (no ranks): a single-process `PartialState`, so both
wrappers and upstream's body really run.
"""

import logging

import pytest
import wrapt
from accelerate import PartialState
from accelerate.logging import MultiProcessAdapter, get_logger

import accelerate_inorder_fix as fix


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
