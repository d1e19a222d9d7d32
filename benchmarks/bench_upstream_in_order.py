"""What the upstream fix (patches/main/0001) costs a call that no process logs: side by side, in one job.

`logger.debug(..., in_order=True)` with every process at INFO. Unpatched (accelerate as installed) the call
returns at once; patched, it is a collective: `num_processes` barriers on every process. Both adapters live in the
same processes of one torchrun job: the installed `accelerate/logging.py` with the series' 0001 applied (`git apply`
into a temporary folder) is loaded as a second module, so the two are timed in alternating batches on the same
process group, under the same load. This package is not imported: the figures are upstream's code alone.

    flock /tmp/aif-cpu.lock timeout 900 env PYTHONPATH=.cache/accelerate/1.16.0 GLOO_SOCKET_IFNAME=lo \\
        OMP_NUM_THREADS=1 .venv-upstream/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        benchmarks/bench_upstream_in_order.py --calls 200

Prints one Markdown row per variant: the median over batches of the wall time per call on the slowest rank
(each batch's time is all-reduced with MAX), and, for scale, one bare `wait_for_everyone()`.
"""

import argparse
import importlib.util
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import accelerate
import torch
from accelerate import PartialState
from accelerate.logging import get_logger


FIX = (
    Path(__file__).resolve().parents[1]
    / "patches"
    / "main"
    / "0001-Make-in_order-True-logging-a-collective-every-proces.patch"
)


def patched_logging_module():
    """The installed accelerate/logging.py with 0001 applied, imported as `accelerate._logging_patched`."""
    tmp = Path(tempfile.mkdtemp(prefix="aif-bench-fix-"))
    target = tmp / "src" / "accelerate" / "logging.py"
    target.parent.mkdir(parents=True)
    shutil.copy(Path(accelerate.__file__).parent / "logging.py", target)
    subprocess.run(["git", "apply", "--include=src/accelerate/logging.py", str(FIX)], cwd=tmp, check=True)
    spec = importlib.util.spec_from_file_location("accelerate._logging_patched", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shutil.rmtree(tmp)
    return module


def batch_seconds(state, calls, call):
    """Wall time of `calls` calls, the slowest rank's: every rank starts together, ends when it is done."""
    state.wait_for_everyone()
    start = time.perf_counter()
    for i in range(calls):
        call(i)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    torch.distributed.all_reduce(elapsed, op=torch.distributed.ReduceOp.MAX)
    return elapsed.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200, help="calls a batch")
    parser.add_argument("--batches", type=int, default=7, help="batches a variant, alternating")
    args = parser.parse_args()

    state = PartialState(cpu=True)
    patched = patched_logging_module()
    for name in ("bench.unpatched", "bench.patched"):
        base = logging.getLogger(name)
        base.addHandler(logging.NullHandler())
        base.propagate = False
    unpatched_logger = get_logger("bench.unpatched", log_level="INFO")
    patched_logger = patched.get_logger("bench.patched", log_level="INFO")
    variants = {
        "unpatched `debug(..., in_order=True)`": lambda i: unpatched_logger.debug("step %d", i, in_order=True),
        "patched `debug(..., in_order=True)`": lambda i: patched_logger.debug("step %d", i, in_order=True),
        "one `wait_for_everyone()`": lambda i: state.wait_for_everyone(),
    }
    # A patched call must really synchronise: count its barriers once.
    barriers = []
    real_wait = PartialState.wait_for_everyone
    PartialState.wait_for_everyone = lambda self: barriers.append(1) or real_wait(self)
    patched_logger.debug("probe", in_order=True)
    unpatched_logger.debug("probe", in_order=True)
    PartialState.wait_for_everyone = real_wait
    assert len(barriers) == state.num_processes, barriers

    times = {name: [] for name in variants}
    for _ in range(args.batches):
        for name, call in variants.items():
            times[name].append(batch_seconds(state, args.calls, call) / args.calls)
    if state.is_main_process:
        print(
            f"accelerate {accelerate.__version__}, torch {torch.__version__}, {state.num_processes} ranks (CPU, gloo), "
            f"{args.calls} calls x {args.batches} batches a variant, {os.cpu_count()} cores"
        )
        print("| ranks | variant | median per call (us) | min (us) |")
        print("|---|---|---|---|")
        for name, values in times.items():
            print(
                f"| {state.num_processes} | {name} | {statistics.median(values) * 1e6:.1f} | {min(values) * 1e6:.1f} |"
            )
        sys.stdout.flush()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
