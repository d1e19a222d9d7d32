"""A gather-mode job whose main process hosts the store and exits first.

Run under `spawn_ranks.py 2 main_exits_first.py` (env://: rank 0's process hosts the TCPStore, as under
notebook_launcher, debug_launcher or a plain `init_process_group`). Both ranks make one in_order call;
rank 0 returns at once (its exit seals the queues and takes the store's server with it); rank 1 waits
until rank 0's process is gone, then makes two in_order calls and returns. Rank 1 reports each call's
seconds (`@@SECONDS r1 <call> <s>`) and `@@DONE r1` at its end; records print as `<message> by=r<rank>`.
"""

import logging
import os
import sys
import time


LOGGER = "aif.exits"


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def main():
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches accelerate; the mode comes from the environment)

    state = PartialState(cpu=True)
    index = state.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s by=r{index}"))
    base = logging.getLogger(LOGGER)
    base.handlers[:], base.propagate = [handler], False
    base.setLevel(logging.INFO)
    log = get_logger(LOGGER)
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    log.info(f"before r{index}", in_order=True)
    if index == 0:
        say("@@DONE r0")
        return  # the interpreter's exit closes the session, then the store's server goes with the process
    while not gone(pids[0]):  # the test's rank waits for rank 0's end (spawn_ranks reaps it first)
        time.sleep(0.05)
    for call in (1, 2):
        start = time.monotonic()
        log.info(f"after#{call} r{index}", in_order=True)
        say(f"@@SECONDS r1 {call} {time.monotonic() - start:.3f}")
    say("@@DONE r1")


if __name__ == "__main__":
    main()
