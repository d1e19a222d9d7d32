"""The session's edges, run on every rank of a real job (tests/jobs/test_session_edges.py).

    torchrun --nproc_per_node 3 session_edges.py first_call,fork_locked,one_sided,at_exit

Each case makes in_order calls whose messages name the case, the call and the rank (`case#call r<rank>`,
` child` for a forked child's); every record line ends with ` by=r<k> p<pid>`: the rank of the process
whose handler wrote it, and the process that made the record. After each case a collective checks that
no rank skipped or added a barrier, and `@@DONE case r<rank>` is printed; `@@RESULT case r<rank> key=json`
lines carry measurements. `ACCELERATE_INORDER_TIMEOUT` is T.

`at_exit` must come last: it registers nothing itself (the exit handler is registered before any in_order
call, so it runs after the package closed its session), and the job then leaves its process group up.
"""

import atexit
import json
import logging
import os
import sys
import threading
import time


LOGGER = "aif.edges"
STAGGER = 0.05  # s: rank k waits (size - 1 - k) x this before an ordered call: unordered output would show


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def timeout():
    return float(os.environ["ACCELERATE_INORDER_TIMEOUT"])


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

    def stagger(self):
        time.sleep(STAGGER * (self.size - 1 - self.index))


def _start_child(target):
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=target)
    child.start()
    return child


def _end_child(child, wait):
    """The child's exit code; None when it was still running after `wait` s (it is killed)."""
    child.join(wait)
    if child.exitcode is None:
        child.kill()
        child.join()
        return None
    return child.exitcode


# -- barrier mode ---------------------------------------------------------------------------------


def first_call(r):
    """Before any in_order call each rank forks a child; then 3 steps of a loop (an all_reduce each) whose first
    in_order call rank 0 skips; then the child logs from `shared`, then every rank 3 times, ordered."""
    import multiprocessing

    def shared(call, who):
        r.log.info(f"first_call#{call} r{r.index}{who}", in_order=True)

    go = multiprocessing.get_context("fork").Event()
    child = _start_child(lambda: go.wait(10 * timeout()) and shared(0, " child"))
    for step in range(1, 4):
        if not (r.index == 0 and step == 1):
            start = time.monotonic()
            r.log.info(f"first_call#{10 + step} r{r.index}", in_order=True)
            r.result("first_call", f"step{step}", round(time.monotonic() - start, 3))
        r.all_reduce_sum()
    go.set()
    r.result("first_call", "pid", os.getpid())
    r.result("first_call", "child_exitcode", _end_child(child, 3 * timeout()))
    r.all_reduce_sum()
    for call in range(1, 4):
        r.stagger()
        shared(call, "")


def fork_locked(r):
    """A thread of ranks 1 and 2 is inside an in_order call (rank 0 comes T/2 late) when the main thread forks a
    child that logs in_order: the child must not block on the lock its parent's thread held."""

    def call(who=""):
        r.log.info(f"fork_locked#{0 if who else 1} r{r.index}{who}", in_order=True)

    if r.index == 0:
        time.sleep(timeout() / 2)
        call()
        return
    inside = threading.Thread(target=call)
    inside.start()
    time.sleep(0.3)  # test side: the thread is in its check-in, waiting for rank 0
    child = _start_child(lambda: call(" child"))
    r.result("fork_locked", "child_exitcode", _end_child(child, 3 * timeout()))
    inside.join()


def one_sided(r):
    """Mid-job, rank 1 alone calls configure(mode="gather") (a user error), then every rank logs 3 times."""
    import accelerate_inorder_fix

    if r.index == 1:
        accelerate_inorder_fix.configure(mode="gather")
    start = time.monotonic()
    for call in range(1, 4):
        r.stagger()
        r.log.info(f"one_sided#{call} r{r.index}", in_order=True)
    r.result("one_sided", "seconds", round(time.monotonic() - start, 3))


def at_exit(r):
    """Nothing now: the exit handler (registered first, so it runs after the package closed) makes the calls."""


def _exit_calls(r):
    """At exit: ranks 1 and 2 log in_order; rank 0 does not, and stays up 2 T (its own exit work)."""
    import torch.distributed as dist

    if r.index == 0:
        time.sleep(2 * timeout())
    else:
        start = time.monotonic()
        r.log.info(f"at_exit#1 r{r.index}", in_order=True)
        r.result("at_exit", "seconds", round(time.monotonic() - start, 3))
    dist.destroy_process_group()


# -- gather mode ----------------------------------------------------------------------------------


def first_post(r):
    """The job's first in_order call, in a loop with an all_reduce per step: rank 0 skips it at step 1. The other
    ranks' posts must not wait for the main process's mode word."""
    for step in range(1, 4):
        if not (r.index == 0 and step == 1):
            start = time.monotonic()
            r.log.info(f"first_post#{step} r{r.index}", in_order=True)
            r.result("first_post", f"step{step}", round(time.monotonic() - start, 3))
        r.all_reduce_sum()


def others_only(r):
    """`if not is_main_process: logger.info(..., in_order=True)` next to an every-rank call, 30 steps of 0.1 s
    (1.5 T in all), an all_reduce each. The main process says how many calls its collector still keeps."""
    from accelerate_inorder_fix import testing

    for step in range(1, 31):
        if not r.state.is_main_process:
            r.log.info(f"others_only#{step} r{r.index}", in_order=True)
        r.log.info(f"others_only#{100 + step} r{r.index}", in_order=True)
        r.all_reduce_sum()
        time.sleep(0.1)
    if r.state.is_main_process:
        r.result("others_only", "kept", len(testing.side()._collector.pending))  # a look inside


CASES = {f.__name__: f for f in (first_call, fork_locked, one_sided, at_exit, first_post, others_only)}


def main(names):
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{state.process_index} p%(process)d"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    rank = Rank(state, get_logger(LOGGER))
    if "at_exit" in names:
        atexit.register(_exit_calls, rank)
    for name in names:
        CASES[name](rank)
        rank.result(name, "sum", rank.all_reduce_sum())
        say(f"@@DONE {name} r{rank.index}")
    if "at_exit" not in names:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
