"""Benchmark: two revisions of this package, in barrier or gather mode, paired in the same processes of one job.

A protocol change moves a call's time by less than this 2-core machine's run-to-run noise, so two
`bench` runs cannot tell two revisions apart. Here one real job (torchrun, CPU gloo, accelerate as
installed) imports both: the working tree as `accelerate_inorder_fix`, and the revision `--base` (a
`git archive` of it) as a copy renamed `aif_base`. Round by round, with the starting variant rotated,
each rank makes `--calls` in_order calls with upstream unpatched, with the base patched, and with the
working tree patched (`--mode`, barrier by default; one patched at a time). Each variant logs from its
own line, and the base's store keys are under a prefix of its own, so the two revisions never share a
store key. Figures: the median over `--rounds` batches of the slowest rank's time per call (in gather
mode, the main process's: it collects and prints every rank's record), and the CPU per call of all
ranks together (`time.process_time`, summed).

In gather mode every rank's message differs from the others' (`step i r<rank>`), as per-rank numbers
do. `--collapse` turns collapse on in the working tree only: with `--base` the working tree's own
commit, the pair is collapse's cost on records that all differ.

    python benchmarks/bench_ab.py --base 04a3182 --ranks 8 --rounds 11
    python benchmarks/bench_ab.py --mode gather --base a9bfd47 --ranks 8 --rounds 11
    python benchmarks/bench_ab.py --mode gather --collapse --base HEAD --ranks 8 --rounds 11
"""

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TAG = "@@AB "
VARIANTS = ("upstream", "base", "head")


def _copy_of(base: str, into: str) -> None:
    """The package at revision `base`, as the package `aif_base` under `into`."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", base, "accelerate_inorder_fix"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    os.rename(os.path.join(into, "accelerate_inorder_fix"), os.path.join(into, "aif_base"))


def _own_prefix(package_name: str) -> None:
    """Put the store keys of the package `package_name` under a prefix of its own (the revisions' queues
    are named alike): every module of it whose `PREFIX` is the store prefix gets `<package_name>/`.
    Where the prefix lives depends on the revision (`store.connection`, earlier `gather.transport`)."""
    for where in ("store.connection", "gather.transport"):
        try:
            importlib.import_module(f"{package_name}.{where}")
        except ImportError:
            continue
    for name, module in list(sys.modules.items()):
        if name.startswith(package_name + ".") and getattr(module, "PREFIX", None) == "accelerate_inorder_fix/":
            module.PREFIX = package_name + "/"  # type: ignore[attr-defined]


def _worker(calls: int, rounds: int, mode: str, collapse: bool) -> None:
    import logging

    import aif_base as base  # type: ignore[import-not-found]
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix as head

    _own_prefix("aif_base")
    state = PartialState(cpu=True)
    rank = state.process_index
    sink = open(os.devnull, "w")
    logger = logging.getLogger("aif.ab")
    logger.addHandler(logging.StreamHandler(sink))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    log = get_logger("aif.ab")

    # In gather mode each rank's message is its own: what the main process prints is every rank's line.
    msg, extra = ("step %d r%d", (rank,)) if mode == "gather" else ("step %d", ())

    def upstream(n: int) -> None:
        for i in range(n):
            log.info(msg, i, *extra, in_order=True)

    def base_calls(n: int) -> None:
        for i in range(n):
            log.info(msg, i, *extra, in_order=True)

    def head_calls(n: int) -> None:
        for i in range(n):
            log.info(msg, i, *extra, in_order=True)

    loops = {"upstream": upstream, "base": base_calls, "head": head_calls}

    def batch(variant: str, n: int) -> tuple[float, float]:
        base.unpatch()
        head.unpatch()
        if variant != "upstream":
            package = base if variant == "base" else head
            package.patch()
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        loops[variant](n)
        spent = torch.tensor([time.perf_counter() - wall, time.process_time() - cpu], dtype=torch.float64)
        slowest, total = spent.clone(), spent.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(total)
        return float(slowest[0]) / n, float(total[1]) / n

    # Configured once: each configure(mode=...) is a mode switch the ranks agree on at their next call,
    # which a job makes once, not every batch.
    base.configure(mode=mode)
    head.configure(mode=mode, collapse=True) if collapse else head.configure(mode=mode)
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for warmup in (True, False):
        for round_ in range(1 if warmup else rounds):
            shift = round_ % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                w, c = batch(variant, 2 if warmup else calls)
                if not warmup:
                    wall[variant].append(w)
                    cpu[variant].append(c)
    if state.is_main_process:
        result = {
            "ranks": state.num_processes,
            "mode": mode,
            "collapse": collapse,
            "wall_ms": {v: statistics.median(x) * 1e3 for v, x in wall.items()},
            "cpu_ms": {v: statistics.median(x) * 1e3 for v, x in cpu.items()},
        }
        print(TAG + json.dumps(result), flush=True)
    base.unpatch()
    head.unpatch()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the revision to compare the working tree with (required)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--mode", choices=("barrier", "gather"), default="barrier")
    parser.add_argument("--collapse", action="store_true", help="collapse on in the working tree (gather mode)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.calls, args.rounds, args.mode, args.collapse)
        return 0
    if not args.base:
        parser.error("--base is required")
    with tempfile.TemporaryDirectory() as copy:
        _copy_of(args.base, copy)
        env = dict(os.environ, ACCELERATE_INORDER_FIX="0", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join([ROOT, copy, *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks), __file__]
        cmd += ["--worker", "--calls", str(args.calls), "--rounds", str(args.rounds), "--mode", args.mode]
        cmd += ["--collapse"] if args.collapse else []
        job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in job.stdout.splitlines() if line.startswith(TAG)]
    if job.returncode != 0 or not lines:
        sys.stderr.write(job.stderr[-3000:])
        return 1
    r = json.loads(lines[0][len(TAG) :])
    w, c = r["wall_ms"], r["cpu_ms"]
    head = "head, collapse on" if args.collapse else "head"
    print(
        f"{r['ranks']} ranks, {args.mode} mode, base {args.base} vs {head}, {args.rounds} rounds of {args.calls} "
        "calls; median, slowest rank"
    )
    print("| variant | ms per call | CPU ms per call, all ranks | upstream / variant |")
    print("|---|---:|---:|---:|")
    for v in VARIANTS:
        print(f"| {v} | {w[v]:.2f} | {c[v]:.2f} | {w['upstream'] / w[v]:.1f}x |")
    print(f"base / head: {w['base'] / w['head']:.3f} (time), {c['base'] / c['head']:.3f} (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
