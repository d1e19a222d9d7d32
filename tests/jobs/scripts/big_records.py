"""Records too large for the job's store, then ordinary ones, in gather mode (2 ranks).

    ACCELERATE_INORDER_MODE=gather torchrun --nproc_per_node 2 big_records.py

Every rank makes the same in_order calls: one record each of 1, 9 and 20 MB of ASCII and one of
1,200,000 emoji (4.8 MB of UTF-8, over the 4 MiB cut), then `AFTER` ordinary ones, then one whose
%-format fails (`logger.info("badformat %d", "x")`). A record line is
`[RANK r] <name> r<rank> <body> by=r<k>`, k the rank of the process that wrote it (gather mode: 0).
The main process reports `@@RESULT r0 slowest=<s>` (its slowest in_order call) and every rank
`@@DONE r<rank>` after a checked `all_reduce`.

The package is imported explicitly (the test-suite keeps the start-up hook off).
"""

import json
import logging
import sys
import time


LOGGER = "aif.big"
BODIES = {
    "mb1": "x" * 10**6,
    "mb9": "x" * (9 * 10**6),
    "mb20": "x" * (20 * 10**6),
    "emoji": "\U0001f600" * 1_200_000,
}
AFTER = 5


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
    messages = [f"{name} r{index} {body}" for name, body in BODIES.items()]
    messages += [f"after#{k} r{index} end" for k in range(1, AFTER + 1)]
    dist.barrier()
    slowest = 0.0
    for message in messages:
        start = time.monotonic()
        log.info(message, in_order=True)
        slowest = max(slowest, time.monotonic() - start)
    log.info("badformat %d", "x", in_order=True)  # every rank's, the main process's own too: a note, no traceback
    if index == 0:
        say(f"@@RESULT r0 slowest={json.dumps(round(slowest, 3))}")
    value = torch.tensor([float(index + 1)])
    dist.all_reduce(value)
    assert value.item() == 3.0, value
    say(f"@@DONE r{index}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
