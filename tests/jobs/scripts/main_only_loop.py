"""A main-only in_order call in a loop, next to an every-rank in_order call.

    ACCELERATE_INORDER_MODE=gather torchrun --nproc_per_node 4 main_only_loop.py steps5,steps20

Each case is a loop of its own two call sites, as a user writes it:

    for step in ...:
        if accelerator.is_main_process:
            logger.info(..., in_order=True)       # `<case>_main#<step> r0`: only rank 0 makes it
        logger.info(..., in_order=True)           # `<case>_all#<step> r<rank>`: every rank makes it
        all_reduce(...)                           # a training step's collective (`steps5`, `steps20`)

`all_first5` and `all_first20` make the every-rank call first; `free5` is `steps5` without the
collective: the other ranks run ahead of the main process.
Before its every-rank call a rank other than the main process waits a little, rank 1 longest, so a
block that is not whole or not in rank order shows in the output. Every record line ends with ` by=r<k>`, the rank of the
process that wrote it (gather mode: r0). After each case a checked `all_reduce`, then `@@DONE case r<rank>`;
`@@RESULT case r<rank> key=json` lines carry the main process's measurements: `in_calls`, the seconds
it spent in its in_order calls (the every-rank ones include waiting out the others' stagger),
`main_calls`, those in its main-only calls, and `slow_calls`, how many took longer than half the timeout.

The package is imported explicitly (the test-suite keeps the start-up hook off). `ACCELERATE_INORDER_TIMEOUT`
is the job's timeout (the tests use 2).
"""

import json
import logging
import os
import sys
import time


LOGGER = "aif.mainonly"
STAGGER = 0.02  # seconds per rank, before the every-rank call: rank k > 0 waits (size - k) x this


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Rank:
    def __init__(self, state, log):
        self.state, self.log = state, log
        self.index, self.size = state.process_index, state.num_processes
        self.timeout = float(os.environ.get("ACCELERATE_INORDER_TIMEOUT", "30"))
        self.slow_calls = 0
        self.in_calls = self.main_calls = 0.0

    def result(self, case, key, value):
        say(f"@@RESULT {case} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return value.item()

    def timed(self, call, main_only=False):
        """Run one in_order call: add up its time; count it if it took longer than half the timeout."""
        start = time.monotonic()
        call()
        took = time.monotonic() - start
        self.in_calls += took
        self.main_calls += took if main_only else 0.0
        if took > self.timeout / 2:
            self.slow_calls += 1

    def stagger(self):
        if self.index:  # the main process first, then the last rank, .., rank 1 latest
            time.sleep(STAGGER * (self.size - self.index))

    def measure(self, case, loop):
        self.slow_calls, self.in_calls, self.main_calls = 0, 0.0, 0.0
        loop()
        if self.index == 0:
            self.result(case, "in_calls", round(self.in_calls, 3))
            self.result(case, "main_calls", round(self.main_calls, 3))
            self.result(case, "slow_calls", self.slow_calls)


# Each case has call sites of its own (a site's count and absences carry over between cases that share one).


def steps5(r):
    def loop():
        for step in range(1, 6):
            if r.state.is_main_process:
                r.timed(lambda: r.log.info(f"steps5_main#{step} r{r.index}", in_order=True), main_only=True)
            r.stagger()
            r.timed(lambda: r.log.info(f"steps5_all#{step} r{r.index}", in_order=True))
            r.all_reduce_sum()

    r.measure("steps5", loop)


def steps20(r):
    def loop():
        for step in range(1, 21):
            if r.state.is_main_process:
                r.timed(lambda: r.log.info(f"steps20_main#{step} r{r.index}", in_order=True), main_only=True)
            r.stagger()
            r.timed(lambda: r.log.info(f"steps20_all#{step} r{r.index}", in_order=True))
            r.all_reduce_sum()

    r.measure("steps20", loop)


def all_first5(r):
    def loop():
        for step in range(1, 6):
            r.stagger()
            r.timed(lambda: r.log.info(f"all_first5_all#{step} r{r.index}", in_order=True))
            if r.state.is_main_process:
                r.timed(lambda: r.log.info(f"all_first5_main#{step} r{r.index}", in_order=True), main_only=True)
            r.all_reduce_sum()

    r.measure("all_first5", loop)


def all_first20(r):
    def loop():
        for step in range(1, 21):
            r.stagger()
            r.timed(lambda: r.log.info(f"all_first20_all#{step} r{r.index}", in_order=True))
            if r.state.is_main_process:
                r.timed(lambda: r.log.info(f"all_first20_main#{step} r{r.index}", in_order=True), main_only=True)
            r.all_reduce_sum()

    r.measure("all_first20", loop)


def free5(r):
    def loop():
        for step in range(1, 6):
            if r.state.is_main_process:
                r.timed(lambda: r.log.info(f"free5_main#{step} r{r.index}", in_order=True), main_only=True)
            r.stagger()
            r.timed(lambda: r.log.info(f"free5_all#{step} r{r.index}", in_order=True))

    r.measure("free5", loop)


CASES = {f.__name__: f for f in (steps5, steps20, all_first5, all_first20, free5)}


def main(names):
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

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
