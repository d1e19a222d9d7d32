"""Gather-mode scenarios of the big-records, stopped-rank, late, tag and losses promises, one per run (`torchrun ... gather_issue44.py <scenario> [args]`).

- `big <calls> <bytes> [ahead]`: every rank logs `calls` records of `bytes` bytes; with `ahead`, rank 1
  makes all its calls before the others start theirs.
- `stop <steps> <step> <seconds> [<step> <seconds> ...]`: steps paced 50 ms apart, each an in_order call
  at two sites; rank 2 stops itself (SIGSTOP) for `seconds` before each `step` given (a helper process
  resumes it) and, after its last stop, makes its remaining (late) calls without pause. The main process
  reports its time spent in in_order calls, and each step whose calls took over T / 4 (`@@WAIT`).
- `late`: collapse on; rank 1 comes to call 2 late by 1.5 T; every record is formatted with `%(ranks)s`.
- `readahead`: two calls at a line A, then one at E, on every rank; rank 2 is 0.25 T late at A's first, and
  the main process works 1.5 T alone after it.
- `tag`: every rank logs `[RANK 1] says hi` (collapse from the environment).
- `losses <calls>`: the main process's handler raises on every record of rank 1.

A record line is `<message> by=r<k>`, k the rank of the process that wrote it (gather mode: 0). The main
process reports `@@RESULT r0 <name>=<value>`; every rank `@@DONE r<rank>` after a checked `all_reduce`.
"""

import logging
import os
import signal
import subprocess
import sys
import time


LOGGER = "aif.issue44"


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Raises(logging.Handler):
    def emit(self, record):
        if getattr(record, "rank", 0) == 1:
            raise RuntimeError("this handler refuses rank 1")


def main():
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix

    scenario, args = sys.argv[1], sys.argv[2:]
    state = PartialState(cpu=True)
    index, world = state.process_index, state.num_processes
    handler = logging.StreamHandler(sys.stdout)
    ranks = " ranks=%(ranks)s" if scenario == "late" else ""
    handler.setFormatter(logging.Formatter(f"%(message)s{ranks} by=r{index}"))
    base = logging.getLogger(LOGGER)
    base.handlers[:] = [Raises(), handler] if scenario == "losses" and index == 0 else [handler]
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger(LOGGER)
    timeout = float(os.environ["ACCELERATE_INORDER_TIMEOUT"])
    dist.barrier()
    spent = 0.0
    if scenario == "big":
        calls, size = int(args[0]), int(args[1])
        if "ahead" in args and index != 1:
            dist.barrier()
        for call in range(1, calls + 1):
            start = time.monotonic()
            log.info(f"big#{call} r{index} " + "x" * size, in_order=True)
            spent = max(spent, time.monotonic() - start)
        if "ahead" in args and index == 1:
            dist.barrier()
    elif scenario == "stop":
        steps, stops = int(args[0]), {int(at): float(seconds) for at, seconds in zip(args[1::2], args[2::2])}
        for step in range(1, steps + 1):
            if index == 2 and step in stops:
                subprocess.Popen(["sh", "-c", f"sleep {stops[step]}; kill -CONT {os.getpid()}"])
                os.kill(os.getpid(), signal.SIGSTOP)
            start = time.monotonic()
            log.info(f"stop#{step}.1 r{index}", in_order=True)  # two call sites a step, as in a training loop
            took = time.monotonic() - start
            start = time.monotonic()
            log.info(f"stop#{step}.2 r{index}", in_order=True)
            took += time.monotonic() - start
            spent += took
            if index == 0 and took > 0.25 * timeout:
                say(f"@@WAIT r0 step={step} took={took:.3f}")
            if index != 2 or step < max(stops):  # after its last stop rank 2 makes its late calls unpaced
                time.sleep(0.05)
    elif scenario == "late":
        accelerate_inorder_fix.configure(collapse=True)
        for call in range(1, 5):
            if index == 1 and call == 2:
                time.sleep(1.5 * timeout)
            log.info(f"late#{call} r{index}", in_order=True)
    elif scenario == "readahead":
        for step in (1, 2):
            if index == 2 and step == 1:
                time.sleep(0.25 * timeout)  # the main process reads rank 1's next records meanwhile
            log.info(f"ra#A{step} r{index}", in_order=True)
            if index == 0 and step == 1:
                time.sleep(1.5 * timeout)  # a checkpoint the main process writes alone
        log.info(f"ra#E r{index}", in_order=True)  # a line every rank calls, read ahead on rank 1
    elif scenario == "tag":
        log.info("[RANK 1] says hi", in_order=True)
    elif scenario == "losses":
        for call in range(1, int(args[0]) + 1):
            log.info(f"loss#{call} r{index}", in_order=True)
    if index == 0:
        say(f"@@RESULT r0 spent={spent:.3f}")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    assert value.item() == world, value
    say(f"@@DONE r{index}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
