"""The start-up hook, as a user gets it: the built wheel (or `pip install -e .`) in a fresh venv.

Nothing here imports the package in the processes under test: the scripts are accelerate's users'
scripts, and only the hook may bring the fix in.

Fresh venvs stay cheap: each holds pip and this package only, plus a `.pth` line naming the test
runner's own site-packages, where torch 2.13.0, accelerate and wrapt already are (a plain path line:
the `.pth` files of that folder, including the runner's own hook, are not read). The accelerate
release under test comes first on PYTHONPATH, from `.cache/accelerate/<version>` as in the other
tests. Processes run in a folder outside the repo (as a user's would: `python -c` puts the working
directory first on sys.path, and the repo's own package must not be found there), and the scenario
worker runs from a copy there. Every subprocess runs under a hard timeout; multi-rank jobs under `_launch.run`, which kills
the job's whole process tree on a stall.
"""

import os
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, accelerate_dir, make_venv, pip, site_packages

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import scenarios


HOOK_FILES = {"_accelerate_inorder_fix_startup.pth", "_accelerate_inorder_fix_startup.py"}
RUN_TIMEOUT = 120
_site_packages, _make_venv, _pip = site_packages, make_venv, pip


def _files(venv):
    """Every file under the venv's site-packages, relative to it."""
    root = _site_packages(venv)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def clean_env(version=None, extra_path=(), **overrides):
    """The user's environment: no switch set, no package on PYTHONPATH, the release under test."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ACCELERATE_INORDER") and k not in ("PYTHONPATH", "AIF_PATCH")
    }
    path = [str(p) for p in extra_path] + ([accelerate_dir(version)] if version else [])
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env["OMP_NUM_THREADS"] = "1"
    env["AIF_PATCH"] = "0"  # the scenario worker must never import the package itself
    env.update(overrides)
    return env


# A working folder outside the repo for every process under test; set by the `outside` fixture.
OUTSIDE = {}


def run_py(venv, code, env, timeout=RUN_TIMEOUT):
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=OUTSIDE["dir"],
    )


def hook_lines(stderr):
    return [line for line in stderr.splitlines() if "accelerate-inorder-fix" in line]


@pytest.fixture(scope="module", autouse=True)
def outside(tmp_path_factory):
    """The users' folder: processes start here, and the scenario worker is a copy here."""
    folder = tmp_path_factory.mktemp("user")
    shutil.copy(_launch.SCENARIO_SCRIPT, folder / "train.py")
    OUTSIDE["dir"] = str(folder)
    OUTSIDE["script"] = str(folder / "train.py")
    yield folder
    OUTSIDE.clear()


# --- what is shipped --------------------------------------------------------------------------


def test_pth_file_is_the_modules_line():
    # The source file, not the module this interpreter loaded at start-up (an install's copy).
    module = runpy.run_path(str(REPO / "_accelerate_inorder_fix_startup.py"))
    text = (REPO / module["PTH_NAME"]).read_text()
    assert text == module["LINE"] + "\n"
    assert len(text.splitlines()) == 1


def test_wheel_ships_the_hook_at_top_level(wheel_venv):
    site = _site_packages(wheel_venv)
    assert HOOK_FILES <= {p.name for p in site.iterdir()}


# --- lazy, and patched whatever the import order ------------------------------------------------


