"""The command line, driven as a user drives it: `python -m accelerate_inorder_fix ...` in a subprocess.

`check` starts real CPU ranks; the tests use 2 ranks to spare the machine. Every subprocess has a hard
timeout, and each `check` run carries a marker of its own in its environment, so a test can see that
no process it started is still alive afterwards.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


TEST_MARKER_ENV = "AIF_CLI_TEST_ID"


def _env(version, extra=None):
    """`version` is a release set up by scripts/setup.sh, or a folder holding an accelerate."""
    env = dict(os.environ)
    where = version if os.path.isdir(str(version)) else accelerate_dir(version)
    env["PYTHONPATH"] = os.pathsep.join([str(where), str(REPO)])
    env.pop("ACCELERATE_INORDER_FIX", None)
    env.pop("ACCELERATE_INORDER_MODE", None)
    env.update(extra or {})
    return env


def cli(*args, version="1.15.0", env=None, timeout=60):
    """Run the CLI to completion; returns CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "accelerate_inorder_fix", *args],
        env=_env(version, env),
        cwd=str(REPO / "tests"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(marker_value):
    return _launch.leftovers(f"{TEST_MARKER_ENV}={marker_value}".encode())


def check_cli(*args, version, timeout=200):
    """Run `check` with a marker; assert that nothing it started outlives it."""
    marker = uuid.uuid4().hex
    result = cli("check", "--nproc", "2", *args, version=version, env={TEST_MARKER_ENV: marker}, timeout=timeout)
    assert alive(marker) == [], "check left processes behind"
    return result


def table_rows(stdout):
    """{scenario: (unpatched, patched)} from the verdict table."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("scenario "))
    columns = [m.start() for m in re.finditer(r"-+", lines[head + 1])]
    rows = {}
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip(columns, [*columns[1:], None])]
        rows[cells[0]] = (cells[2], cells[3])
    return rows


# --- status -------------------------------------------------------------------------------------


def test_status_names_versions_body_and_outlook():
    result = cli("status")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The package's folder, not the folder of the module that prints it.
    assert out.splitlines()[0].endswith(f"({REPO / 'accelerate_inorder_fix'})"), out
    assert "accelerate: 1.15.0" in out
    assert "torch: 2." in out
    assert "log body: known, the one of accelerate 1.13.0-1.16.x" in out
    assert "a Python process here gets the fix: yes" in out
    assert "mode: barrier (default)" in out
    assert "collapse: off (default)" in out
    assert "start-up hook:" in out


def test_status_json_for_machines():
    result = cli(
        "status", "--json", version="1.12.0", env={"ACCELERATE_INORDER_FIX": "0", "ACCELERATE_INORDER_MODE": "bogus"}
    )
    assert result.returncode == 2, result.stderr  # the bad mode word: named, and the exit code says it
    facts = json.loads(result.stdout)
    assert [bad["name"] for bad in facts["invalid_settings"]] == ["ACCELERATE_INORDER_MODE"]
    assert facts["accelerate"]["version"] == "1.12.0"
    assert facts["accelerate"]["log_body"] == {
        "known": True,
        "release_line": "0.30.1-1.12.x",
        "fingerprint": "301aa7733fb21c20",
    }
    assert facts["would_patch"]["patched"] is False and "ACCELERATE_INORDER_FIX" in facts["would_patch"]["how"]
    assert facts["this_process"]["patched"] is False
    assert facts["mode"]["value"] == "barrier" and "bogus" in facts["mode"]["ignored"]
    assert "available" in facts["startup_hook"]


GOOD = {
    "ACCELERATE_INORDER_MODE": " Gather ",
    "ACCELERATE_INORDER_TIMEOUT": "2.5",
    "ACCELERATE_INORDER_FIX": "on",
    "ACCELERATE_INORDER_FIX_STARTUP": "0",
    "ACCELERATE_INORDER_COLLAPSE": " On ",
}


@pytest.mark.parametrize(
    "name,bad",
    [
        ("ACCELERATE_INORDER_MODE", "bogus"),
        ("ACCELERATE_INORDER_TIMEOUT", "-1"),
        ("ACCELERATE_INORDER_FIX", "of"),
        ("ACCELERATE_INORDER_FIX_STARTUP", "disable"),
        ("ACCELERATE_INORDER_COLLAPSE", "maybe"),
    ],
)
def test_status_exits_2_naming_an_invalid_setting_and_0_when_every_setting_is_good(name, bad):
    good = cli("status", env=GOOD)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "INVALID SETTING" not in good.stdout
    assert "collapse: on (from ACCELERATE_INORDER_COLLAPSE)" in good.stdout
    result = cli("status", env={**GOOD, name: bad})
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("INVALID SETTING")]
    assert line.startswith(f"INVALID SETTING: {name}={bad!r}: "), line


def test_status_without_accelerate_or_torch_says_so():
    # Blocking the imports is what a machine without them looks like to the CLI.
    code = (
        "import sys; sys.modules['accelerate'] = sys.modules['torch'] = None\n"
        "from accelerate_inorder_fix.cli.main import main; sys.exit(main(['status']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=_env("1.15.0"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "accelerate: NOT INSTALLED" in result.stdout
    assert "torch: NOT INSTALLED" in result.stdout
    assert "gets the fix: NO, accelerate is not installed" in result.stdout


@pytest.fixture(scope="module")
def altered_accelerate(tmp_path_factory):
    """accelerate 1.15.0 with one harmless statement added to `log`: a body the guard does not know."""
    root = tmp_path_factory.mktemp("altered")
    shutil.copytree(os.path.join(accelerate_dir("1.15.0"), "accelerate"), root / "accelerate")
    source = root / "accelerate" / "logging.py"
    text = source.read_text()
    anchor = "        if PartialState._shared_state == {}:\n"
    assert text.count(anchor) == 1
    source.write_text(text.replace(anchor, "        _vendored = True\n" + anchor))
    return root


def test_status_on_an_unknown_log_body(altered_accelerate):
    result = cli("status", version=altered_accelerate)
    assert result.returncode == 0, result.stderr
    assert "log body: UNKNOWN" in result.stdout
    assert "gets the fix: NO, this accelerate's log body is not one the package was tested against" in result.stdout
    forced = json.loads(
        cli("status", "--json", version=altered_accelerate, env={"ACCELERATE_INORDER_FIX": "force"}).stdout
    )
    assert forced["would_patch"]["patched"] is True and "forced" in forced["would_patch"]["how"]
    assert forced["this_process"]["patched"] is True


def test_check_fails_where_the_guard_stands_aside(altered_accelerate):
    result = check_cli("--scenario", "rank_levels", version=altered_accelerate)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNKNOWN log body" in result.stdout.splitlines()[0]
    assert table_rows(result.stdout)["rank_levels"] == ("deadlock (all ranks stuck)", "deadlock (all ranks stuck)")
    assert "FAIL: with the fix, 1 scenario(s) are not ordered: rank_levels." in result.stdout
    assert "ACCELERATE_INORDER_FIX=force" in result.stdout


# --- bad arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["check", "--nproc", "0"], "--nproc: must be at least 2"),
        (["check", "--nproc", "two"], "--nproc: must be a whole number"),
        (["check", "--mode", "scatter"], "--mode: invalid choice: 'scatter'"),
        (["check", "--timeout", "-3"], "--timeout: must be a positive number of seconds"),
        (["check", "--jobs", "0"], "--jobs: must be at least 1, not 0"),
        (["check", "--scenario", "nope"], "--scenario: invalid choice: 'nope'"),
        (["launch"], "invalid choice: 'launch'"),
        (["status", "--verbose"], "unrecognized arguments: --verbose"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_arguments_exit_2_with_a_plain_error(args, words):
    result = cli(*args, timeout=30)
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_points_at_main():
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"accelerate-inorder-fix": "accelerate_inorder_fix.cli.main:main"}


# --- check --------------------------------------------------------------------------------------


def test_check_on_1_12_shows_the_deadlock_and_the_fix():
    # 9 jobs, 3 at a time: a deadlocked job only waits
    result = check_cli("--jobs", "3", version="1.12.0", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("accelerate 1.12.0 (log body of 0.30.1-1.12.x)")
    rows = table_rows(result.stdout)
    assert rows["default"][0] == "deadlock (all ranks stuck)"
    assert rows["all_processes"][0] == "ignored (unordered)"
    assert {patched for name, (_, patched) in rows.items() if name != "partial"} == {"ordered"}
    assert rows["partial"][0] == "ordered"  # 1.12's rank 0 never synchronises: no harm there
    # Patched, the main process's call waits for the ranks that never make it: the row says what it cost.
    assert re.fullmatch(r"ordered, given up after \d+\.\d s with a warning", rows["partial"][1]), rows["partial"]
    assert "unpatched (any mode)" in result.stdout and "patched (barrier mode)" in result.stdout
    assert len(rows) == 8
    assert "PASS: with the fix, every scenario is ordered on 2 ranks." in result.stdout
    assert "unpatched default" in result.stderr  # progress, as each job ends


def test_check_on_1_15_rank_dependent_levels_fail_unpatched():
    result = check_cli("--scenario", "default", "--scenario", "rank_levels", "-v", version="1.15.0")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert rows == {"default": ("ordered", "ordered"), "rank_levels": ("deadlock (all ranks stuck)", "ordered")}
    assert "unpatched rank_levels: deadlock" in result.stdout  # -v explains it
    assert "Without the fix, 1 of 2 scenarios go wrong" in result.stdout


def test_check_jobs_1_runs_its_jobs_one_after_the_other():
    result = check_cli("--jobs", "1", "--scenario", "default", version="1.15.0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert table_rows(result.stdout) == {"default": ("ordered", "ordered")}
    assert "check: 2 jobs of 2 CPU ranks (torchrun, gloo), 1 at a time: " in result.stderr, result.stderr
    finished = [
        (float(m.group(1)), int(m.group(2)))
        for m in map(re.compile(r"^  (?:un)?patched .*\[([\d.]+) s, at (\d+) s\]$").match, result.stderr.splitlines())
        if m
    ]
    assert len(finished) == 2, result.stderr
    (first, _), (second, second_at) = finished
    # One at a time: the second job ended after both had run their whole time (1 s for the rounding).
    assert second_at >= first + second - 1, finished


def test_check_gather_mode_passes_the_mode_through():
    result = check_cli("--mode", "gather", "--scenario", "default", version="1.15.0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mode gather" in result.stdout.splitlines()[0]


def _ctrl_c_as_in_a_terminal():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_check_interrupted_leaves_no_process_behind():
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelerate_inorder_fix", "check", "--nproc", "2", "--scenario", "default"],
        env=_env("1.12.0", {TEST_MARKER_ENV: marker}),
        cwd=str(REPO / "tests"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As in a terminal: a suite started in the background of a non-interactive shell ignores
        # SIGINT, which its children inherit (Python then leaves Ctrl-C ignored, as it should).
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    try:
        # Wait for ranks: the CLI, 2 launchers and at least one rank carry the marker.
        deadline = time.monotonic() + 90
        while len(alive(marker)) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, "check ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in alive(marker):  # never leave the machine dirty, even when the test fails
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert alive(marker) == []
