"""Benchmark: the cost of one `logger.info(..., in_order=True)` call, on the slowest rank.

For each world size one real job (torchrun, CPU gloo) runs every variant in the same processes,
interleaved round by round so that they share the machine's load (a paired run):

- `upstream`: accelerate's own `MultiProcessAdapter.log`, unpatched (every rank enabled: the setup
  where upstream works);
- `barrier`: this package, barrier mode (each call checks in through the store, then the turns are
  handed over through it: no barrier);
- `barrier_plain`: barrier mode with the store taken out (the N barriers alone, as without a store):
  the difference to `barrier` ("store vs barriers") is what the store protocol saves or costs;
- `gather`: this package, gather mode;
- and a plain call (`logger.info(msg)`, no in_order) unpatched vs patched.

A batch is `--calls` calls started together after a barrier; its time is the slowest rank's, and a
variant's figure is the median over `--rounds` batches, per call. Records go to a handler writing to
os.devnull, so terminal speed is not measured.

    accelerate-inorder-fix bench            # short: 2 and 4 ranks, 3 rounds (about a minute on 2 cores)
    accelerate-inorder-fix bench --full     # the recorded run: 2, 4, 8 and 16 ranks, 15 rounds
    accelerate-inorder-fix bench --sizes 2,4,8 --calls 20 --rounds 5 --json FILE

`main(argv)` is the entry point for a CLI; it prints a Markdown table and returns the results.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Optional


# The folder that holds the package (a source tree or site-packages): the ranks import it from there.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT_TAG = "@@BENCH "
PROG = "accelerate-inorder-fix bench"
# The run behind the recorded table (benchmarks/RESULTS.md): `--full` is exactly it.
RECORDED_ROUNDS = 15
RECORDED_ARGS = f"--sizes 2,4,8,16 --rounds {RECORDED_ROUNDS}"


def noise_note(rounds: int) -> str:
    """What a short run's figures are worth, and the command behind the recorded table."""
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; " if hasattr(os, "getloadavg") else ""
    return (
        f"Note: a short run ({rounds} rounds) is noise: on a loaded machine one variant can come out tens of "
        f"percent faster or slower than in the next run ({load}compare figures of one run only). The recorded "
        f"table (benchmarks/RESULTS.md) comes from `{PROG} --full` ({RECORDED_ARGS}), on a quiet machine."
    )


IN_ORDER_VARIANTS = ("upstream", "barrier", "barrier_plain", "gather")


# ---------------------------------------------------------------------------------------------
# Worker (every rank of one job)
# ---------------------------------------------------------------------------------------------


