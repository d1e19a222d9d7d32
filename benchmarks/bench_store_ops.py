"""Benchmark: what each c10d store request costs the store's server, and its caller, one at a time.

Gather mode's time at 8 ranks on 2 cores is CPU: the ranks', the main process's, and the store
server's (under torchrun, a thread of the agent process, which no rank's `process_time` counts). This
measures the server's side of each kind of request gather mode makes: a `TCPStore` server in a child
process, one client here making `--ops` requests of one kind back to back; the server's CPU from
`/proc/<pid>/stat` (utime + stime, 10 ms ticks: hence thousands of requests), the client's wall time
from `time.perf_counter` and its CPU from `time.thread_time`. Per request, median over `--repeats`.
The reads read a record-sized key of their own (`r/1`, 300 bytes), never one the appends grow.

A request that is answered (`compare_set`, `delete_key`, `check`, `wait`, `get`, `multi_get`) is one
round trip: the client waits for the reply before it sends the next. One that is not (`set`,
`append`, `multi_set`) is only sent: back to back, the server reads many in one wake-up, so their
figure here is a floor, not what one of them costs amid answered requests.

    python benchmarks/bench_store_ops.py --ops 5000 --repeats 3
"""

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


READ = "r/1"  # what the reads read: a record's size, set once


def _server(port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=120))
    store.wait(["bench/done"])


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _requests(store: Any, ops: int) -> list[tuple[str, Callable[[int], Any]]]:
    payload, line = b"x" * 300, b"y" * 80
    unset = b"unset"
    return [
        ("compare_set, new key (a rank's record)", lambda i: store.compare_set(f"k/{i}", "", payload)),
        ("delete_key (a rank's clean-up, each record)", lambda i: store.delete_key(f"k/{i}")),
        ("compare_set, absent key (a peek)", lambda i: store.compare_set(f"m/{i}", unset, unset)),
        ("check, present key", lambda i: store.check([READ])),
        ("wait, present key", lambda i: store.wait([READ])),
        ("get, present key", lambda i: store.get(READ)),
        ("multi_get, 1 present key", lambda i: store.multi_get([READ])),
        ("append, 80 bytes (a copy; not answered)", lambda i: store.append(f"s/{i % 16}", line)),
        ("set, 300 bytes (not answered)", lambda i: store.set(f"k/{i}", payload)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=5000, help="requests of each kind per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=29617)
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.server:
        _server(args.port)
        return 0
    import torch.distributed as dist

    server = subprocess.Popen([sys.executable, __file__, "--server", "--port", str(args.port)])
    try:
        store = dist.TCPStore("127.0.0.1", args.port, 2, False, timeout=datetime.timedelta(seconds=120))
        store.set(READ, b"z" * 300)
        results: dict[str, list[tuple[float, float, float]]] = {}
        for _ in range(args.repeats):
            for name, request in _requests(store, args.ops):
                ticks, start, own = _ticks(server.pid), time.perf_counter(), time.thread_time()
                for i in range(args.ops):
                    request(i)
                wall, own = time.perf_counter() - start, time.thread_time() - own
                cpu = (_ticks(server.pid) - ticks) / os.sysconf("SC_CLK_TCK")
                results.setdefault(name, []).append((cpu, own, wall))
            for i in range(args.ops):  # the next repeat's new keys are new again
                store.delete_key(f"k/{i}")
            for i in range(16):  # and its slots empty
                store.delete_key(f"s/{i}")
        store.set("bench/done", "1")
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    import torch

    print(
        f"TCPStore (torch {torch.__version__}), one client, {args.ops} requests of each kind x {args.repeats}; median"
    )
    print("| request | server CPU, us | client CPU, us | client wall, us |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        server_cpu, client_cpu, wall = (statistics.median(r[k] for r in rows) / args.ops * 1e6 for k in range(3))
        print(f"| {name} | {server_cpu:.1f} | {client_cpu:.1f} | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
