"""Benchmark: what a rank spends encoding a record over gather mode's cut, this checkout against an older commit.

A record over `records.MAX_RECORD` (4 MiB on the wire) is encoded, found too large and cut
(`records.shrink`) on the rank that logs it, before its in_order call returns. This times that on the
records of tests/jobs/scripts/big_records.py (1, 9 and 20 MB of ASCII, 800,000 emoji) with the
package's `records` and with the `records` module of `--base` (read with `git show`, loaded beside it
in this process), interleaved round by round, the starting side alternating; a figure is the
fastest of `--rounds`, in ms. The base's encode is followed by its `shrink` where the payload is over
its cut, as its gather side did.

    python benchmarks/bench_cut.py [--base 4f3c6d8] [--rounds 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.gather import records


IDENTITY = (("big_records.py", "main", 60), 3)
BODIES = {
    "mb1": "x" * 10**6,
    "mb9": "x" * (9 * 10**6),
    "mb20": "x" * (20 * 10**6),
    "emoji": "\U0001f600" * 800_000,
}


def base_records(commit: str) -> ModuleType:
    """The `gather.records` module of `commit`, loaded as a sibling of this checkout's (its relative imports resolve here)."""
    path = "accelerate_inorder_fix/gather/records.py"
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=root, check=True, capture_output=True).stdout
    name = f"accelerate_inorder_fix.gather._records_{commit}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "accelerate_inorder_fix.gather"
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)  # the project's own code, from git
    return module


def record(body: str) -> logging.LogRecord:
    made = logging.LogRecord("aif.big", logging.INFO, "big_records.py", 60, f"[RANK 1] big r1 {body}", None, None)
    Origin(1, "node-a", False).stamp(made)
    return made


def encoder(module: ModuleType) -> Callable[[logging.LogRecord], bytes]:
    """`module`'s rank-side encode, cut included: (payload) as its gather side sent it."""
    if hasattr(module, "MAX_RECORD"):
        return lambda made: module.encode(IDENTITY, made)[0]
    limit = module.MAX_PAYLOAD

    def old(made: logging.LogRecord) -> bytes:
        payload, document = module.encode(IDENTITY, made)
        return module.shrink(document, len(payload)) if len(payload) > limit else payload

    return old


def timed(encode: Callable[[logging.LogRecord], bytes], body: str) -> tuple[float, int]:
    made = record(body)
    start = time.perf_counter()
    payload = encode(made)
    return (time.perf_counter() - start) * 1e3, len(payload)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="4f3c6d8")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    sides = {args.base: encoder(base_records(args.base)), "head": encoder(records)}
    best: dict[tuple[str, str], float] = {}
    sizes: dict[tuple[str, str], int] = {}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name, body in BODIES.items():
            for side in order:
                ms, size = timed(sides[side], body)
                best[side, name] = min(ms, best.get((side, name), float("inf")))
                sizes[side, name] = size
    print(f"| record | {args.base} ms | head ms | head / {args.base} | bytes sent ({args.base} / head) |")
    print("|---|---:|---:|---:|---:|")
    for name in BODIES:
        old, new = best[args.base, name], best["head", name]
        print(
            f"| {name} | {old:.1f} | {new:.1f} | {new / old:.2f} | {sizes[args.base, name]} / {sizes['head', name]} |"
        )
    return {"best_ms": {f"{side}/{name}": ms for (side, name), ms in best.items()}}


if __name__ == "__main__":
    main(sys.argv[1:])
