"""`accelerate-inorder-fix check`: show the bug and the fix on this machine, with real CPU ranks.

Every scenario of `scenarios.py` runs twice under torchrun (gloo): unpatched, one job per scenario so a
deadlock in one cannot hide what the others do, and patched, all scenarios in one job. As many jobs run
at once as the machine's cores allow (`--jobs`; one on a 2-core machine), each in a child process
that either imports the package or does not: this process, which has imported it, never runs a
scenario itself.

Every process a job starts carries `CHECK_MARKER_ENV` in its environment, so an interrupted check can
find and kill them all, whichever launcher started them and in whatever session.
"""

import contextlib
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Optional

from ..config import CHECK_MARKER_ENV, TIMEOUT_ENV
from . import launch as _launch
from . import scenarios
from .launch import Job


# Starting ranks is CPU work: by default a job's ranks get a core each (`default_jobs`). Each process
# (rank or launcher) also holds torch in memory, so free memory bounds how many run at once, whatever
# `--jobs` asks for.
MAX_PROCESSES_AT_ONCE = 40
MEMORY_PER_PROCESS = 300 * 2**20
# A job that never prints (it hangs before its first record) is only caught by this deadline.
HARD_DEADLINE = 240.0
PROGRESS_EVERY = 15.0

DESCRIPTIONS = {
    "default": "info(msg, in_order=True)",
    "all_processes": "... with main_process_only=False",
    "rank_levels": "rank 0 at INFO, other ranks at WARNING",
    "disabled_odd": "logging.disable on odd ranks",
    "exception": "exception(...) inside except",
    "many": "8 in_order calls among plain ones",
    "caller": "caller file/line of the records",
    "partial": "in_order call on the main process only",
}
# The patched job's ACCELERATE_INORDER_TIMEOUT, unless the user set one: `partial` waits that long for
# the ranks that never make its call, and must end well within the stall watchdog.
PATCHED_TIMEOUT = 3.0


class Outcome:
    """The verdict of one scenario in one column: a short word for the table and the detail."""

    def __init__(self, word: str, detail: str = "", ok: bool = False) -> None:
        self.word = word
        self.detail = detail
        self.ok = ok


def _ranks_text(ranks: Sequence[int], nproc: int) -> str:
    if list(ranks) == list(range(nproc)):
        return "all ranks"
    return "ranks " + ",".join(str(r) for r in ranks) if len(ranks) > 1 else f"rank {ranks[0]}"


def judge(name: str, nproc: int, job: Job) -> Outcome:
    """Outcome of scenario `name` in a finished (or killed) job."""
    finished = scenarios.done_ranks(job.lines, name)
    if finished != set(range(nproc)) and job.killed is None and job.returncode != 0:
        tail = job.stderr.strip().splitlines()[-1:] or ["no error output"]
        return Outcome(f"crashed (exit {job.returncode})", tail[0])
    if not job.lines and job.killed == "timeout":
        tail = job.stderr.strip().splitlines()[-1:] or ["nothing on stderr either"]
        return Outcome("never started", f"no rank printed anything before the hard deadline; {tail[0]}")
    verdict, detail = scenarios.check(name, nproc, [*job.lines, *job.stderr.splitlines()])  # warnings: stderr
    if verdict == "deadlock":
        stuck = sorted(set(range(nproc)) - finished)
        how = "its output stopped" if job.killed == "stall" else "its hard deadline passed"
        return Outcome(f"deadlock ({_ranks_text(stuck, nproc)} stuck)", f"{detail}; stopped because {how}")
    words = {
        "ordered": "ordered",
        "unordered": "ignored (unordered)",
        "desync": "desync (collectives mismatched)",
        "missing": "records missing",
        "caller": "wrong caller",
        "traceback": "traceback misplaced",
        "prefix": "wrong [RANK n] prefix",
        "warning": "a rank reported missing",
        "slow": "call too slow",
    }
    if verdict == "ordered" and name in scenarios.PARTIAL:
        return Outcome(partial_word(job), detail, ok=True)
    return Outcome(words.get(verdict, verdict), detail, ok=verdict == "ordered")


# The package's warning about the `partial` call (gather mode: "... scenarios.py:173 in partial (call 1 ...";
# barrier mode's check-in: "... scenarios.py:173 in partial: ...").
_PARTIAL_WARNING = re.compile(r"accelerate-inorder-fix: in_order call at .* in partial(?: \(call \d+ from there\))?: ")


def partial_word(job: Job) -> str:
    """`partial`, ordered: and what it cost rank 0, which waited for ranks that never made the call."""
    warned = any(map(_PARTIAL_WARNING.search, [*job.lines, *job.stderr.splitlines()]))
    if not warned:
        return "ordered"
    seconds = scenarios.slowest_calls(job.lines, "partial").get(0)
    waited = "" if seconds is None else f" after {seconds:.1f} s"
    return f"ordered, given up{waited} with a warning"


