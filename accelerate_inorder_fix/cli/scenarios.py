"""The in_order scenarios, run on every rank of a real job, and the checks of their output.

Run as a script on each rank (`torchrun --nproc_per_node N scenarios.py default,rank_levels`), it
imports nothing from this package unless `AIF_PATCH=1` asks it to, so the same file also exercises an
unpatched or a source-patched accelerate. The parent reads the merged stdout of all ranks and calls
`check(name, nproc, lines)`.

Every record carries its own expected call site (`at=func:line`); the log format appends the real
one (`@@func:line`) and the rank of the process that wrote the line (`by=rN`): in gather mode the main
process writes every record, so `writers` shows which path ran. Before each in_order call the low ranks sleep longest, so an unordered
implementation prints the ranks in reverse: the order checks cannot pass by luck.

Every rank calls in these scenarios, so no rank may be reported missing and no call may take long: each
rank times its in_order calls and reports its slowest (`slowest_call`); `check` fails a run with a
"sent no record" warning or a call slower than `call_bound(nproc)`, well below gather mode's
timeout, so a rank that stops posting its empty marker shows at once, not through a watchdog.
"""

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional


STAGGER_SECONDS = 0.15
# A call waits at most for the rank that sleeps longest (barrier mode), plus this much scheduling noise.
CALL_SLACK_SECONDS = 5.0
LOGGER_NAME = "aif.scenarios"
DONE = "@@DONE"
RESULT = "@@RESULT"

# ---------------------------------------------------------------------------------------------
# Worker side (runs on every rank)
# ---------------------------------------------------------------------------------------------


