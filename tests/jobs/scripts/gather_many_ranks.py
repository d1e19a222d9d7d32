"""Every rank makes CALLS in_order calls in MODE (gather unless told); rank 0 also reports the store's key count.

Each rank's handler prefixes its lines with its own rank (`h<rank>`), so a record printed by the
main process's handler reads `h0 ...` whatever rank made it: that shows gather mode ran (in barrier
mode each rank prints its own). The last rank is slow before every 10th call, so the main process
waits for it there. A barrier after each call stands for a training step's collective. After calls
16 and CALLS rank 0 prints how many keys the job's store holds.

In gather mode MIXED more calls follow, twice: collapse off, then on (`configure(collapse=...)`, issue
36). Their messages mix identical and different ones: `mixed <phase> <k> same` on every rank (k % 3 == 1),
`... odd` on odd ranks (k % 3 == 2), `... group` on ranks 0-3 and 6 (k % 3 == 0), and `... from r<rank>`
on each other rank.

In barrier mode each rank waits, before each count, until its check-in's deletes have run (they run
in a thread of their own), so the count is of what the protocol leaves, not of what is in flight.

    torchrun --nproc_per_node 16 gather_many_ranks.py [CALLS] [MODE]
"""

import logging
import sys
import threading
import time

import accelerate_inorder_fix


CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 64
MODE = sys.argv[2] if len(sys.argv) > 2 else "gather"
MIXED = 6
SHARED = {1: "same", 2: "odd", 0: "group"}  # k % 3 -> what the ranks that share a message say


def mixed_message(phase, k, rank):
    """Rank `rank`'s message at mixed call `k`: shared with other ranks, or its own."""
    shares = (k % 3 == 1) or (k % 3 == 2 and rank % 2 == 1) or (k % 3 == 0 and rank in (0, 1, 2, 3, 6))
    return f"mixed {phase} {k} {SHARED[k % 3] if shares else f'from r{rank}'}"


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger
    from torch.distributed import distributed_c10d

    accelerate_inorder_fix.configure(mode=MODE)
    state = PartialState(cpu=True)
    rank = state.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"h{rank} %(message)s"))
    base = logging.getLogger("aif.many")
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger("aif.many")
    in_order_seconds = 0.0
    slow = threading.Event()  # waited on with a timeout: the last rank's delay, without a sleep call
    for call in range(1, CALLS + 1):
        if rank == state.num_processes - 1 and call % 10 == 0:
            slow.wait(0.05)
        start = time.perf_counter()
        log.info("call %d from r%d", call, rank, in_order=True)
        in_order_seconds += time.perf_counter() - start
        dist.barrier()  # a training step's collective: no rank runs far ahead of the main process
        if call in (16, CALLS):
            dist.barrier()  # every rank has posted (and cleaned up after) this call
            if rank == 0:
                say(f"@@KEYS after={call} keys={distributed_c10d._get_default_store().num_keys()}")
    if MODE == "gather":
        for phase in ("off", "on"):
            accelerate_inorder_fix.configure(collapse=phase == "on")
            for k in range(1, MIXED + 1):
                log.info(mixed_message(phase, k, rank), in_order=True)
                dist.barrier()
    dist.barrier()
    if rank == 0:
        say(f"@@MAIN ms_per_call={1e3 * in_order_seconds / CALLS:.2f}")  # for the benchmark notes only
    say(f"@@DONE r{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
