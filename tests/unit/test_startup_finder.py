"""Promise: the start-up hook's line and finder watch only `accelerate.logging`, hand over to the package once it
has loaded, give the module back its real loader, and never raise: a failure is one line on stderr.

In-process against a fake `accelerate` (a folder on a tmp `sys.path`) and a fake package in place of
`accelerate_inorder_fix`; `sys.meta_path`, `sys.path`, `sys.modules` and the hook's state are restored after
each test. The real hook in real processes is tests/jobs/test_startup_hook.py.
"""

import importlib
import importlib.machinery
import sys

import pytest

import _accelerate_inorder_fix_startup as hook


FAKE_PACKAGE = "aif_fake_package"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake accelerate (and package to hand over to) first on sys.path; everything put back after."""
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "__init__.py").write_text("")
    (tmp_path / "accelerate" / "logging.py").write_text("LOADED = True\n")
    (tmp_path / f"{FAKE_PACKAGE}.py").write_text("import sys\nsys.modules[__name__].IMPORTED = True\n")
    saved_modules = {k: v for k, v in sys.modules.items() if k == "accelerate" or k.startswith("accelerate.")}
    for name in saved_modules:
        del sys.modules[name]
    saved_meta_path, saved_state = list(sys.meta_path), dict(hook.state)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hook, "PACKAGE", FAKE_PACKAGE)
    monkeypatch.delenv(hook.SWITCH_ENV, raising=False)
    monkeypatch.delenv(hook.STARTUP_ENV, raising=False)
    importlib.invalidate_caches()
    hook.uninstall()
    yield tmp_path
    sys.meta_path[:] = saved_meta_path
    hook.state.clear()
    hook.state.update(saved_state)
    for name in [k for k in sys.modules if k in ("accelerate", FAKE_PACKAGE) or k.startswith("accelerate.")]:
        del sys.modules[name]
    sys.modules.update(saved_modules)


def ours():
    """The hook's entries on sys.meta_path: the real finder, and finders the line put there."""
    return [f for f in sys.meta_path if f is hook._FINDER or hasattr(f, hook.MARK)]


def test_install_is_idempotent_and_uninstall_removes_it(fake):
    assert hook.install() and hook.install()
    assert ours() == [hook._FINDER] and sys.meta_path[0] is hook._FINDER
    hook.uninstall()
    hook.uninstall()
    assert ours() == [] and hook.state["armed"] is False


@pytest.mark.parametrize("env", [hook.SWITCH_ENV, hook.STARTUP_ENV])
def test_a_switch_off_leaves_the_hook_unarmed(fake, monkeypatch, env):
    monkeypatch.setenv(env, "off")
    assert hook.install() is False
    assert ours() == []


def test_the_finder_answers_only_for_accelerate_logging(fake):
    for name in ("accelerate", "json", "accelerate.logging_extra", "aif_fake_package"):
        assert hook._FINDER.find_spec(name, None) is None
    hook.install()
    spec = hook._FINDER.find_spec("accelerate.logging", [str(fake / "accelerate")])
    assert isinstance(spec.loader, hook._PatchAfterExec)
    assert isinstance(spec.loader._real, importlib.machinery.SourceFileLoader)
    assert spec.loader.get_filename("accelerate.logging") == str(fake / "accelerate" / "logging.py")


def test_loading_accelerate_logging_hands_over_and_restores_the_real_loader(fake):
    hook.install()
    import accelerate.logging as module

    assert module.LOADED and sys.modules[FAKE_PACKAGE].IMPORTED
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)
    assert module.__spec__.loader is module.__loader__
    assert ours() == []  # fired once, then gone
    assert (hook.state["fired"], hook.state["imported_package"], hook.state["error"]) == (True, True, None)
    importlib.reload(module)  # reload sees only the real loader: no second hand-over
    assert ours() == []


def test_a_failed_import_of_accelerate_logging_stays_watched(fake):
    good = (fake / "accelerate" / "logging.py").read_text()
    (fake / "accelerate" / "logging.py").write_text("raise ImportError('not yet')\n")
    hook.install()
    with pytest.raises(ImportError, match="not yet"):  # the user's own error, unchanged
        import accelerate.logging  # noqa: F401
    assert ours() == [hook._FINDER] and FAKE_PACKAGE not in sys.modules
    (fake / "accelerate" / "logging.py").write_text(good)
    importlib.invalidate_caches()
    import accelerate.logging  # noqa: F401, F811

    assert sys.modules[FAKE_PACKAGE].IMPORTED and ours() == []


def test_a_package_that_cannot_be_imported_is_one_line(fake, capsys):
    (fake / f"{FAKE_PACKAGE}.py").write_text("raise ImportError('wrapt is missing')\n")
    hook.install()
    import accelerate.logging as module

    assert module.LOADED
    err = capsys.readouterr().err
    expected = (
        "accelerate-inorder-fix: start-up hook could not apply the patch (ImportError: wrapt is missing); "
        "this process runs unpatched\n"
    )
    assert err == expected and hook.state["error"] == expected.rstrip("\n")


def test_the_line_arms_lazily_and_hands_over_on_the_first_lookup(fake):
    namespace = {}
    exec(hook.LINE, namespace)
    exec(hook.LINE, namespace)  # site may run a .pth line twice
    assert len(ours()) == 2 and all(hasattr(f, hook.MARK) for f in ours())
    assert hook.state["armed"] is False  # nothing but the line ran: the module was not needed
    assert sys.meta_path[0].find_spec("json", None) is None
    import accelerate.logging  # noqa: F401

    assert sys.modules[FAKE_PACKAGE].IMPORTED
    assert ours() == [] and hook.state["fired"]


def test_the_line_with_the_switch_off_steps_aside(fake, monkeypatch):
    exec(hook.LINE, {})
    monkeypatch.setenv(hook.SWITCH_ENV, "0")
    import accelerate.logging  # noqa: F401

    assert FAKE_PACKAGE not in sys.modules and ours() == []


def test_the_line_without_its_module_is_one_line_and_steps_aside(fake, monkeypatch, capsys):
    exec(hook.LINE, {})
    monkeypatch.setitem(sys.modules, hook.MODULE, None)  # as if the module were gone
    import accelerate.logging as module

    assert module.LOADED and ours() == []
    err = capsys.readouterr().err
    assert err.startswith("accelerate-inorder-fix: start-up hook not loaded (ModuleNotFoundError: ")
    assert err.endswith("; this process runs unpatched\n") and err.count("\n") == 1


def test_the_pth_file_holds_the_line():
    from conftest import REPO

    assert (REPO / hook.PTH_NAME).read_text() == hook.LINE + "\n"
