"""Ranks far ahead of the main process, in gather mode (3 ranks): backlogs, then common calls.

    ACCELERATE_INORDER_MODE=gather torchrun --nproc_per_node 3 backlog.py

Every rank but the main process first makes `BACKLOG` in_order calls at a site the main process never calls from
(`ahead#<n> r<rank>`), then every rank meets at a barrier and makes `COMMON` in_order calls at one site
(`common#<k> r<rank>`), with no collective between them. A record line ends with ` by=r<k>`, the rank
of the process that wrote it (gather mode: 0). The main process reports `@@RESULT r0 calls=<json>`,
the seconds each of its common calls took; every rank `@@DONE r<rank>` after a checked `all_reduce`.

The package is imported explicitly (the test-suite keeps the start-up hook off).
"""

import json
import logging
import sys
import time


LOGGER = "aif.backlog"
BACKLOG = 20_000
COMMON = 5


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
    index = state.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s by=r{index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger(LOGGER)
    if index > 0:
        for n in range(1, BACKLOG + 1):
            log.info(f"ahead#{n} r{index}", in_order=True)
    dist.barrier()
    took = []
    for k in range(1, COMMON + 1):
        start = time.monotonic()
        log.info(f"common#{k} r{index}", in_order=True)
        took.append(round(time.monotonic() - start, 3))
    if index == 0:
        say(f"@@RESULT r0 calls={json.dumps(took)}")
    value = torch.tensor([float(index + 1)])
    dist.all_reduce(value)
    assert value.item() == 6.0, value
    say(f"@@DONE r{index}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