def say(line: str) -> None:
    """One line in one write, so ranks sharing a pipe never split each other's lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Rank:
    """What a scenario needs to know about its rank."""

    def __init__(self, index: int, size: int, log: Any) -> None:
        self.index = index
        self.size = size
        self.log = log
        self.slowest_call = 0.0

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Around an in_order call (a `with`, not a wrapper: the call's own frame stays the caller)."""
        import time

        start = time.monotonic()
        try:
            yield
        finally:
            self.slowest_call = max(self.slowest_call, time.monotonic() - start)

    def stagger(self) -> None:
        """Sleep longest on rank 0, nothing on the last rank (test-side only)."""
        import time

        time.sleep(STAGGER_SECONDS * (self.size - 1 - self.index))

    def tag(self, scenario: str, call: int) -> str:
        where = sys._getframe(1)
        return f"{scenario}#{call} r{self.index} at={where.f_code.co_name}:{where.f_lineno}"

    def result(self, scenario: str, key: str, value: Any) -> None:
        say(f"{RESULT} {scenario} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self) -> float:
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return float(value.item())


def default(r: Rank) -> None:
    r.stagger()
    with r.timed():
        r.log.info(r.tag("default", 1), in_order=True)


def all_processes(r: Rank) -> None:
    r.stagger()
    with r.timed():
        r.log.info(r.tag("all_processes", 1), main_process_only=False, in_order=True)


def rank_levels(r: Rank) -> None:
    import logging

    logging.getLogger(LOGGER_NAME).setLevel(logging.INFO if r.index == 0 else logging.WARNING)
    r.stagger()
    with r.timed():
        r.log.info(r.tag("rank_levels", 1), in_order=True)
    r.result("rank_levels", "sum", r.all_reduce_sum())
    r.stagger()
    with r.timed():
        r.log.warning(r.tag("rank_levels", 2), in_order=True)
    logging.getLogger(LOGGER_NAME).setLevel(logging.DEBUG)


def disabled_odd(r: Rank) -> None:
    import logging

    if r.index % 2:
        logging.disable(logging.INFO)
    r.stagger()
    with r.timed():
        r.log.info(r.tag("disabled_odd", 1), in_order=True)
    r.result("disabled_odd", "sum", r.all_reduce_sum())
    logging.disable(logging.NOTSET)
    r.stagger()
    with r.timed():
        r.log.info(r.tag("disabled_odd", 2), in_order=True)


def exception(r: Rank) -> None:
    try:
        raise ValueError(f"boom r{r.index}")
    except ValueError:
        r.stagger()
        with r.timed():
            r.log.exception(r.tag("exception", 1), in_order=True)


MANY_CALLS = 8


def many(r: Rank) -> None:
    for call in range(1, MANY_CALLS + 1):
        if call % 3 == 0:
            r.log.info(f"plain main-only {call}")
            r.log.info(f"plain everywhere {call} r{r.index}", main_process_only=False)
        if call % 2:
            r.stagger()
        with r.timed():
            r.log.info(r.tag("many", call), in_order=True)


def caller(r: Rank) -> None:
    # Only the call sites are checked here, not the order (the other scenarios do that), so the
    # call-site bug of 0.20-0.30.0 shows on its own.
    with r.timed():
        r.log.warning(r.tag("caller", 1), main_process_only=False, in_order=True)
    r.log.warning(r.tag("caller", 2), main_process_only=False)


SCENARIOS: dict[str, Callable[[Rank], Optional[str]]] = {
    f.__name__: f for f in (default, all_processes, rank_levels, disabled_odd, exception, many, caller)
}


def partial(r: Rank) -> None:
    """Only the main process makes the call (a user error: in_order calls are collective).

    Patched, it costs the other ranks' absence one `ACCELERATE_INORDER_TIMEOUT` and a warning: `check`
    runs it with a short timeout; the other users of `SCENARIOS` would wait the default 30 s.
    """
    if r.index == 0:
        with r.timed():
            r.log.info(r.tag("partial", 1), in_order=True)


# What `check` runs: the scenarios, and the user error the check-in bounds.
PARTIAL = {"partial": partial}
CHECK_SCENARIOS = {**SCENARIOS, **PARTIAL}


def run_worker(names: list[str], extra: Optional[dict[str, Callable[[Rank], Optional[str]]]] = None) -> None:
    """This rank's side of a scenario job: run `names` (from `CHECK_SCENARIOS`, or `extra`) in sequence."""
    # AIF_PATCH=1: import the package before accelerate; =late: after the logger exists (loggers
    # created before the patch must be covered too); anything else: leave accelerate as it is.
    patch = os.environ.get("AIF_PATCH")
    if patch == "1":
        import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    import logging

    from accelerate import PartialState
    from accelerate.logging import get_logger

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s:%(lineno)d by=r{state.process_index}"))
    base = logging.getLogger(LOGGER_NAME)
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    base.propagate = False
    rank = Rank(state.process_index, state.num_processes, get_logger(LOGGER_NAME))
    if patch == "late":
        import accelerate_inorder_fix  # noqa: F401
    for name in names:
        if {**CHECK_SCENARIOS, **(extra or {})}[name](rank) == "stop":
            return  # the scenario ended the job on this rank (a lost rank: no collective can follow)
        # A collective after every scenario: a rank that skipped or added a barrier shows up here as
        # a hang or a wrong sum, as it would in the user's next training step.
        rank.result(name, "sum", rank.all_reduce_sum())
        rank.result(name, "slowest_call", round(rank.slowest_call, 3))
        rank.slowest_call = 0.0
        say(f"{DONE} {name} r{rank.index}")
    # Tear the process group down explicitly, as a script should: torch 2.13 with gloo can abort at
    # exit ("terminate called without an active exception") when the group is left to interpreter
    # exit. The package's own store threads are released before this (`store.teardown`) and at exit; the
    # launcher's exit code is judged (`check.judge_all`), so an abort at exit is never hidden.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Parent side (reads the merged output of all ranks)
# ---------------------------------------------------------------------------------------------

# A record line: gather mode's host tag (jobs over several hosts), upstream's or gather mode's rank tag,
# then what the scenario logged and what the format appends.
_RECORD = re.compile(
    r"^(?:\[(?P<host>[^\]\s]+)\] )?(?:\[RANK (?P<prefix>\d+)\] )?"
    r"(?P<tag>\w+)#(?P<call>\d+) r(?P<rank>\d+) at=(?P<want>\S+) @@(?P<got>\S+)(?: by=r(?P<by>\d+))?$"
)


def _expected_records(name: str, nproc: int) -> list[tuple[int, list[int]]]:
    """[(call, [ranks in order])] that a correct in_order implementation prints."""
    everyone = list(range(nproc))
    if name == "rank_levels":
        return [(1, [0]), (2, everyone)]
    if name == "disabled_odd":
        return [(1, [r for r in everyone if r % 2 == 0]), (2, everyone)]
    if name == "many":
        return [(call, everyone) for call in range(1, MANY_CALLS + 1)]
    if name == "caller":
        return [(1, everyone), (2, everyone)]
    if name == "partial":
        return [(1, [0])]
    return [(1, everyone)]


def parse(lines: list[str], name: str) -> list[tuple[int, int, str, str, int]]:
    """The records of scenario `name` in output order: [(call, rank, want, got, index)]."""
    records = []
    for index, line in enumerate(lines):
        m = _RECORD.match(line.rstrip("\n"))
        if m and m["tag"] == name:
            records.append((int(m["call"]), int(m["rank"]), m["want"], m["got"], index))
    return records


def writers(lines: list[str], name: str) -> dict[tuple[int, int], Optional[int]]:
    """{(call, rank): rank of the process that wrote the record} for scenario `name` (None: not said)."""
    found = {}
    for m in map(_RECORD.match, lines):
        if m and m["tag"] == name:
            found[(int(m["call"]), int(m["rank"]))] = int(m["by"]) if m["by"] else None
    return found


def _wrong_prefix(lines: list[str], name: str) -> Optional[str]:
    """The first record whose `[RANK n]` prefix (accelerate 1.13+) names another rank than its own, or None."""
    for m in map(_RECORD.match, lines):
        if m and m["tag"] == name and m["prefix"] not in (None, m["rank"]):
            return m.string
    return None


def done_ranks(lines: list[str], name: str) -> set[int]:
    return {int(line.split()[2][1:]) for line in lines if line.startswith(f"{DONE} {name} ")}


def call_bound(nproc: int) -> float:
    """The longest an in_order call of these scenarios may take on `nproc` ranks, every rank calling."""
    return STAGGER_SECONDS * (nproc - 1) + CALL_SLACK_SECONDS


def check(name: str, nproc: int, lines: list[str]) -> tuple[str, str]:
    """Verdict for one scenario: ('ordered', '') or (problem, detail).

    Problems: 'deadlock' (not every rank finished), 'desync' (a collective after the call paired
    wrongly), 'warning' (a rank reported missing: every rank calls here), 'unordered', 'missing',
    'caller' (wrong call site), 'prefix' (a `[RANK n]` prefix that names another rank), 'traceback',
    'slow' (a call slower than `call_bound`).
    """
    finished = done_ranks(lines, name)
    if finished != set(range(nproc)):
        stuck = sorted(set(range(nproc)) - finished)
        return "deadlock", f"ranks {stuck} never finished"
    want_sum = nproc * (nproc + 1) / 2
    for line in lines:
        if line.startswith(f"{RESULT} {name} r") and "sum=" in line:
            got = json.loads(line.split("sum=", 1)[1])
            if got != want_sum:
                return "desync", f"all_reduce gave {got}, expected {want_sum}"
    named = _named_missing(lines, name)
    if named:
        return "warning", f"a rank was reported missing, though every rank calls: {named}"
    records = parse(lines, name)
    wanted = [(call, rank) for call, ranks in _expected_records(name, nproc) for rank in ranks]
    got = [(call, rank) for call, rank, *_ in records]
    if sorted(got) != sorted(wanted):
        return "missing", f"records {got}, expected {wanted}"
    if name != "caller" and got != wanted:
        return "unordered", f"records {got}, expected {wanted}"
    problem = site_or_prefix_problem(records, lines, name)
    if problem:
        return problem
    if name == "exception":
        for _, rank, _, _, index in records:
            block = lines[index + 1 : index + 8]
            tail = next((line for line in block if line.startswith("ValueError")), None)
            if not block or not block[0].startswith("Traceback") or tail != f"ValueError: boom r{rank}":
                return "traceback", f"record of rank {rank} is not followed by its own traceback"
    slow = slowest_calls(lines, name)
    if slow and max(slow.values()) > call_bound(nproc):
        return "slow", f"slowest in_order call per rank {slow} s, bound {call_bound(nproc):g} s"
    return "ordered", ""


WARNING = re.compile(r"accelerate-inorder-fix: in_order call at .*: ranks? (?P<ranks>[\d, ]+) sent no record within")


def _named_missing(lines: list[str], name: str) -> Optional[str]:
    """The first "sent no record" warning about scenario `name`'s calls (or about no call), else None."""
    functions = set(CHECK_SCENARIOS)
    if name in PARTIAL:  # its ranks are missing by design: the warning is the point
        return None
    for line in lines:
        if WARNING.search(line):
            about = {f for f in functions if f" in {f} (call " in line}
            if name in about or not about:
                return line
    return None


def slowest_calls(lines: list[str], name: str) -> dict[int, float]:
    """{rank: its slowest in_order call of scenario `name`, seconds} from the ranks' results."""
    prefix = f"{RESULT} {name} r"
    found: dict[int, float] = {}
    for line in lines:
        if line.startswith(prefix) and " slowest_call=" in line:
            rank, value = line[len(prefix) :].split(" slowest_call=", 1)
            found[int(rank)] = json.loads(value)
    return found


def site_or_prefix_problem(
    records: list[tuple[int, int, str, str, int]], lines: list[str], name: str
) -> Optional[tuple[str, str]]:
    """('caller', detail) or ('prefix', detail) for the first record reporting the wrong site or rank, else None."""
    for call, rank, want, where, _ in records:
        if want != where:
            return "caller", f"record {call} of rank {rank} reports {where}, the call is at {want}"
    wrong = _wrong_prefix(lines, name)
    if wrong:
        return "prefix", f"a record's [RANK n] prefix is not its rank's: {wrong}"
    return None


if __name__ == "__main__":
    run_worker(sys.argv[1].split(",") if len(sys.argv) > 1 else list(SCENARIOS))
