"""in_order calls that not every rank makes, run on every rank of a real job (tests/jobs/test_barrier_checkin.py).

    torchrun --nproc_per_node 4 partial_calls.py main_only_hidden

Each case makes in_order calls whose messages name the case, the call and the rank
(`case#call r<rank>`); every record line ends with ` by=r<k>`, the rank of the process that wrote it.
After each case a checked `all_reduce` shows whether any rank skipped or added a barrier (a hang, or a
wrong sum), then `@@DONE case r<rank>`; `@@RESULT case r<rank> key=json` lines carry measurements.

The package is imported explicitly (the test-suite keeps the start-up hook off). Environment:
`ACCELERATE_INORDER_TIMEOUT` (the tests use 3), `AIF_CASE_LOOPS` (calls of the main-only loop, 20),
`AIF_NO_CHECKIN=1` (every call's check-in answers "plain barriers" at once: barrier mode as before it).
"""

import json
import logging
import os
import sys
import time


LOGGER = "aif.partial"
LOOPS = int(os.environ.get("AIF_CASE_LOOPS", "20"))


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Rank:
    def __init__(self, state, log):
        self.index, self.size, self.log, self.state = state.process_index, state.num_processes, log, state

    def result(self, case, key, value):
        say(f"@@RESULT {case} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return value.item()

    def ordered_calls(self, case, first, last):
        """Calls `first`..`last` at one site, made by every rank, the low ranks latest (unordered output would show)."""
        for call in range(first, last + 1):
            time.sleep(0.05 * (self.size - 1 - self.index))
            self.log.info(f"{case}#{call} r{self.index}", in_order=True)


def _timed(r, case, calls):
    start = time.monotonic()
    calls()
    r.result(case, "seconds", round(time.monotonic() - start, 3))


# main_only_hidden and main_only_shown are alike on purpose: each case needs an in_order call site of its
# own (a site's count and suspects carry over between cases that share one).


def main_only_hidden(r):
    """`if is_main_process: logger.debug(..., in_order=True)` at INFO level in a loop, then ordinary calls."""

    def calls():
        for call in range(1, LOOPS + 1):
            if r.state.is_main_process:
                r.log.debug(f"main_only_hidden#{call} r{r.index}", in_order=True)

    _timed(r, "main_only_hidden", calls)
    r.ordered_calls("main_only_hidden", LOOPS + 1, LOOPS + 5)


def main_only_shown(r):
    """The same at an enabled level: rank 0 prints each of its records."""

    def calls():
        for call in range(1, LOOPS + 1):
            if r.state.is_main_process:
                r.log.info(f"main_only_shown#{call} r{r.index}", in_order=True)

    _timed(r, "main_only_shown", calls)
    r.ordered_calls("main_only_shown", LOOPS + 1, LOOPS + 5)


def skip_one(r):
    """The last rank skips call 2 of 10 at one call site."""

    def calls():
        for call in range(1, 11):
            if not (r.index == r.size - 1 and call == 2):
                r.log.info(f"skip_one#{call} r{r.index}", in_order=True)

    _timed(r, "skip_one", calls)


def late_rank(r):
    """The last rank arrives 0.6 x the timeout late: still in time, so ordered, with no warning."""
    timeout = float(os.environ["ACCELERATE_INORDER_TIMEOUT"])
    if r.index == r.size - 1:
        time.sleep(0.6 * timeout)
    r.ordered_calls("late_rank", 1, 1)


def switch(r):
    """Rank 3 alone asks for gather mode before the first call (overruled); then every rank switches."""
    import accelerate_inorder_fix

    if r.index == 3:
        accelerate_inorder_fix.configure(mode="gather")
    r.ordered_calls("switch", 1, 2)
    accelerate_inorder_fix.configure(mode="gather")
    r.ordered_calls("switch", 3, 4)
    accelerate_inorder_fix.configure(mode="barrier")
    r.ordered_calls("switch", 5, 6)


CASES = {f.__name__: f for f in (main_only_hidden, main_only_shown, skip_one, late_rank, switch)}


def main(names):
    from accelerate import PartialState

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    if os.environ.get("AIF_NO_CHECKIN") == "1":
        from accelerate_inorder_fix.gather import GatherSession

        GatherSession.check_in = lambda self, state, settings, site: "plain"
    from accelerate.logging import get_logger

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{state.process_index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    rank = Rank(state, get_logger(LOGGER))
    for name in names:
        CASES[name](rank)
        rank.result(name, "sum", rank.all_reduce_sum())
        say(f"@@DONE {name} r{rank.index}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
