"""README's quick start, walked from a fresh clone as a new user walks it: the install, `status`, `check`, a launch.

1. README's install block, read from README.md and run as written by bash in an empty folder: its `git clone` of
   this repository (the committed HEAD of the repo this file lives in: commit before running it), `python -m venv`,
   the activation, torch, `pip install .`, every dependency from the package registry. A README change that breaks
   a line fails here.
2. `accelerate-inorder-fix status` in that venv: exit 0, and a Python process there gets the fix, by the hook.
3. `accelerate-inorder-fix check --jobs 1`, limited to two scenarios: `rank_levels` (upstream deadlocks, the fix
   orders it) and `partial` (a user error, given up after a timeout with a warning). The full check is 9 jobs
   (~140 s on 2 cores) and the install above already costs ~2 min; CI's whole run must stay under its 45 minutes,
   and every scenario is proven elsewhere (tests/jobs/test_cli.py runs the full check, test_in_order_contract.py
   each scenario on every release). What this test adds is that the installed command runs them.
4. README's Python snippet, as a two-rank script with no import of this package, under README's
   `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu` line, with the accelerate that `pip install .` chose:
   exit 0, each rank's record once and in rank order, and the start-up hook patched every rank.

Each step is a bash command under `accelerate_inorder_fix.cli.launch.run`'s hard timeout, which kills its whole
process tree. The steps see none of the test runner's settings (its PYTHONPATH, its venv, its
`ACCELERATE_INORDER_FIX_STARTUP=0`), only the venv README's lines made. It took 122 s under a load of 5 and
222 s under a load of 8 on 2 cores (the install 68 s and 145 s of it).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from accelerate_inorder_fix.cli import launch as _launch


INSTALL_TIMEOUT = 1200.0  # a hang guard, not a bound: torch's wheel alone took 90 s under a load of 6
CHECK_TIMEOUT = 600.0  # as the full check's in test_cli.py; these three jobs took 45-60 s
LAUNCH_BOUND = 90.0  # as tests/jobs/test_readme_launch.py: a 2-rank job of one in_order call, start-up included
CHECK_SCENARIOS = ("rank_levels", "partial")
# The one substitution this machine needs: it reaches the package registries and nothing else, so torch's CPU
# wheel index cannot be reached, and README's `--index-url` option is dropped. `pip install torch==2.13.0` takes
# the CPU wheel from the local registry here (any other torch request would download a multi-GB CUDA build).
# GitHub's runners reach that index, and there README's line runs as written.
TORCH_INDEX = re.compile(r"\s+--index-url\s+https://download\.pytorch\.org/whl/cpu\b")
KEEP_TORCH_INDEX = os.environ.get("GITHUB_ACTIONS") == "true"


def quick_start_blocks(language):
    """The ```language blocks of README's quick start, in order."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Quick start")
    section = readme[start : readme.index("\n## ", start)]
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def install_script(repository, where):
    """README's install block as a bash script: `<this repository>` is `repository`, torch's index as this machine needs.

    Args:
        repository: what `git clone` clones.
        where: a file the script writes the user's folder and active venv to, when README's lines are done.
    """
    (block,) = [block for block in quick_start_blocks("bash") if "pip install ." in block]
    assert "<this repository>" in block, block
    if not KEEP_TORCH_INDEX:
        assert len(TORCH_INDEX.findall(block)) == 1, block
        block = TORCH_INDEX.sub("", block)
        torch_lines = [line for line in block.splitlines() if "torch" in line and not line.lstrip().startswith("#")]
        # A torch request other than the CPU wheel's would bring gigabytes of CUDA libraries onto this machine.
        assert [line.split("#")[0].split() for line in torch_lines] == [["pip", "install", "torch==2.13.0"]], block
    block = block.replace("<this repository>", shlex.quote(str(repository))).rstrip("\n")
    # Where the user ends up, and which venv is active: the steps after it run there.
    where = shlex.quote(str(where))
    return f'set -eo pipefail\n{block}\necho "$PWD" > {where}\necho "$VIRTUAL_ENV" >> {where}\n'


def user_env(tmp_path):
    """This machine's environment without the test runner's own settings, its venv or a user's accelerate config."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ACCELERATE_", "AIF_", "PYTHON", "VIRTUAL_ENV", "CUDA_", "TORCH"))
    }
    runner_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != runner_bin)
    env["HF_HOME"] = str(tmp_path / "hf")  # no accelerate config file of this machine's user
    return env


def in_venv(command, clone, env, timeout, stall=None):
    """Run `command` in bash in the clone's folder with README's venv activated; returns the Job.

    Args:
        command: one shell line, as a user types it after `. .venv/bin/activate`.
        clone: the folder README's `cd` left the user in.
        env: from `user_env`.
        timeout: seconds before the whole process tree is killed.
        stall: seconds without output before it is killed, or None.
    """
    return _launch.run(
        ["bash", "-c", f". .venv/bin/activate && {command}"], env=env, timeout=timeout, stall=stall, cwd=str(clone)
    )


def two_rank_script(path):
    """README's Python snippet as a script (its own logging set-up shows the INFO record), and what each rank's process had patched.

    Args:
        path: where to write it.
    """
    (snippet,) = quick_start_blocks("python")
    assert "accelerate_inorder_fix" not in snippet, snippet
    path.write_text(
        "import sys\n\n"
        f"{snippet}"
        "fix = sys.modules.get('accelerate_inorder_fix')  # only the start-up hook can have loaded it\n"
        "patched = fix is not None and fix.is_patched()\n"
        "sys.stdout.write(f'@@HOOK rank={accelerator.process_index} of={accelerator.num_processes} patched={patched}\\n')\n"
        "sys.stdout.flush()  # one write a line: two ranks share the launcher's pipe\n"
        "accelerator.end_training()\n"
    )
    return path


def launch_line(script, port):
    """README's `accelerate launch` CPU line on 2 ranks, a free loopback port (another job may hold the default)."""
    (line,) = [
        line.split(" #")[0].strip()
        for block in quick_start_blocks("bash")
        for line in block.splitlines()
        if line.startswith("ACCELERATE_USE_CPU=1 accelerate launch ")
    ]
    assert re.search(r" --num_processes \d+ ", line) and line.endswith(" train.py"), line
    line = re.sub(r" --num_processes \d+ ", f" --num_processes 2 --main_process_port {port} ", line)
    return line.removesuffix("train.py") + shlex.quote(str(script))


def test_readme_quick_start_from_a_fresh_clone(tmp_path):
    work = tmp_path / "user"
    work.mkdir()
    env = user_env(tmp_path)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)

    install = _launch.run(
        ["bash", "-c", install_script(REPO, tmp_path / "where")], env=env, timeout=INSTALL_TIMEOUT, cwd=str(work)
    )
    assert install.killed is None and install.returncode == 0, (install, install.lines[-30:], install.stderr[-3000:])
    clone, venv = map(Path, (tmp_path / "where").read_text().splitlines())
    assert venv == clone / ".venv" and clone.parent == work, (clone, venv)
    cloned = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)
    assert cloned.stdout == head.stdout != "", (cloned, head)
    freeze = in_venv("pip list --format=freeze", clone, env, timeout=120)
    installed = dict(line.split("==", 1) for line in freeze.lines if "==" in line)
    # `pip install .` kept the CPU torch installed before it, and brought no CUDA library.
    assert installed.get("torch") == "2.13.0+cpu", installed
    assert not [name for name in installed if name.lower().startswith("nvidia")], installed
    assert "accelerate" in installed and "accelerate-inorder-fix" in installed, installed

    status = in_venv("accelerate-inorder-fix status", clone, env, timeout=120)
    assert status.killed is None and status.returncode == 0, (status, status.stderr[-3000:])
    site = next(venv.glob("lib/python3*/site-packages"))
    assert status.lines[0].endswith(f"({site / 'accelerate_inorder_fix'})"), status.lines
    assert f"accelerate: {installed['accelerate']} " in "\n".join(status.lines), status.lines
    assert "a Python process here gets the fix: yes, at start-up, by the start-up hook" in status.lines, status.lines

    only = " ".join(f"--scenario {name}" for name in CHECK_SCENARIOS)
    check = in_venv(f"accelerate-inorder-fix check --jobs 1 {only}", clone, env, timeout=CHECK_TIMEOUT)
    assert check.killed is None and check.returncode == 0, (check, check.lines, check.stderr[-3000:])
    assert "1 at a time" in check.stderr.splitlines()[0], check.stderr
    rows = {
        row[0]: row[2:] for row in (re.split(r"\s{2,}", line) for line in check.lines) if row[0] in CHECK_SCENARIOS
    }
    assert rows["rank_levels"] == ["deadlock (all ranks stuck)", "ordered"], rows
    assert rows["partial"][0] == "deadlock (all ranks stuck)", rows
    assert rows["partial"][1].startswith("ordered, given up after"), rows
    assert "PASS: with the fix, every scenario is ordered on 4 ranks." in check.lines, check.lines

    script = two_rank_script(tmp_path / "train.py")
    job = in_venv(launch_line(script, _launch.free_port()), clone, env, timeout=LAUNCH_BOUND + 60, stall=60)
    assert job.killed is None and job.returncode == 0, (job, job.lines, job.stderr[-3000:])
    assert job.elapsed < LAUNCH_BOUND, job
    loaded = [re.search(r"shard (\d+) loaded$", line) for line in job.stderr.splitlines() if "loaded" in line]
    assert [match and match.group(1) for match in loaded] == ["0", "1"], job.stderr[-3000:]
    hooked = sorted(line for line in job.lines if line.startswith("@@HOOK "))
    assert hooked == [f"@@HOOK rank={rank} of=2 patched=True" for rank in (0, 1)], job.lines
    steps = {"install": install, "status": status, "check": check, "launch": job}
    print(", ".join(f"{name} {step.elapsed:.0f} s" for name, step in steps.items()))  # shown by `pytest -s`
    shutil.rmtree(work)  # torch in the venv is most of a GB; a failed run keeps it to look at


@pytest.mark.parametrize("keep", [False, True])
def test_install_script_is_readmes_block_with_only_torch_index_changed(keep, monkeypatch, tmp_path):
    """The substitution is the one named: README's lines, in order, with `--index-url` dropped off GitHub's runners."""
    monkeypatch.setattr(sys.modules[__name__], "KEEP_TORCH_INDEX", keep)
    script = install_script(tmp_path / "repo", tmp_path / "where")
    (block,) = [block for block in quick_start_blocks("bash") if "pip install ." in block]
    expected = block.replace("<this repository>", str(tmp_path / "repo"))
    assert script.splitlines()[1:-2] == (expected if keep else TORCH_INDEX.sub("", expected)).splitlines()
    assert ("--index-url" in script) is keep
