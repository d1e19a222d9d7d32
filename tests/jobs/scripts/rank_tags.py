"""Every rank logs the same message once, in_order, through a handler with the format FORMAT; then exits.

In gather mode the main process prints every rank's record: each line must say which rank (and, over
several hosts, which host) it came from, whatever the accelerate release.

With `--collapse`, after that line collapse is turned on (`configure(collapse=True)`) and every rank logs
three more: the same line again, the same `%d`-formatted line, and a loss that odd ranks share and even
ranks do not. FORMAT may name `%(ranks)s` (`-` on a record without it).

With `--fake-hosts` each node's ranks report the host name `node-<GROUP_RANK>` (torchrun's node rank):
a test's stand-in for two machines when both "nodes" of a loopback job run on this one. It replaces
`socket.gethostname` in this script, before the first in_order call; the package has no test switch.

    torchrun --nproc_per_node 4 rank_tags.py FORMAT [--fake-hosts] [--collapse]
"""

import logging
import os
import socket
import sys

import accelerate_inorder_fix  # patches accelerate


FORMAT = sys.argv[1]
if "--fake-hosts" in sys.argv[2:]:
    socket.gethostname = lambda: f"node-{os.environ['GROUP_RANK']}"


def _ranks_or_dash(record):
    """`%(ranks)s` for a record without the attribute (Formatter's `defaults` is Python 3.10+)."""
    if not hasattr(record, "ranks"):
        record.ranks = "-"
    return True


def main():
    from accelerate import PartialState
    from accelerate.logging import get_logger

    rank = PartialState(cpu=True).process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_ranks_or_dash)
    base = logging.getLogger("aif.tags")
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger("aif.tags")
    log.info("shard loaded", in_order=True)
    if "--collapse" in sys.argv[2:]:
        accelerate_inorder_fix.configure(collapse=True)
        log.info("shard loaded", in_order=True)
        log.info("epoch %d done", 3, in_order=True)
        log.info("loss %s", "0.31" if rank % 2 else f"0.3{rank}", in_order=True)
    handler.flush()


if __name__ == "__main__":
    main()