def judge_all(names: list[str], nproc: int, job: Job) -> dict[str, Outcome]:
    """Outcomes of scenarios run in sequence in one job: after a deadlock the rest never ran."""
    outcomes, blocked = {}, None
    for name in names:
        if blocked:
            outcomes[name] = Outcome("not reached", f"the job stopped at {blocked}")
            continue
        outcomes[name] = judge(name, nproc, job)
        if scenarios.done_ranks(job.lines, name) != set(range(nproc)):
            blocked = name
    if names and blocked is None and job.killed is None and job.returncode != 0:
        # Every rank finished every scenario, then the job failed: at exit. Not hidden behind "ordered".
        aborted = "terminate called without an active exception" in job.stderr
        tail = job.stderr.strip().splitlines()[-1:] or ["no error output"]
        detail = "a rank aborted at interpreter exit (SIGABRT)" if aborted else tail[0]
        outcomes[names[-1]] = Outcome(f"crashed at exit (exit {job.returncode})", detail)
    return outcomes


def _address_clash(job: Job) -> bool:
    return job.killed is None and job.returncode != 0 and "address already in use" in job.stderr.lower()


def _marked(check_id: str) -> list[int]:
    return _launch.leftovers(f"{CHECK_MARKER_ENV}={check_id}".encode())


def kill_marked(check_id: str, within: float = 3.0) -> list[int]:
    """SIGKILL every process carrying this check's marker, until none is left (or `within` s pass)."""
    return _launch.kill_marked(f"{CHECK_MARKER_ENV}={check_id}".encode(), within)


