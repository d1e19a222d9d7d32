"""Promise: `accelerate_inorder_fix.testing` works as its docstring shows (simulated ranks take the main
process's mode through its in-memory store), and `testing.reset()` puts the package back in its import-time
state: the session closed and new, nothing left with atexit or on torch's functions, `configure()`
forgotten, warnings unsaid, the patch as the import made it."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist
import wrapt
from conftest import REPO

import accelerate_inorder_fix
from accelerate_inorder_fix import config, testing
from accelerate_inorder_fix._diagnostics import warn_once
from accelerate_inorder_fix.session import SESSION
from accelerate_inorder_fix.store import teardown
from accelerate_inorder_fix.store.errors import is_timeout


def _docstring_example():
    """The indented block of the module docstring, as a user would copy it."""
    doc = testing.__doc__
    start = doc.index("    from accelerate_inorder_fix import testing")
    block = doc[start : doc.index("\n\n", doc.index("testing.reset()", start))]
    return textwrap.dedent(block)


def test_the_docstring_example_runs_as_shown(capsys):
    testing.reset()
    exec(compile(_docstring_example(), "testing-docstring", "exec"), {})
    assert "differs from the main process's; using the main process's mode, gather" in capsys.readouterr().err


CLOSES = """
from accelerate_inorder_fix import testing
from accelerate_inorder_fix.config import Settings
from accelerate_inorder_fix.session import InOrderSession
from accelerate_inorder_fix.store import teardown

close = InOrderSession.close
InOrderSession.close = lambda self: (print("close", flush=True), close(self))
main, other = testing.simulated_ranks(2)
assert [main.mode(Settings()), other.mode(Settings())] == ["barrier", "barrier"]
assert main.session.current_side.checkin.store.prefix == other.session.current_side.checkin.store.prefix
assert len(teardown.HOOK.callbacks()) == 2
{closing}
print("exit", flush=True)
"""


@pytest.mark.parametrize("closing,closes", [("main.close(); other.close()", 2), ("", 2)])
def test_a_closed_rank_leaves_nothing_with_atexit_and_an_open_one_closes_at_exit(closing, closes):
    # A closed rank closes once (here, not again at exit); an open one once, at exit, as a real rank's session.
    code = CLOSES.format(closing=closing + ("; assert teardown.HOOK.callbacks() == []" if closing else ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines.count("close") == closes, proc.stdout
    assert (lines.index("exit") > lines.index("close")) == bool(closing), proc.stdout


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), os.environ.get("PYTHONPATH", "")))}


def test_reset_is_the_import_time_state(capsys):
    accelerate_inorder_fix.configure(mode="gather", timeout=3)
    warn_once("said once", "test-key")
    SESSION.close()
    testing.reset()
    assert (config.SETTINGS.mode_source(), config.SETTINGS.timeout_source()) == ("default", "default")
    assert warn_once("said once", "test-key")  # unsaid again: said once more
    assert SESSION.mode is None and testing.side() is None
    assert accelerate_inorder_fix.is_patched() == (config.switch() != "off" and "accelerate.logging" in sys.modules)
    assert capsys.readouterr().err.count("said once") == 2


def test_reset_unwraps_torchs_destroy_process_group(monkeypatch):
    # With the patch off (ACCELERATE_INORDER_FIX=0), the import leaves torch's functions as they are.
    monkeypatch.setenv("ACCELERATE_INORDER_FIX", "0")
    teardown.on_destroy(lambda: None)
    assert isinstance(dist.destroy_process_group, wrapt.FunctionWrapper)
    testing.reset()
    assert not isinstance(dist.destroy_process_group, wrapt.FunctionWrapper) and teardown.HOOK.callbacks() == []
    assert not accelerate_inorder_fix.is_patched()
    monkeypatch.delenv("ACCELERATE_INORDER_FIX")
    testing.reset()


@pytest.mark.parametrize("batched", [True, False])
def test_the_in_memory_store_times_out_as_the_package_reads_a_timeout(batched):
    store = (testing.InMemoryStore if batched else testing.UnbatchedInMemoryStore)(timeout=0.01)
    with pytest.raises(testing.StoreTimeout) as caught:
        store.get("missing")
    assert is_timeout(caught.value)
    store.set("here", 1)
    assert store.get("here") == b"1" and store.check(["here"]) and not store.check(["missing"])


def test_patching_again_keeps_the_wrappers_code_once():
    from accelerate_inorder_fix import _callsite

    pytest.importorskip("accelerate.logging")
    testing.reset()
    accelerate_inorder_fix.patch()
    kept = list(_callsite._WRAPPER_CODES)
    for _ in range(3):
        testing.reset()
        accelerate_inorder_fix.patch()
    assert _callsite._WRAPPER_CODES == kept and len(kept) == len(set(map(id, kept)))
