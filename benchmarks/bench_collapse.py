"""Benchmark: what collapse costs the main process where it prints, off and on paired in one process.

Collapse changes only the main process's printing (`Collector._emit_block`): with it on, each record's
message is formatted once more and grouped before the handlers run. Here the real `Collector` prints
blocks of `--ranks` records whose messages all differ (`[RANK r] step i r<r>`: nothing to group, the
worst case) through a `StreamHandler` to os.devnull (format `%(message)s %(funcName)s:%(lineno)d`, as
`bench_scale.py`'s), collapse off and on alternating batch by batch (the order rotated), so a drift of
the machine's speed falls on both. Figures: the median over `--pairs` of each batch's CPU per block
(`time.process_time`), and the median of the pairs' on / off ratios.

    python benchmarks/bench_collapse.py --ranks 8,1024 --pairs 21
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

from accelerate_inorder_fix import config
from accelerate_inorder_fix.gather import collector as _collector


LOGGER = "aif.bench.collapse"
SITE = ("/job/train.py", "train_step", 42)


def _block(ranks: int, call: int) -> dict[int, logging.LogRecord]:
    """One call's records, every rank's message its own, tagged and stamped as gather mode's are."""
    block = {}
    for rank in range(ranks):
        record = logging.LogRecord(
            LOGGER, logging.INFO, SITE[0], SITE[2], f"[RANK {rank}] step {call} r{rank}", None, None
        )
        record.rank, record.hostname, record.funcName = rank, "node-a", SITE[1]
        block[rank] = record
    return block


def _batch(main: _collector.Collector, ranks: int, blocks: int, collapse: bool) -> float:
    """CPU seconds per block to print `blocks` blocks of `ranks` records with collapse `collapse`."""
    config.SETTINGS.configure(collapse=collapse)
    made = [_block(ranks, call) for call in range(blocks)]  # made outside the timed part
    start = time.process_time()
    for call, block in enumerate(made):
        main._emit_block(block, (SITE, call))
    return (time.process_time() - start) / blocks


def measure(ranks: int, pairs: int, records: int) -> dict[str, float]:
    """Median CPU ms per block, off and on, and the median on / off ratio of `pairs` paired batches."""
    main = _collector.Collector(None, ranks)  # type: ignore[arg-type]  # prints only: no queues
    blocks = max(2, records // ranks)
    off: list[float] = []
    on: list[float] = []
    _batch(main, ranks, blocks, False), _batch(main, ranks, blocks, True)  # warm-up
    for pair in range(pairs):
        for collapse in (False, True) if pair % 2 == 0 else (True, False):
            (on if collapse else off).append(_batch(main, ranks, blocks, collapse))
    ratios = [b / a for a, b in zip(off, on)]
    return {
        "off_ms": statistics.median(off) * 1e3,
        "on_ms": statistics.median(on) * 1e3,
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,1024", help="records per block, comma-separated (default 8,1024)")
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--records", type=int, default=8192, help="records per batch (default 8192)")
    args = parser.parse_args(argv)
    sink = open(os.devnull, "w")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s %(funcName)s:%(lineno)d"))
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [handler]
    logger.propagate = False
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {args.pairs} pairs, {args.records} records a batch, every message different"
    )
    print("| ranks | CPU ms per block, collapse off | on | on / off (median of pairs) |")
    print("|---:|---:|---:|---:|")
    for ranks in [int(r) for r in args.ranks.split(",")]:
        r = measure(ranks, args.pairs, args.records)
        print(f"| {ranks} | {r['off_ms']:.3f} | {r['on_ms']:.3f} | {r['ratio']:.3f} |")
    sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
