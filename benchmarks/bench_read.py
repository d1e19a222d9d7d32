"""Benchmark: the main process's cost per gather-mode record, piece by piece, and what a JSON-free wire could save.

In one process, on the record `bench_scale.py` posts (`[RANK 5] step 7: loss 0.4321`, no `extra`), per
record, each figure the median over `--rounds` rounds of `--records` repeats (CPU of this thread), the
variants of a round in turn:

- `read`: `records.read`, whole (decode, JSON parse, checks, the `LogRecord`);
- `parse`: its UTF-8 decode and JSON parse alone, the part a wire without JSON would replace;
- `split`: a wire without JSON, its floor: the same values as text joined by NUL (a type letter each, no
  escapes), decoded by one `str.split`, the numbers converted, the `LogRecord` built; restated here, with
  none of `read`'s checks, so it is what such a wire could at best cost, not a safe decoder;
- the handlers `bench_scale.py` installs (a `StreamHandler` to os.devnull and a counter) beside what a
  user's run pays: a `StreamHandler` to a file, a `FileHandler` (both in a temporary directory).

    python benchmarks/bench_read.py [--records 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Optional

from accelerate_inorder_fix.gather import records


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
bench_scale: Any = __import__("bench_scale")  # its record and its handlers, as it times them


def _split_wire(payload: bytes) -> bytes:
    """`payload`'s values as the NUL-joined text of a JSON-free wire (only for a record with no NUL and no extra)."""
    _, (file, function, line), count, values, _ = records._PARSE(payload.decode(), 0)[0]
    kinds = "".join({str: "s", int: "i", float: "f", type(None): "n"}[type(v)] for v in values)
    texts = ["" if v is None else repr(v) if type(v) is float else str(v) for v in values]
    return "\0".join([f"7 {count} {line} {kinds}", file, function, *texts]).encode("utf-8", "surrogatepass")


def _split_read(payload: bytes) -> Any:
    parts = payload.decode("utf-8", "surrogatepass").split("\0", len(records.FIELDS) + 3)
    _, count, line, kinds = parts[0].split(" ")
    values: list[Any] = parts[3:]
    for i, kind in enumerate(kinds):
        if kind != "s":
            values[i] = int(values[i]) if kind == "i" else float(values[i]) if kind == "f" else None
    record = logging.LogRecord.__new__(logging.LogRecord)
    record.__dict__ = dict(zip(records.FIELDS, values), args=None, exc_info=None)
    return ((parts[1], parts[2], int(line)), int(count)), record


def measure(n: int, rounds: int) -> dict[str, float]:
    """Microseconds per record of each variant, medians of `rounds`."""
    payload = records.encode((bench_scale.SITE, 7), bench_scale._record(5, 7))[0]
    split = _split_wire(payload)
    assert _split_read(split)[1].__dict__ == records.read(payload, 5)[1].__dict__
    record = records.read(payload, 5)[1]
    folder = tempfile.mkdtemp()
    streams = [open(os.devnull, "w"), open(os.path.join(folder, "stream.log"), "w")]  # noqa: SIM115 -- closed below
    handlers = {
        "handlers: bench_scale's (StreamHandler to os.devnull + counter)": [
            logging.StreamHandler(streams[0]),
            bench_scale.Counted(),
        ],
        "handlers: StreamHandler to a file": [logging.StreamHandler(streams[1])],
        "handlers: FileHandler": [logging.FileHandler(os.path.join(folder, "file.log"))],
    }
    logger = logging.getLogger(bench_scale.LOGGER)
    logger.propagate = False

    def emitting(chain: list[logging.Handler]) -> Callable[[], None]:
        def run() -> None:
            logger.handlers[:] = chain
            for _ in range(n):
                records.emit(record)

        return run

    def repeat(decode: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n):  # each result dropped at once, as the main process drops a record it emitted
                decode()

        return run

    variants: dict[str, Callable[[], Any]] = {
        "read": repeat(lambda: records.read(payload, 5)),
        "parse": repeat(lambda: records._PARSE(payload.decode("utf-8", "surrogatepass"), 0)),
        "split": repeat(lambda: _split_read(split)),
        **{name: emitting(chain) for name, chain in handlers.items()},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            start = time.thread_time()
            run()
            times[name].append((time.thread_time() - start) / n * 1e6)
    for chain in handlers.values():
        for handler in chain:
            handler.close()
    for stream in streams:
        stream.close()
    return {name: round(statistics.median(figures), 2) for name, figures in times.items()}


def main(argv: Optional[list[str]] = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    results = measure(args.records, args.rounds)
    print("| per record | us (CPU, median of rounds) |\n|---|---:|")
    for name, us in results.items():
        print(f"| {name} | {us:.2f} |")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
