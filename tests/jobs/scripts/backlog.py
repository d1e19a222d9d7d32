"""Ranks far ahead of the main process, in gather mode (3 ranks), and the job's store counted throughout.

    ACCELERATE_INORDER_MODE=gather torchrun --nproc_per_node 3 backlog.py

Cases in sequence, each after a barrier:
1. Every rank but the main process makes `BACKLOG` in_order calls at a site the main process never calls
   from (`ahead#<n> r<rank>`) while it sits in the barrier; then every rank makes `COMMON` in_order calls at
   one site (`common#<k> r<rank>`), with no collective between them. A rank reports the seconds of its
   slowest calls (`@@SLOW r<rank> <json>`); the main process `@@RESULT r0 calls=<json>`.
2. `LOOP` in_order calls on every rank in a tight loop, no collective (`loop#<n> r<rank>`); the main process
   counts the store's keys every 250 calls (`@@KEYS during=<json>`, less the count before the first call).
3. `BIG` records of 20 KB on every rank (`big#<n> r<rank> <20,000 x>`, printed cut: `... len=<n>`); the main
   process's keys as in 2 and its resident memory before and after (`@@RSS r0 before=<kB> after=<kB>`).
4. Losses: a message whose `str` raises (`LOSS_CALLS` calls), `extra={"message": ...}`, and, on the main
   process, a handler that raises on every record placed before the StreamHandler (`raising#<k>`); then
   that handler is gone (`last r<rank>`).
At exit (a handler registered before the first in_order call, so it runs after the package's own) every
rank sets `aif-test/exit/<rank>`; the main process waits for all, deletes them and reports
`@@KEYS after=<n>`: the store's keys less the job's own before the first in_order call (0: the package left none).

A record line ends with ` by=r<k>`, the rank of the process that wrote it (gather mode: 0); every rank
`@@DONE r<rank>` after a checked `all_reduce`.

The package is imported explicitly (the test-suite keeps the start-up hook off).
"""

import atexit
import datetime
import json
import logging
import resource
import sys
import time


LOGGER = "aif.backlog"
BACKLOG = 20_000
COMMON = 5
LOOP = 10_000
BIG, BIG_SIZE = 3_000, 20_000
LOSS_CALLS = 4


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str for you")


class Raising(logging.Handler):
    def emit(self, record):
        raise OSError("disk full")


class Cut(logging.StreamHandler):
    """Prints a record's first 40 characters and its length: 20 KB lines would swamp the launcher's pipe."""

    def __init__(self, index):
        super().__init__(sys.stdout)
        self.index = index

    def emit(self, record):
        message = record.getMessage()
        self.stream.write(f"{message[:40].rstrip('x ')} len={len(message)} by=r{self.index}\n")
        self.flush()


def rss_kb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() // 1024


def at_exit(store, index, world, base):
    """After the package's own exit handlers: every rank says it is done, the main process counts the keys."""
    store.set(f"aif-test/exit/{index}", b"1")
    if index == 0:
        names = [f"aif-test/exit/{r}" for r in range(world)]
        store.wait(names, datetime.timedelta(seconds=60))
        for name in names:
            store.delete_key(name)
        say(f"@@KEYS after={store.num_keys() - base}")


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    state = PartialState(cpu=True)
    index, world = state.process_index, state.num_processes
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s by=r{index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger(LOGGER)
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    # The job's own keys: the package's (the main process's session word, written when the process group
    # started, already there) are counted with the rest, so that 0 after the job means the package left none.
    ours = dist.PrefixStore("accelerate_inorder_fix/", store)  # as the package reads it
    keys_before = store.num_keys() - int(ours.check(["session"]))
    atexit.register(at_exit, store, index, world, keys_before)  # before the package's: runs after it
    dist.barrier()
    start = time.monotonic()
    slow = []
    if index > 0:
        for n in range(1, BACKLOG + 1):
            call = time.monotonic()
            log.info(f"ahead#{n} r{index}", in_order=True)
            if time.monotonic() - call > 0.5:
                slow.append(round(time.monotonic() - call, 3))
    say(f"@@SLOW r{index} {json.dumps(slow)} total={time.monotonic() - start:.3f}")
    dist.barrier()
    took = []
    for k in range(1, COMMON + 1):
        start = time.monotonic()
        log.info(f"common#{k} r{index}", in_order=True)
        took.append(round(time.monotonic() - start, 3))
    if index == 0:
        say(f"@@RESULT r0 calls={json.dumps(took)}")

    dist.barrier()
    during = []
    for n in range(1, LOOP + 1):
        log.info(f"loop#{n} r{index}", in_order=True)
        if index == 0 and n % 250 == 0:
            during.append(store.num_keys() - keys_before)
    if index == 0:
        say(f"@@KEYS during={json.dumps(during)}")

    dist.barrier()
    base.removeHandler(handler)
    base.addHandler(Cut(index))
    before = rss_kb()
    during = []
    for n in range(1, BIG + 1):
        log.info(f"big#{n} r{index} " + "x" * BIG_SIZE, in_order=True)
        if index == 0 and n % 100 == 0:
            during.append(store.num_keys() - keys_before)
    if index == 0:
        say(f"@@KEYS big={json.dumps(during)}")
        say(f"@@RSS r0 before={before} after={rss_kb()}")
    base.handlers = [handler]

    dist.barrier()
    for _ in range(LOSS_CALLS):
        log.info(Unprintable(), in_order=True)
    log.info("extra#1 r%d", index, extra={"message": "clash"}, in_order=True)
    if index == 0:
        base.handlers.insert(0, Raising())
    for k in range(1, LOSS_CALLS + 1):
        log.info(f"raising#{k} r{index}", in_order=True)
    base.handlers = [handler]
    log.info(f"last r{index}", in_order=True)

    value = torch.tensor([float(index + 1)])
    dist.all_reduce(value)
    assert value.item() == world * (world + 1) / 2, value
    say(f"@@DONE r{index}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
