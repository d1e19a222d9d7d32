"""Our store threads are released before the default process group is destroyed.

`teardown.on_destroy` wraps `torch.distributed.destroy_process_group` once; the wrapper calls every
registered release first, only when the call ends the job (the default group, or every group), and
never lets a release's failure reach the caller.
"""

import pytest


torch_distributed = pytest.importorskip("torch.distributed")
from torch.distributed import distributed_c10d  # noqa: E402

from accelerate_inorder_fix import testing  # noqa: E402
from accelerate_inorder_fix.store import teardown  # noqa: E402


@pytest.fixture
def hook():
    """A clean hook state; torch's functions are restored afterwards (`testing.reset`)."""
    testing.reset()
    yield teardown
    testing.reset()


def test_a_release_runs_before_the_default_group_is_destroyed_once_per_call(hook):
    calls = []

    def release():
        calls.append("release")

    hook.on_destroy(release)
    hook.on_destroy(release)  # idempotent: one wrapper per module, one release per registration
    wrapped = torch_distributed.destroy_process_group
    assert wrapped.__wrapped__ is not None and distributed_c10d.destroy_process_group.__wrapped__ is not None
    with pytest.raises((ValueError, RuntimeError, AssertionError)):  # no group here: torch's own error
        torch_distributed.destroy_process_group()
    assert calls == ["release"]
    with pytest.raises((ValueError, RuntimeError, AssertionError)):
        distributed_c10d.destroy_process_group(None)
    assert calls == ["release", "release"]
    assert torch_distributed.destroy_process_group is wrapped


def test_a_subgroup_destroyed_releases_nothing_and_a_failing_release_never_reaches_the_caller(hook, capsys):
    calls = []
    hook.on_destroy(lambda: calls.append("release"))
    with pytest.raises((ValueError, RuntimeError, AssertionError, AttributeError, TypeError)):
        torch_distributed.destroy_process_group(object())  # not the default group: torch's error only
    assert calls == []

    def broken():
        raise OSError("store gone")

    hook.on_destroy(broken)
    with pytest.raises((ValueError, RuntimeError, AssertionError)):  # torch's error, not the OSError
        torch_distributed.destroy_process_group()
    assert calls == ["release"] and "could not end the in_order session before destroy" in capsys.readouterr().err


def test_reset_puts_torchs_own_functions_back_and_forgets_every_release(hook):
    original = torch_distributed.destroy_process_group
    calls = []
    hook.on_destroy(lambda: calls.append("release"))
    assert torch_distributed.destroy_process_group is not original
    testing.reset()
    assert torch_distributed.destroy_process_group is original
    assert distributed_c10d.destroy_process_group is original
    assert hook.HOOK.callbacks() == []
