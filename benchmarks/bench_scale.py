"""Benchmark: the main process's cost per gather-mode call at 8 to 1,024 ranks, on a real TCPStore.

A job of 1,024 ranks does not fit on a laptop, but gather mode's cost on the main process is its store
traffic, decoding and emitting, so the other ranks are simulated as client connections of a real
`TCPStore` (its server in this process's own thread pool, on 127.0.0.1, as torchrun's): ranks 1..N-1
post from `--procs` processes x `--threads` threads (one connection per thread), through the
package's own `records.encode` and `queues.Outbox.post` (the posting processes started with spawn: no fork
after this process started its TCPStore server). Each round, every rank posts `--calls` calls' records, and
this process, the main process, makes those calls through the real `Collector`, emitting every record
through a `StreamHandler` to os.devnull and a counter: with `--arrival concurrent` (the default) while the
ranks post, as in a job; with `--arrival preposted` once every rank has posted the round (the best case).
Timed: the main thread's CPU (`main_cpu_ms_per_call`) and wall time per call, median over `--rounds`
rounds after one warm-up.
A run that emitted fewer or more records than were posted fails; `store_keys_after` is what the run
left in the store once every rank and the main process closed (0).

    python benchmarks/bench_scale.py --ranks 8,64,256,1024 --json FILE
    python benchmarks/bench_scale.py --ranks 1024 --arrival preposted   # records all in before the timer
    python benchmarks/bench_scale.py --ranks 8 --calls 4 --rounds 2   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import multiprocessing
import os
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Optional

from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import queues, records


SITE = ("train.py", "step", 120)
LOGGER = "aif.bench.scale"
PREFIX = "bench/"


def _connect(port: int, master: bool = False) -> Any:
    import torch.distributed as dist

    raw = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, is_master=master, wait_for_workers=False, timeout=datetime.timedelta(seconds=120)
    )
    return raw, dist.PrefixStore(PREFIX, raw)  # type: ignore[attr-defined]


def _record(rank: int, count: int) -> logging.LogRecord:
    record = logging.LogRecord(
        LOGGER, logging.INFO, "train.py", 120, f"[RANK {rank}] step {count}: loss 0.4321", None, None
    )
    Origin(rank, "node-a", False).stamp(record)
    return record


def _post_ranks(store: Any, outboxes: dict[int, queues.Outbox], first: int, calls: int) -> None:
    for count in range(first, first + calls):
        for rank, outbox in outboxes.items():
            while outbox.full:
                outbox.learn(30.0)
            outbox.post(records.encode((SITE, count), _record(rank, count))[0])


def _poster(conn: Connection, port: int, ranks: list[int], threads: int) -> None:
    """A process of simulated ranks: posts each round's calls when told, closes its queues at the end."""
    shares = [ranks[i::threads] for i in range(threads) if ranks[i::threads]]
    stores = [_connect(port)[1] for _ in shares]
    outboxes = [{r: queues.Outbox(store, r) for r in share} for store, share in zip(stores, shares)]
    while True:
        order = conn.recv()
        if order is None:
            for boxes in outboxes:
                for outbox in boxes.values():
                    outbox.close()
            conn.send("closed")
            return
        workers = [threading.Thread(target=_post_ranks, args=(s, b, *order)) for s, b in zip(stores, outboxes)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        conn.send("posted")


class Counted(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def measure(
    ranks: int, calls: int, rounds: int, procs: int, threads: int, arrival: str = "concurrent"
) -> dict[str, Any]:
    """One size: the main process's CPU and wall ms per call (medians of rounds), and the delivery check.

    Args:
        arrival: "concurrent" (the ranks post while the main process collects) or "preposted" (before).
    """
    port = _free_port()
    raw, store = _connect(port, master=True)
    base = raw.num_keys()
    others = list(range(1, ranks))
    pipes = []
    spawn = multiprocessing.get_context("spawn")  # a forked child of a process serving a TCPStore may hang
    for p in range(min(procs, len(others))):
        ours, theirs = spawn.Pipe()
        worker = spawn.Process(target=_poster, args=(theirs, port, others[p::procs], threads), daemon=True)
        worker.start()
        pipes.append((ours, worker))
    counter = Counted()
    devnull = open(os.devnull, "w")  # noqa: SIM115 -- closed below
    logger = logging.getLogger(LOGGER)
    logger.handlers[:], logger.propagate = [logging.StreamHandler(devnull), counter], False
    main = _collector.Collector(queues.Inbox(store, ranks), ranks)
    cpu: list[float] = []
    wall: list[float] = []
    for round_ in range(rounds + 1):
        first = 1 + round_ * calls
        for conn, _ in pipes:
            conn.send((first, calls))
        if arrival == "preposted":
            for conn, _ in pipes:
                conn.recv()
        start_cpu, start = time.thread_time(), time.perf_counter()
        for count in range(first, first + calls):
            main.emit_call((SITE, count), _record(0, count), 30.0)
        if arrival == "concurrent":
            for conn, _ in pipes:
                conn.recv()
        if round_:  # the first round warms up
            cpu.append((time.thread_time() - start_cpu) / calls)
            wall.append((time.perf_counter() - start) / calls)
    for conn, _ in pipes:
        conn.send(None)
    for conn, worker in pipes:
        conn.recv()
        worker.join()
    main.flush()
    devnull.close()
    expected = ranks * calls * (rounds + 1)
    if counter.count != expected:
        raise RuntimeError(f"{ranks} ranks: the main process emitted {counter.count} records, not {expected}")
    return {
        "ranks": ranks,
        "arrival": arrival,
        "calls": calls,
        "rounds": rounds,
        "main_cpu_ms_per_call": round(statistics.median(cpu) * 1e3, 3),
        "main_ms_per_call": round(statistics.median(wall) * 1e3, 3),
        "records_emitted": counter.count,
        "records_expected": expected,
        "store_keys_after": raw.num_keys() - base,
    }


def _free_port() -> int:
    from accelerate_inorder_fix.cli.launch import free_port

    return free_port()


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| ranks | main CPU ms a call | main ms a call | records emitted / expected | store keys after | arrival |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['ranks']} | {r['main_cpu_ms_per_call']:.3f} | {r['main_ms_per_call']:.3f} | "
            f"{r['records_emitted']} / {r['records_expected']} | {r['store_keys_after']} | {r.get('arrival', 'preposted')} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,64,256,1024")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--arrival", choices=["concurrent", "preposted"], default="concurrent")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="print the table of an earlier run, without measuring")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as saved:
            results: dict[str, Any] = json.load(saved)
    else:
        sizes = [int(n) for n in args.ranks.split(",")]
        results = {
            "results": [measure(n, args.calls, args.rounds, args.procs, args.threads, args.arrival) for n in sizes]
        }
    print(table(results["results"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
