"""CPU per logging call in one process: a plain call and an in_order call through the patched adapter.

For comparing two trees side by side (the frame arithmetic): run it alternately with
`PYTHONPATH=<tree>`; it prints which package it measured. One process (no job): the in_order call
takes the single-process path (`_emit`), the plain call the wrapper's restated body. Best of 5 batches,
CPU time of this thread (`time.thread_time`), so a shared machine's load moves it less than wall time.

    PYTHONPATH=. python benchmarks/bench_call_cpu.py
"""

import json
import logging
import os
import time


os.environ["ACCELERATE_INORDER_FIX_STARTUP"] = "0"

from accelerate import PartialState  # noqa: E402
from accelerate.logging import get_logger  # noqa: E402

import accelerate_inorder_fix as fix  # noqa: E402


def _best_us(log: logging.LoggerAdapter, number: int, **kwargs: object) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for i in range(number):
            log.info("step %d", i, **kwargs)
        best = min(best, (time.thread_time() - start) / number)
    return best * 1e6


def main() -> None:
    PartialState(cpu=True)
    fix.patch()
    base = logging.getLogger("aif.bench.call")
    sink = open(os.devnull, "w")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s %(funcName)s:%(lineno)d"))
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger("aif.bench.call")
    figures = {"plain_us": _best_us(log, 20000), "in_order_1proc_us": _best_us(log, 5000, in_order=True)}
    print(json.dumps({**{k: round(v, 2) for k, v in figures.items()}, "package": os.path.dirname(fix.__file__)}))
    sink.close()


if __name__ == "__main__":
    main()
