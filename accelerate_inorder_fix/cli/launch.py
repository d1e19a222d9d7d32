"""Start a real multi-rank job on this machine's CPUs, watch it, and never leave it behind.

Used by `python -m accelerate_inorder_fix check` and by the tests. A job is killed, with every process
it started, when its output stalls (a deadlock shows as silence) or when its hard deadline passes.
Launchers start ranks in sessions of their own, so the whole tree is found through a marker in the
environment, not through the process group alone.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Optional, Union

from .. import config as _config
from ..config import JOB_MARKER_ENV as MARKER_ENV


SCENARIO_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_command(
    script_args: list[str], nproc: int, launcher: str = "torchrun", python: Optional[str] = None
) -> list[str]:
    """The command a user would type, with this interpreter and a free loopback port."""
    python = python or sys.executable
    port = str(free_port())
    if launcher == "torchrun":
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            *script_args,
        ]
    if launcher == "accelerate":
        return [
            python,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(nproc),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            port,
            *script_args,
        ]
    raise ValueError(f"unknown launcher {launcher!r}")


class Job:
    """Outcome of one launch: merged stdout lines, stderr text, and how it ended."""

    def __init__(
        self, lines: list[str], stderr: str, returncode: Optional[int], killed: Optional[str], elapsed: float
    ) -> None:
        self.lines = lines
        self.stderr = stderr
        self.returncode = returncode
        self.killed = killed  # None, "timeout" or "stall"
        self.elapsed = elapsed

    def __repr__(self) -> str:
        return f"Job(returncode={self.returncode}, killed={self.killed!r}, elapsed={self.elapsed:.1f}s)"


def _marked_processes(marker: bytes) -> list[int]:
    """Every process whose environment carries `marker` (`NAME=value`, as bytes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # the process ended, or is not ours to read
            continue
    return found


def kill_marked(marker: bytes, within: float = 0.0) -> list[int]:
    """SIGKILL every process carrying `marker` (but this one), again until none is left or `within` s pass.

    The one process killer of `run` and `check`. Returns the marked processes still alive at the end
    (with `within=0`, one sweep: those it just sent SIGKILL to, which may not have died yet).
    """
    deadline = time.monotonic() + within
    while True:
        pids = [pid for pid in _marked_processes(marker) if pid != os.getpid()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(0.1)  # polling /proc: a killed process leaves it when the kernel has reaped it


def kill_tree(proc: subprocess.Popen[str], marker: bytes) -> None:
    """SIGKILL the launcher, its process group and every process that carries the job's marker."""
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    kill_marked(marker)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def leftovers(marker: bytes) -> list[int]:
    """Processes of a finished job that are still alive (should always be empty)."""
    return _marked_processes(marker)


def run(
    cmd: list[str],
    env: Optional[dict[str, str]] = None,
    timeout: float = 120.0,
    stall: Optional[float] = None,
    cwd: Optional[str] = None,
) -> Job:
    """Run `cmd` to completion, or kill its whole tree after `timeout` s, or `stall` s without output."""
    marker_value = uuid.uuid4().hex
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = marker_value
    # Ranks share one pipe: each line must reach it in one write, which block buffering plus an
    # explicit flush gives and PYTHONUNBUFFERED (a write per print argument) would break.
    full_env.pop("PYTHONUNBUFFERED", None)
    marker = f"{MARKER_ENV}={marker_value}".encode()
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=full_env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines, err, last = [], [], [time.monotonic()]

    def read_out() -> None:
        for line in proc.stdout or ():
            lines.append(line.rstrip("\n"))
            last[0] = time.monotonic()

    def read_err() -> None:
        err.append(proc.stderr.read() if proc.stderr is not None else "")

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    killed = None
    try:
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now - start > timeout:
                    killed = "timeout"
                elif stall is not None and lines and now - last[0] > stall:
                    killed = "stall"
                if killed:
                    kill_tree(proc, marker)
                    break
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): leave nothing behind
            kill_tree(proc, marker)
        else:
            kill_marked(marker)
    for t in readers:
        t.join(timeout=5)
    return Job(lines, "".join(err), proc.returncode, killed, time.monotonic() - start)


def scenario_env(
    patched: Union[bool, str],
    mode: Optional[str] = None,
    pythonpath: Sequence[str] = (),
    base: Optional[Mapping[str, str]] = None,
) -> dict[str, str]:
    """Environment for a scenario job: patched by import or not at all (start-up hook off).

    `patched="late"` imports the package only after the scenarios' logger exists. A user's
    `ACCELERATE_INORDER_FIX=force` reaches the patched ranks: without it, a check could never show the
    fix at work on a `log` body the guard does not know.
    """
    env = dict(os.environ if base is None else base)
    env[_config.SCENARIO_PATCH_ENV] = patched if patched == "late" else ("1" if patched else "0")
    env[_config.SWITCH_ENV] = ("force" if _config.switch() == "force" else "on") if patched else "0"
    if mode:
        env[_config.MODE_ENV] = mode
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_scenarios(
    names: list[str],
    nproc: int,
    patched: Union[bool, str],
    launcher: str = "torchrun",
    mode: Optional[str] = None,
    pythonpath: Sequence[str] = (),
    python: Optional[str] = None,
    timeout: float = 120.0,
    stall: Optional[float] = 8.0,
    base_env: Optional[Mapping[str, str]] = None,
    script: str = SCENARIO_SCRIPT,
) -> Job:
    """Launch one job that runs `names` in sequence on `nproc` ranks; return the Job.

    `script`: the scenario worker (the package's, or one that adds scenarios of its own).
    """
    cmd = launch_command([script, ",".join(names)], nproc, launcher, python)
    env = scenario_env(patched, mode, pythonpath, base_env)
    return run(cmd, env=env, timeout=timeout, stall=stall)
