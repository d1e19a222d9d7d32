"""The main process's word comes late (tests/jobs/test_session_edges.py): barrier mode, a real job.

    torchrun --nproc_per_node 3 late_word.py

The script binds `init_process_group` before the package is imported (so the package's start-up hook never
sees the group start, and the main process writes its word at its first in_order call); the ranks meet at a
`barrier`, then rank 0 does 2.5 T of work of its own before a loop of `CALLS` in_order calls at one line. The
other ranks' first two calls each wait T for the word and are logged at once. Records are
`late_word#<call> r<rank>`; after each call a rank prints `@@CALL late_word r<rank> c<call> began=<wall time>
ended=<wall time>`, and after a checked `all_reduce`, `@@DONE`.
"""

import logging
import os
import sys
import time

from torch.distributed import init_process_group  # bound before the package: its hook never runs


CALLS = 5
LATE = 2.5  # of T: rank 0's own work before the loop (the others log two calls at once for want of the word)


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    init_process_group("gloo")

    import torch
    import torch.distributed as dist

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("aif.word").addHandler(handler)
    log = get_logger("aif.word", log_level="INFO")
    timeout = float(os.environ["ACCELERATE_INORDER_TIMEOUT"])
    rank = state.process_index
    dist.barrier()  # the ranks start together, so the main process's lateness is LATE T from everyone's start
    if rank == 0:
        time.sleep(LATE * timeout)  # the main process's own work (a checkpoint) before the line
    for call in range(1, CALLS + 1):
        began = time.time()
        log.info(f"late_word#{call} r{rank}", main_process_only=False, in_order=True)
        say(f"@@CALL late_word r{rank} c{call} began={began:.3f} ended={time.time():.3f}")
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    say(f"@@RESULT late_word r{rank} sum={value.item()}")
    say(f"@@DONE late_word r{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