def test_start_up_imports_nothing(wheel_venv):
    # Not even the hook's own module: the .pth line only puts its finder on sys.meta_path.
    names = ("wrapt", "torch", "accelerate", "accelerate_inorder_fix", "_accelerate_inorder_fix_startup")
    code = f"import sys; print(sorted(m for m in {names!r} if m in sys.modules), sys.meta_path[0])"
    out = run_py(wheel_venv, code, clean_env("1.15.0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[] namespace(accelerate_inorder_fix_hook=True")
    assert out.stderr == ""


IMPORT_ORDERS = {
    "from accelerate.logging import get_logger": "start-up hook",
    "import accelerate": "start-up hook",
    "import accelerate_inorder_fix; import accelerate": "import",
}


@pytest.mark.parametrize("first_import", list(IMPORT_ORDERS))
def test_patched_before_the_first_log_call(wheel_venv, first_import):
    code = (
        f"{first_import}\n"
        "import sys\n"
        "aif = sys.modules.get('accelerate_inorder_fix')\n"
        "assert aif is not None and aif.is_patched(), 'not patched right after the import'\n"
        "from accelerate_inorder_fix import hook_status as startup\n"
        "print(startup.patched_by())\n"
    )
    out = run_py(wheel_venv, code, clean_env("1.15.0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == IMPORT_ORDERS[first_import]
    assert hook_lines(out.stderr) == []


def test_switch_off_leaves_accelerate_alone(wheel_venv):
    code = "import accelerate.logging, sys; print('accelerate_inorder_fix' in sys.modules)"
    out = run_py(wheel_venv, code, clean_env("1.15.0", ACCELERATE_INORDER_FIX="off"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_multiprocessing_spawn_child_is_patched(wheel_venv, tmp_path):
    script = tmp_path / "spawn_job.py"
    script.write_text(
        "import multiprocessing as mp, sys\n"
        "def child(queue):\n"
        "    from accelerate.logging import get_logger\n"
        "    aif = sys.modules.get('accelerate_inorder_fix')\n"
        "    queue.put(bool(aif and aif.is_patched()))\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    queue = ctx.Queue()\n"
        "    proc = ctx.Process(target=child, args=(queue,))\n"
        "    proc.start()\n"
        "    print('child patched:', queue.get(timeout=90))\n"
        "    proc.join(30)\n"
        "    print('parent imported the package:', 'accelerate_inorder_fix' in sys.modules)\n"
    )
    out = subprocess.run(
        [str(wheel_venv / "bin" / "python"), str(script)],
        env=clean_env("1.15.0"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL,
        cwd=OUTSIDE["dir"],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["child patched: True", "parent imported the package: False"]


# --- real multi-rank jobs, with a script that never imports the package --------------------------


def _job(venv, version, names, launcher, switch=None, timeout=RUN_TIMEOUT, stall=10.0):
    env = clean_env(version, **({"ACCELERATE_INORDER_FIX": switch} if switch else {}))
    cmd = _launch.launch_command(
        [OUTSIDE["script"], ",".join(names)], 2, launcher, python=str(venv / "bin" / "python")
    )
    job = _launch.run(cmd, env=env, timeout=timeout, stall=stall, cwd=OUTSIDE["dir"])
    return job, {name: scenarios.check(name, 2, job.lines) for name in names}


@pytest.mark.parametrize(
    "version,launcher,names",
    [
        ("1.15.0", "torchrun", ["rank_levels", "default"]),
        ("1.15.0", "accelerate", ["rank_levels"]),
        ("1.12.0", "torchrun", ["default", "rank_levels"]),
    ],
)
def test_hooked_job_is_ordered_and_hang_free(wheel_venv, version, launcher, names):
    job, verdicts = _job(wheel_venv, version, names, launcher)
    assert job.killed is None and job.returncode == 0, (job, verdicts, job.stderr[-3000:])
    assert verdicts == dict.fromkeys(names, ("ordered", "")), job.lines
    assert hook_lines(job.stderr) == []


@pytest.mark.parametrize("version,name", [("1.15.0", "rank_levels"), ("1.12.0", "default")])
def test_switched_off_job_shows_the_upstream_bug(wheel_venv, version, name):
    job, verdicts = _job(wheel_venv, version, [name], "torchrun", switch="0", timeout=90, stall=6.0)
    assert verdicts[name][0] == "deadlock", (verdicts, job.lines)
    assert job.killed is not None


# --- a broken hook never stops the interpreter ---------------------------------------------------


def test_broken_start_up_module_prints_one_line(wheel_venv, tmp_path):
    (tmp_path / "_accelerate_inorder_fix_startup.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = clean_env("1.15.0", extra_path=[tmp_path])
    start = run_py(wheel_venv, "pass", env)  # the module is first needed when accelerate.logging is imported
    assert (start.returncode, start.stderr) == (0, "")
    code = "import accelerate.logging\nimport accelerate.logging\nprint('user code ran on')\n"
    out = run_py(wheel_venv, code, env)
    assert (out.returncode, out.stdout) == (0, "user code ran on\n"), out.stderr
    assert out.stderr == (
        "accelerate-inorder-fix: start-up hook not loaded (RuntimeError: broken on purpose); "
        "this process runs unpatched\n"
    )


@pytest.mark.parametrize("breakage", ["wrapt", "accelerate_inorder_fix"])
def test_unimportable_patch_leaves_the_process_running(wheel_venv, tmp_path, breakage):
    broken = tmp_path / breakage
    broken.mkdir()
    (broken / "__init__.py").write_text(f"raise ImportError('{breakage} made unimportable for this test')\n")
    env = clean_env("1.15.0", extra_path=[tmp_path])

    start = run_py(wheel_venv, "pass", env)
    assert (start.returncode, start.stderr) == (0, "")

    code = (
        "from accelerate.logging import get_logger\n"
        "from accelerate import PartialState\n"
        "PartialState(cpu=True)\n"
        "get_logger('user').warning('still logging', in_order=True)\n"
        "print('user code ran on')\n"
    )
    out = run_py(wheel_venv, code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "user code ran on"
    lines = hook_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "accelerate-inorder-fix: start-up hook could not apply the patch"
    ), out.stderr
    assert "Traceback" not in out.stderr


# --- install and uninstall, and the sitecustomize route -------------------------------------------
# One bare venv (pip and the shared dependencies only) serves these tests in turn; each leaves it bare.


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    return _make_venv(tmp_path_factory.mktemp("bare") / "venv")


def test_sitecustomize_route(bare_venv, wheel, tmp_path):
    # `pip install --target` + PYTHONPATH: a folder whose .pth files Python never reads.
    target = tmp_path / "target"
    _pip(bare_venv, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel))
    env = clean_env("1.15.0", extra_path=[target])
    code = "import accelerate, sys; print('accelerate_inorder_fix' in sys.modules)"
    assert run_py(bare_venv, code, env).stdout.strip() == "False"

    line = run_py(
        bare_venv,
        "from accelerate_inorder_fix import hook_status as startup; startup.main(['--print-sitecustomize'])",
        env,
    )
    (target / "sitecustomize.py").write_text(line.stdout)
    code = "import accelerate, sys\nfrom accelerate_inorder_fix import hook_status as startup\nprint(startup.patched_by())\n"
    out = run_py(bare_venv, code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "start-up hook"


def test_uninstall_leaves_no_file(bare_venv, wheel):
    before = _files(bare_venv)
    _pip(bare_venv, "install", "--no-deps", "--no-index", str(wheel))
    assert HOOK_FILES <= _files(bare_venv)
    _pip(bare_venv, "uninstall", "-y", "accelerate-inorder-fix")
    assert _files(bare_venv) - before == set()


def test_editable_install_gets_the_hook_and_uninstalls_clean(bare_venv):
    venv = bare_venv
    before = _files(venv)
    # hatchling and editables come from the runner's site-packages (the test extra): no network.
    _pip(venv, "install", "--no-deps", "--no-build-isolation", "-e", str(REPO))
    assert HOOK_FILES <= _files(venv)
    code = (
        "import accelerate, sys\naif = sys.modules['accelerate_inorder_fix']\nprint(aif.is_patched(), aif.__file__)\n"
    )
    out = run_py(venv, code, clean_env("1.15.0"))
    assert out.returncode == 0, out.stderr
    patched, where = out.stdout.split()
    assert patched == "True"
    assert Path(where).resolve().is_relative_to(REPO.resolve())
    _pip(venv, "uninstall", "-y", "accelerate-inorder-fix")
    assert _files(venv) - before == set()