def _available_memory() -> Optional[int]:
    """Bytes of memory available now (Linux), or None when this system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def default_jobs(nproc: int, cores: int) -> int:
    """Jobs at once when the user does not say (`--jobs`): a core per rank, and never fewer than one job.

    Args:
        nproc (`int`): ranks per job.
        cores (`int`): the cores this process may use (`usable_cores`).
    """
    return max(1, cores // nproc)


def memory_allows(nproc: int) -> int:
    """How many jobs of `nproc` ranks (plus a launcher each) fit in this machine's free memory (at least 1)."""
    processes = MAX_PROCESSES_AT_ONCE
    memory = _available_memory()
    if memory is not None:
        # Leave a third of what is free to everything else on the machine.
        processes = min(processes, int(memory * 2 / 3) // MEMORY_PER_PROCESS)
    return max(1, processes // (nproc + 1))


def jobs_at_once(nproc: int, jobs: int, wanted: int) -> int:
    """How many of `jobs` jobs of `nproc` ranks run at once: `wanted`, as far as free memory allows.

    Args:
        nproc (`int`): ranks per job.
        jobs (`int`): the jobs to run; never more at once.
        wanted (`int`): the user's `--jobs`, or `default_jobs`.
    """
    return max(1, min(jobs, wanted, memory_allows(nproc)))


def _child_pythonpath() -> list[str]:
    """This package's folder for the ranks, unless they would find it anyway.

    `python -m accelerate_inorder_fix` from a source tree finds the package through the current
    directory (sys.path[0]); the ranks run a script elsewhere, so they need it spelled out.
    """
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found_anyway = [os.path.abspath(p) for p in sys.path[1:] if p]
    return [] if parent in found_anyway else [parent]


def _job_env(check_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env[CHECK_MARKER_ENV] = check_id
    extra = _child_pythonpath()
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), *extra])
    # Every rank is on this machine: loopback always works, while the hostname may resolve to an
    # address gloo cannot reach (common on cluster nodes).
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in env and os.path.isdir("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C for the duration (only the main thread may change signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Check:
    """One run of the self-test; `run()` returns {scenario: (unpatched Outcome, patched Outcome)}."""

    def __init__(
        self,
        nproc: int,
        mode: Optional[str] = None,
        stall: float = 8.0,
        names: Optional[list[str]] = None,
        say: Optional[Callable[[str], None]] = None,
        on_start: Optional[Callable[[], None]] = None,
        jobs: Optional[int] = None,
    ) -> None:
        self.nproc = nproc
        self.wanted = default_jobs(nproc, usable_cores()) if jobs is None else jobs
        self.mode = mode
        self.stall = stall
        self.on_start = on_start or (lambda: None)
        self.names = list(names or scenarios.CHECK_SCENARIOS)
        self.say = say or (lambda text: None)
        self.check_id = uuid.uuid4().hex
        self.cancelled = threading.Event()
        self.workers = jobs_at_once(nproc, len(self.names) + 1, self.wanted)  # jobs at a time

    def _launch(self, names: list[str], patched: bool) -> Optional[Job]:
        env = _job_env(self.check_id)
        job = None
        for _attempt in range(2):  # a port taken between picking and binding it: try once more
            if self.cancelled.is_set():
                return None
            job = _launch.run(
                _launch.launch_command([_launch.SCENARIO_SCRIPT, ",".join(names)], self.nproc),
                env=_launch.scenario_env(patched, self.mode, base=self._timeout_env(env)),
                timeout=HARD_DEADLINE,
                stall=self.stall,
            )
            if not _address_clash(job):
                break
        return job

    def _timeout_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with the check-in's timeout bounded below the stall watchdog (a user's own value is kept)."""
        if TIMEOUT_ENV not in env:
            env = dict(env, **{TIMEOUT_ENV: f"{min(PATCHED_TIMEOUT, self.stall / 2):g}"})
        return env

    def _unpatched(self, name: str) -> tuple[Optional[dict[str, Outcome]], Optional[Job]]:
        job = self._launch([name], patched=False)
        return None if job is None else {name: judge(name, self.nproc, job)}, job

    def _patched(self) -> tuple[Optional[dict[str, Outcome]], Optional[Job]]:
        job = self._launch(self.names, patched=True)
        return None if job is None else judge_all(self.names, self.nproc, job), job

    def run(self) -> dict[str, tuple[Outcome, Outcome]]:
        if self.workers < min(self.wanted, len(self.names) + 1):
            self.say(
                f"  ({self.workers} job(s) at a time, not {self.wanted}, to stay within this machine's free memory)"
            )
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="aif-check")
        start = time.monotonic()
        try:
            # The patched job first: it is the longest, and it decides the exit code.
            futures = {pool.submit(self._patched): "patched"}
            futures.update({pool.submit(self._unpatched, name): name for name in self.names})
            self.on_start()
            results = self._collect(futures, start)
        except BaseException:  # Ctrl-C, SIGTERM, or a bug here: leave no rank behind, then re-raise
            with _sigint_ignored():  # a second Ctrl-C must not stop the clean-up half-way
                self.cancelled.set()
                pool.shutdown(wait=False, cancel_futures=True)
                kill_marked(self.check_id)
                pool.shutdown(wait=True)
                kill_marked(self.check_id)
            raise
        pool.shutdown(wait=True)
        return results

    def _collect(self, futures: dict[Future[Any], str], start: float) -> dict[str, tuple[Outcome, Outcome]]:
        unpatched: dict[str, Outcome] = {}
        patched: dict[str, Outcome] = {}
        pending = set(futures)
        last_news = time.monotonic()
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            now = time.monotonic()
            for future in done:
                outcomes, job = future.result()
                label = futures[future]
                (patched if label == "patched" else unpatched).update(outcomes)
                self.say(self._news(label, outcomes, job, now - start))
                last_news = now
            if pending and now - last_news > PROGRESS_EVERY:
                self.say(progress(len(pending), self.workers, len(_marked(self.check_id)), now - start))
                last_news = now
        return {name: (unpatched[name], patched[name]) for name in self.names}

    def _news(self, label: str, outcomes: dict[str, Outcome], job: Job, elapsed: float) -> str:
        if label == "patched":
            bad = [n for n, o in outcomes.items() if not o.ok]
            text = "all ordered" if not bad else "NOT ordered: " + ", ".join(bad)
            return f"  patched   (all scenarios)   {text}  [{job.elapsed:.1f} s, at {elapsed:.0f} s]"
        return f"  unpatched {label:<16}  {outcomes[label].word}  [{job.elapsed:.1f} s, at {elapsed:.0f} s]"


def progress(pending: int, workers: int, processes: int, elapsed: float) -> str:
    """The progress line: jobs running (at most `workers` at a time) and jobs waiting for their turn.

    Args:
        pending (`int`): jobs not finished yet.
        workers (`int`): jobs at a time.
        processes (`int`): the check's processes alive now.
        elapsed (`float`): seconds since the check started.
    """
    running = min(pending, workers)
    waiting = f", {pending - running} waiting" if pending > running else ""
    return (
        f"  ... {running} job(s) running ({workers} at a time){waiting}, {processes} processes, {elapsed:.0f} s so far"
    )


def table(results: dict[str, tuple[Outcome, Outcome]], mode: Optional[str] = None) -> list[str]:
    """The side-by-side verdict table, as lines; `mode`: the patched column's, named in its heading.

    The unpatched column does not depend on the mode (upstream has none): its heading says so.
    """
    patched = f"patched ({mode} mode)" if mode else "patched"
    rows = [("scenario", "what it does", "unpatched (any mode)", patched)]
    rows += [(name, DESCRIPTIONS.get(name, ""), before.word, after.word) for name, (before, after) in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
