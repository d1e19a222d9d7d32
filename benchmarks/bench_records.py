"""Benchmark: what one gather-mode record costs to encode and decode, JSON (now) against pickle (before).

The data-only JSON codec of `gather.records` replaced the pickle wire format, which ran code from the
job's store. This measures the price, in one process, side by side:

- `pickle`: the codec main had before, restated here (message merged, traceback rendered, protocol 4,
  a value that does not pickle sent as its repr; decoded with `pickle.loads` + `logging.makeLogRecord`).
  It only ever decodes bytes it has just made itself, in this process: the comparison needs it, and
  nothing else in the package has it.
- `json`: `records.to_bytes` / `records.from_bytes`, as the ranks and the main process run them.

Each record kind is a real `Logger.log` record. A round times `--records` encodes, then as many
decodes, of one codec, then of the other (the first codec alternates between rounds); a figure is
the median over `--rounds` rounds, per record.

    python benchmarks/bench_records.py [--records 2000] [--rounds 9] [--json FILE]

`main(argv)` prints a Markdown table and returns the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import platform
import statistics
import sys
import time
from typing import Any, Callable, Optional

from accelerate_inorder_fix.gather import records


IDENTITY = (("train.py", "training_step", 120), 7)
LOGGER = "aif.bench_records"
KINDS = ("plain", "extra", "traceback", "1 KiB message", "1 MiB message")


# -- the codec main had before the JSON one ----------------------------------------------------

_TRACEBACKS = logging.Formatter()


def _pickle_to_bytes(identity: tuple, record: logging.LogRecord) -> bytes:
    data = dict(record.__dict__)
    data["msg"], data["args"] = record.getMessage(), None
    if record.exc_info and not record.exc_text:
        data["exc_text"] = _TRACEBACKS.formatException(record.exc_info)
    data["exc_info"] = None
    data.pop("message", None)
    try:
        return pickle.dumps((identity, data), 4)
    except Exception:  # as before: a value that does not pickle went as its repr
        for key, value in data.items():
            try:
                pickle.dumps(value, 4)
            except Exception:
                data[key] = repr(value)
        return pickle.dumps((identity, data), 4)


def _pickle_from_bytes(payload: bytes) -> tuple:
    identity, data = pickle.loads(payload)  # only ever bytes made above, in this process
    return identity, logging.makeLogRecord(data)


CODECS: dict[str, tuple[Callable, Callable]] = {
    "pickle": (_pickle_to_bytes, _pickle_from_bytes),
    "json": (
        lambda identity, record: records.encode(identity, record)[0],
        lambda payload: records.read(payload, 0)[:2],
    ),
}


# -- the records --------------------------------------------------------------------------------


def _make(kind: str) -> logging.LogRecord:
    """One record of `kind`, made by a real `Logger.log` call and kept before any handler."""
    kept = []

    def keep(record: logging.LogRecord) -> bool:
        kept.append(record)
        return False

    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.DEBUG)
    logger.addFilter(keep)
    try:
        if kind == "plain":
            logger.info("step %d: loss %.4f", 120, 0.4321)
        elif kind == "extra":
            extra = {"epoch": 3, "lr": 3e-4, "tags": ["a", "b"], "shape": (8, 512), "device": object()}
            logger.warning("checkpoint saved to %s", "/ckpt/step-120", extra=extra)
        elif kind == "traceback":
            try:
                raise ValueError("shard 3 is missing")
            except ValueError:
                logger.exception("could not load the batch")
        elif kind == "1 KiB message":
            logger.info("x" * 1024)
        elif kind == "1 MiB message":
            logger.info("x" * (1 << 20))
        else:
            raise ValueError(f"unknown record kind {kind!r}")
    finally:
        logger.removeFilter(keep)
    kept[0].rank, kept[0].hostname = 0, "node-a"  # as a rank's record is stamped (`_origin.Origin.stamp`)
    return kept[0]


# -- timing -------------------------------------------------------------------------------------


def _time_codec(codec: str, record: logging.LogRecord, n: int) -> tuple[float, float, int]:
    """(encode us, decode us, payload bytes) per record, for `n` records."""
    encode, decode = CODECS[codec]
    start = time.perf_counter()
    for _ in range(n):
        payload = encode(IDENTITY, record)
    middle = time.perf_counter()
    for _ in range(n):
        decode(payload)
    end = time.perf_counter()
    return (middle - start) / n * 1e6, (end - middle) / n * 1e6, len(payload)


def measure(kind: str, n: int, rounds: int) -> dict[str, Any]:
    """Median encode/decode microseconds per record of `kind`, per codec, from `rounds` paired rounds."""
    record = _make(kind)
    samples: dict[str, list[tuple[float, float, int]]] = {codec: [] for codec in CODECS}
    order = list(CODECS)
    for round_ in range(rounds):
        for codec in order if round_ % 2 == 0 else reversed(order):
            samples[codec].append(_time_codec(codec, record, n))
    result: dict[str, Any] = {"kind": kind, "records": n, "rounds": rounds}
    for codec, runs in samples.items():
        result[codec] = {
            "encode_us": statistics.median(run[0] for run in runs),
            "decode_us": statistics.median(run[1] for run in runs),
            "total_us": statistics.median(run[0] + run[1] for run in runs),
            "bytes": runs[0][2],
        }
    result["ratio"] = result["json"]["total_us"] / result["pickle"]["total_us"]
    return result


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| record | pickle encode | pickle decode | pickle total | json encode | json decode | json total "
        "| json / pickle | pickle bytes | json bytes |"
    )
    lines = [head, "|---|" + "---:|" * 9]
    for r in results:
        p, j = r["pickle"], r["json"]
        lines.append(
            f"| {r['kind']} | {p['encode_us']:.2f} us | {p['decode_us']:.2f} us | {p['total_us']:.2f} us "
            f"| {j['encode_us']:.2f} us | {j['decode_us']:.2f} us | {j['total_us']:.2f} us | {r['ratio']:.2f}x "
            f"| {p['bytes']:,} | {j['bytes']:,} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Run the benchmark, print its table, return `{"environment": ..., "results": [...]}`.

    Args:
        argv: command-line arguments (`--records`, `--rounds`, `--json FILE`); `sys.argv[1:]` if None.
    """
    parser = argparse.ArgumentParser(prog="bench_records", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000, help="records per round and codec (1 MiB: / 100)")
    parser.add_argument("--rounds", type=int, default=9, help="paired rounds; the median is reported")
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = parser.parse_args(argv)
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be at least 1")
    results = [
        measure(kind, max(1, args.records // 100) if "MiB" in kind else args.records, args.rounds) for kind in KINDS
    ]
    environment = {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()}
    print(table(results))
    output = {"environment": environment, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(output, f, indent=2)
    return output


if __name__ == "__main__":
    main()
    sys.exit(0)
