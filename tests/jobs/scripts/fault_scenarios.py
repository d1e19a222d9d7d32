"""Fault scenarios, for the job tests only: user errors and lost ranks, and the checks of their output.

Run as a script on every rank (`torchrun --nproc_per_node 4 fault_scenarios.py subset`), it is the
package's scenario worker (`accelerate_inorder_fix/cli/scenarios.py`, loaded as a plain module, so the
package is imported only when `AIF_PATCH=1` asks for it) with these scenarios added. The parent (a
test) imports it for `check_fault`.
"""

import importlib.util
import json
import os
import sys
from typing import Callable, Optional


def _scenarios_module():
    """The package's scenario file as a module of its own, without importing the package."""
    package = importlib.util.find_spec("accelerate_inorder_fix")
    assert package is not None and package.submodule_search_locations, "accelerate_inorder_fix is not importable"
    path = os.path.join(list(package.submodule_search_locations)[0], "cli", "scenarios.py")
    spec = importlib.util.spec_from_file_location("scenarios", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scenarios = _scenarios_module()
SCRIPT = os.path.abspath(__file__)


def subset(r: scenarios.Rank) -> None:
    """The last rank skips call 1 (a user error); a collective and another in_order call follow."""
    import time

    if r.index != r.size - 1:
        r.stagger()
        start = time.monotonic()
        r.log.info(r.tag("subset", 1), in_order=True)
        r.result("subset", "seconds", round(time.monotonic() - start, 3))
    r.result("subset", "sum", r.all_reduce_sum())
    r.stagger()
    r.log.info(r.tag("subset", 2), in_order=True)


def early_exit(r: scenarios.Rank) -> str:
    """The last rank leaves before call 1: cleanly (exit code 0) or, with `AIF_CRASH=kill`, killed.

    The others make the call and end without another collective (it could not complete).
    """
    import signal

    if r.index == r.size - 1:
        if os.environ.get("AIF_CRASH") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    r.stagger()
    r.log.info(r.tag("early_exit", 1), in_order=True)
    scenarios.say(f"{scenarios.DONE} early_exit r{r.index}")
    return "stop"


FAULT_SCENARIOS: dict[str, Callable[[scenarios.Rank], Optional[str]]] = {f.__name__: f for f in (subset, early_exit)}


def warned_ranks(lines: list[str]) -> list[list[int]]:
    """[[ranks named by one warning], ...] in output order."""
    return [[int(x) for x in m["ranks"].split(",")] for m in map(scenarios.WARNING.search, lines) if m]


def check_fault(name: str, nproc: int, lines: list[str], timeout: float, stderr: str) -> tuple[str, str]:
    """Verdict for a fault scenario in gather mode: ('ordered', '') or (problem, detail).

    Problems as in `check`, plus 'warning' (the absent rank is not named exactly once on stderr, or a
    warning went to the records' stream) and 'slow' (a rank's call took longer than the timeout + 1 s).
    The warning is on stderr and the records on stdout, so their interleaving is not checked.
    """
    last = nproc - 1
    others = list(range(last))
    finished = scenarios.done_ranks(lines, name)
    want_done = set(others) if name == "early_exit" else set(range(nproc))
    if finished != want_done:
        return "deadlock", f"ranks {sorted(want_done - finished)} never finished"
    want_sum = nproc * (nproc + 1) / 2
    for line in lines:
        if line.startswith(f"{scenarios.RESULT} {name} r"):
            key, value = line.split()[3].split("=", 1)
            if key == "sum" and json.loads(value) != want_sum:
                return "desync", f"all_reduce gave {value}, expected {want_sum}"
            if key == "seconds" and json.loads(value) > timeout + 1:
                return "slow", line
    records = scenarios.parse(lines, name)
    got = [(call, rank) for call, rank, *_ in records]
    wanted = [(1, r) for r in others] + ([(2, r) for r in range(nproc)] if name == "subset" else [])
    if got != wanted:
        return "unordered", f"records {got}, expected {wanted}"
    problem = scenarios.site_or_prefix_problem(records, lines, name)
    if problem:
        return problem
    warnings = warned_ranks(stderr.splitlines())
    if warnings != [[last]]:
        return "warning", f"warnings name {warnings}, expected [[{last}]]"
    if any(scenarios.WARNING.search(line) for line in lines):
        return "warning", "the warning went to the records' stream, not to stderr"
    return "ordered", ""


if __name__ == "__main__":
    scenarios.run_worker(sys.argv[1].split(","), FAULT_SCENARIOS)
