"""Ranks started every way a job can be, each making in_order calls (tests/jobs/test_any_launcher.py).

    python any_launcher.py CASE NPROC

CASE: `notebook` / `debug` (accelerate's `notebook_launcher` / `debug_launcher`, which fork the ranks),
`fork` / `spawn` (multiprocessing, `init_process_group` in each child, tcp://), `file` (spawn, file://),
`reinit` (tcp://: calls, `destroy_process_group`, `init_process_group` again, calls), `threads` (a
thread logs at site S while the main thread logs at site A, then all_reduce, 5 times), `worker` (a
child forked from each rank while its group exists logs at once). Every record is `CASE#i rR` (site
S: `CASE#Si rR`) on stdout; the parent checks rank order and that each comes once.
"""

import logging
import os
import sys
import tempfile
import threading
import time


CALLS = 3


def logger():
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401 -- the patch

    log = get_logger("any_launcher")
    if not log.logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.logger.addHandler(handler)
        log.logger.setLevel(logging.INFO)
        log.logger.propagate = False
    return log


def calls(case, rank, n=CALLS, site=""):
    log = logger()
    for i in range(n):
        log.info(f"{case}#{site}{i} r{rank}", in_order=True)


def calls_at_s(case, rank, site, delay):
    """One call from another line than `calls`: another site (after `delay` s)."""
    time.sleep(delay)
    logger().info(f"{case}#{site}0 r{rank}", in_order=True)


def in_launcher(case):
    """The function accelerate's launchers run in each rank."""
    from accelerate import PartialState

    state = PartialState(cpu=True)
    calls(case, state.process_index)
    state.wait_for_everyone()


def in_child(rank, world, init_method, case):
    """A multiprocessing rank: its own process group, then accelerate's state over it."""
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    from accelerate import PartialState

    PartialState(cpu=True)
    if case == "reinit":
        calls(case, rank)
        dist.destroy_process_group()
        again = init_method.replace(os.environ["AIF_PORT"], os.environ["AIF_PORT2"])
        dist.init_process_group("gloo", init_method=again, rank=rank, world_size=world)
        calls(case, rank, site="again")
    elif case == "threads":
        # Rank 0 enters site S before A, the others A before S: a lock held across a call would have each rank
        # wait at a different site (the delays only provoke that order; nothing relies on them).
        for rep in range(5):
            thread = threading.Thread(target=calls_at_s, args=(case, rank, f"S{rep}-", 0.0 if rank == 0 else 0.3))
            thread.start()
            time.sleep(0.3 if rank == 0 else 0.0)
            calls(case, rank, 1, f"A{rep}-")
            thread.join()
            dist.all_reduce(torch.ones(1))
    elif case == "worker":
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=calls, args=(case, rank, 1, "W"))
        child.start()
        child.join(60)
        calls(case, rank)
    else:
        calls(case, rank)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def main(case, nproc):
    if case in ("notebook", "debug"):
        import accelerate

        launcher = accelerate.notebook_launcher if case == "notebook" else accelerate.debug_launcher
        logger()  # the parent imported accelerate and the package before the ranks fork
        launcher(in_launcher, (case,), num_processes=nproc)
        return 0
    import multiprocessing

    os.environ["AIF_PORT"], os.environ["AIF_PORT2"] = free_port(), free_port()
    if case == "file":
        init_method = "file://" + os.path.join(tempfile.mkdtemp(), "store")
    else:
        init_method = f"tcp://127.0.0.1:{os.environ['AIF_PORT']}"
    context = multiprocessing.get_context("fork" if case in ("fork", "worker") else "spawn")
    if case in ("fork", "worker"):
        logger()  # the parent imported accelerate and the package before the ranks fork
    procs = [context.Process(target=in_child, args=(r, nproc, init_method, case)) for r in range(nproc)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return max(proc.exitcode or 0 for proc in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