def _worker(calls: int, rounds: int, plain_calls: int) -> None:
    import logging

    import accelerate
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix as fix
    from accelerate_inorder_fix.barrier.turns import PlainBarriers
    from accelerate_inorder_fix.session import SESSION

    state = PartialState(cpu=True)
    base = logging.getLogger("aif.bench")
    sink = open(os.devnull, "w")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s %(funcName)s:%(lineno)d"))
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger("aif.bench")

    def use(variant: str) -> None:
        # The mode is fixed per session: each variant starts a new one (every rank's ended before any
        # opens: the barrier). barrier_plain: the session hands every call to plain barriers (an
        # instance attribute over the method): the N barriers alone.
        SESSION.reset()
        SESSION.__dict__.pop("side", None)
        dist.barrier()
        if variant == "barrier_plain":
            SESSION.side = lambda state, settings, timeout: PlainBarriers(state)  # type: ignore[method-assign]
        if variant in ("upstream", "plain_unpatched"):
            fix.unpatch()
        else:
            fix.patch()
            fix.configure(mode="gather" if variant == "gather" else "barrier")

    def batch(variant: str, n: int, in_order: bool) -> float:
        use(variant)
        if in_order and variant != "upstream":
            # The session's first call reads the main process's word: a job pays it once, so it is made
            # here, untimed, not charged to the batch's first call.
            log.info("session start", in_order=True)
        dist.barrier()
        start = time.perf_counter()
        for i in range(n):
            log.info("step %d", i, in_order=in_order) if in_order else log.info("step %d", i)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
        return float(elapsed.item()) / n

    samples: dict[str, list[float]] = {v: [] for v in (*IN_ORDER_VARIANTS, "plain_unpatched", "plain_patched")}
    for warmup in (True, False):
        for round_ in range(1 if warmup else rounds):
            # Each round starts with another variant, so none always runs first (or last).
            shift = round_ % len(IN_ORDER_VARIANTS)
            for variant in IN_ORDER_VARIANTS[shift:] + IN_ORDER_VARIANTS[:shift]:
                per_call = batch(variant, 2 if warmup else calls, True)
                if not warmup:
                    samples[variant].append(per_call)
            for variant in ("plain_unpatched", "plain_patched")[:: 1 if round_ % 2 else -1]:
                per_call = batch(variant, 20 if warmup else plain_calls, False)
                if not warmup:
                    samples[variant].append(per_call)
    if state.is_main_process:
        medians = {v: statistics.median(s) for v, s in samples.items()}
        sys.stdout.write(
            RESULT_TAG
            + json.dumps({"world_size": state.num_processes, "accelerate": accelerate.__version__, "seconds": medians})
            + "\n"
        )
        sys.stdout.flush()
    fix.unpatch()
    sink.close()


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _run_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    from . import launch as _launch

    cmd = _launch.launch_command(
        [
            os.path.abspath(__file__),
            "--worker",
            "--calls",
            str(args.calls),
            "--rounds",
            str(args.rounds),
            "--plain-calls",
            str(args.plain_calls),
        ],
        size,
    )
    env = dict(os.environ, ACCELERATE_INORDER_FIX="0", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    job = _launch.run(cmd, env=env, timeout=args.job_timeout)
    for line in job.lines:
        if line.startswith(RESULT_TAG):
            result: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
            return result
    raise RuntimeError(f"world size {size}: no result ({job}); stderr tail:\n{job.stderr[-2000:]}")


def table(results: list[dict[str, Any]]) -> str:
    """Markdown table of per-call times (ms) and ratios, one row per world size."""
    rows = [
        "| ranks | upstream in_order | barrier | gather | barrier speed-up | gather speed-up | barrier / gather "
        "| store vs barriers | plain unpatched | plain patched | plain overhead |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        s = result["seconds"]
        ms = {k: v * 1e3 for k, v in s.items()}
        rows.append(
            f"| {result['world_size']} | {ms['upstream']:.2f} ms | {ms['barrier']:.2f} ms | {ms['gather']:.3f} ms "
            f"| {s['upstream'] / s['barrier']:.1f}x | {s['upstream'] / s['gather']:.1f}x "
            f"| {s['barrier'] / s['gather']:.1f}x "
            f"| {ms['barrier'] - ms['barrier_plain']:+.2f} ms ({100 * (s['barrier'] / s['barrier_plain'] - 1):+.1f}%) "
            f"| {ms['plain_unpatched'] * 1e3:.1f} us | {ms['plain_patched'] * 1e3:.1f} us "
            f"| {100 * (s['plain_patched'] / s['plain_unpatched'] - 1):+.1f}% |"
        )
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help=f"the recorded run: {RECORDED_ARGS}")
    parser.add_argument("--sizes", default=None, help="world sizes, comma-separated (default 2,4; --full 2,4,8,16)")
    parser.add_argument("--calls", type=int, default=20, help="in_order calls per batch (default 20)")
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"batches per variant (default 3; --full {RECORDED_ROUNDS})"
    )
    parser.add_argument("--plain-calls", type=int, default=2000, help="plain calls per batch (default 2000)")
    parser.add_argument("--job-timeout", type=float, default=600.0, help="hard limit per job, seconds")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[list[str]] = None) -> Optional[list[dict[str, Any]]]:
    """Run the benchmark; print the table (and machine line); return the list of results."""
    args = _parser().parse_args(argv)
    args.sizes = args.sizes or ("2,4,8,16" if args.full else "2,4")
    args.rounds = args.rounds or (RECORDED_ROUNDS if args.full else 3)
    if args.worker:
        _worker(args.calls, args.rounds, args.plain_calls)
        return None
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        print(f"world size {size} ...", file=sys.stderr, flush=True)
        results.append(_run_size(size, args))
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, accelerate {results[0]['accelerate']}; {args.calls} in_order calls "
        f"x {args.rounds} rounds, {args.plain_calls} plain calls x {args.rounds} rounds; median per call, "
        "slowest rank\n"
    )
    print(table(results))
    if args.rounds < RECORDED_ROUNDS:
        print(f"\n{noise_note(args.rounds)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
