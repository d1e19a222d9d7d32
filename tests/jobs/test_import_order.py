"""Promise: import order never matters, patching is idempotent and reversible, and only known upstream
`log` bodies are replaced (anything else is left alone with one warning, unless forced).

Single-process checks in fresh interpreters: they are about the wiring, not about ranks.
"""

import json

import pytest
from conftest import RELEASES, run_python


REPORT = """
import json, accelerate.logging as L, wrapt
cls = L.MultiProcessAdapter
log = cls.__dict__["log"]
print(json.dumps({"wrapped": isinstance(log, wrapt.FunctionWrapper),
                  "nested": isinstance(getattr(log, "__wrapped__", None), wrapt.FunctionWrapper),
                  "patched": __import__("accelerate_inorder_fix").is_patched()}))
"""


def _report(code, version="1.15.0", env=None):
    proc = run_python(code + REPORT, version=version, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("version", RELEASES)
def test_import_before_accelerate(version):
    state, _ = _report("import accelerate_inorder_fix\nimport accelerate.logging\n", version)
    assert state == {"wrapped": True, "nested": False, "patched": True}


@pytest.mark.parametrize("version", RELEASES)
def test_import_after_accelerate(version):
    state, _ = _report(
        "import accelerate\nfrom accelerate.logging import get_logger\nimport accelerate_inorder_fix\n", version
    )
    assert state == {"wrapped": True, "nested": False, "patched": True}


def test_not_patched_before_accelerate_is_imported():
    proc = run_python(
        "import sys, accelerate_inorder_fix as a\n"
        "print(a.is_patched(), 'accelerate' in sys.modules, 'torch' in sys.modules)"
    )
    assert proc.stdout.split() == ["False", "False", "False"], proc.stderr


def test_patching_twice_is_a_no_op():
    state, _ = _report(
        "import accelerate_inorder_fix as a, importlib\nimport accelerate.logging\n"
        "a.patch(); a.patch(force=True); import accelerate_inorder_fix\n"
    )
    assert state == {"wrapped": True, "nested": False, "patched": True}


def test_unpatch_restores_the_original_object():
    proc = run_python(
        "import accelerate.logging as L\noriginal = L.MultiProcessAdapter.__dict__['log']\n"
        "import accelerate_inorder_fix as a\npatched = L.MultiProcessAdapter.__dict__['log']\n"
        "a.unpatch()\nrestored = L.MultiProcessAdapter.__dict__['log']\n"
        "a.unpatch()\n"
        "print(patched is not original, restored is original, a.is_patched())\n"
        "a.patch()\nprint(a.is_patched(), L.MultiProcessAdapter.__dict__['log'].__wrapped__ is original)\n"
    )
    assert proc.stdout.split() == ["True", "True", "False", "True", "True"], proc.stderr


def test_unpatch_cancels_a_pending_patch():
    state, _ = _report("import accelerate_inorder_fix as a\na.unpatch()\nimport accelerate.logging\n")
    assert state["patched"] is False


def test_subclasses_are_covered():
    proc = run_python(
        "import accelerate.logging as L\nclass Mine(L.MultiProcessAdapter):\n    pass\n"
        "import accelerate_inorder_fix, wrapt\n"
        "print(isinstance(Mine.__dict__.get('log', L.MultiProcessAdapter.__dict__['log']), wrapt.FunctionWrapper))\n"
    )
    assert proc.stdout.split() == ["True"], proc.stderr


def test_switch_off_disables_the_automatic_patch_only():
    state, _ = _report(
        "import accelerate_inorder_fix\nimport accelerate.logging\n", env={"ACCELERATE_INORDER_FIX": "0"}
    )
    assert state["patched"] is False
    state, _ = _report(
        "import accelerate_inorder_fix as a\nimport accelerate.logging\na.patch()\n",
        env={"ACCELERATE_INORDER_FIX": "off"},
    )
    assert state["patched"] is True


# A deliberately altered body: the barrier moved, as a fork might have done.
ALTER = """
import accelerate.logging as L, warnings
def log(self, level, msg, *args, **kwargs):
    kwargs.pop("in_order", None); kwargs.pop("main_process_only", None)
    self.logger.log(level, msg, *args, **kwargs)
L.MultiProcessAdapter.log = log
warnings.simplefilter("always")
"""


def test_unknown_body_is_left_alone_with_one_warning():
    state, err = _report(ALTER + "import accelerate_inorder_fix as a\na.patch()\na.patch()\n")
    assert state["patched"] is False and state["wrapped"] is False
    assert err.count("UnknownAccelerateWarning") == 1, err
    assert "accelerate 1.15.0" in err and "ACCELERATE_INORDER_FIX=force" in err


@pytest.mark.parametrize("how", ["argument", "env"])
def test_unknown_body_can_be_forced(how):
    code = ALTER + (
        "import accelerate_inorder_fix as a\na.patch(force=True)\n"
        if how == "argument"
        else "import accelerate_inorder_fix\n"
    )
    # With the argument, the import itself must not auto-patch (and warn) first.
    env = {"ACCELERATE_INORDER_FIX": "force" if how == "env" else "0"}
    state, err = _report(code, env=env)
    assert state["patched"] is True and "UnknownAccelerateWarning" not in err
