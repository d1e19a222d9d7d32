"""Benchmark: gather mode's cost per in_order call at 8 to 1,024 ranks.

A real job of 1,024 ranks does not fit on a laptop, but gather mode's costs are a rank's post and
the main process's reading (store traffic), decoding and emitting, so the ranks are simulated as
client connections of a real `TCPStore`:

- the server runs in a process of its own on 127.0.0.1, as torchrun's rendezvous store does;
- ranks 2..N-1 post from `--procs` processes x `--threads` threads (one store connection per thread),
  through the package's own rank-side code (`records.encode` + `transport.Outbox.post`, as
  `GatherSession._post` calls them: record, copy in the shared slot, background clean-up);
- rank 1 posts from a process of its own (its own heap and connection, as a real rank), and each of
  its posts is timed: that is the rank's cost per call (`rank_us_per_call`, mean);
- the main process's side is this process: the real `Collector`, emitting every record through a
  real `StreamHandler` writing to os.devnull. `main_store_ms_per_call` is the part of
  `main_ms_per_call` spent inside calls on its store connection.

Each round, every rank posts `--calls` calls' records; then the main process makes those calls, timed
(`main_ms_per_call`: median over `--rounds` rounds, after one warm-up round, per call; every record
is already posted, so the figure is the main process's own work, not waiting for ranks; the median
keeps a round that a collection of Python's oldest generation, or the shared machine, slowed down
from deciding the figure). `store_keys_after` is how many
keys the run left in the store after the last round (`store_keys_by_round`: after each round; it must
not grow with the rounds). The installed package measures its own protocol; the repository's
`benchmarks/bench_scale.py` runs this same benchmark with the old protocol (one wait, get and delete
per rank) beside it, on the same server and processes (`main(argv, protocols)`).

    accelerate-inorder-fix bench scale --ranks 8,64,256,1024 --json FILE
    python benchmarks/bench_scale.py --ranks 8,64 --calls 4 --rounds 2   # new and old, in a checkout

`main(argv)` prints a Markdown table and returns the results.
"""

import argparse
import datetime
import json
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
import timeit
from multiprocessing.connection import Connection
from typing import IO, Any, Callable, Optional

from ..gather import collector as _collector
from ..gather import copies, records, transport


SITE = ("bench_scale.py", "train_step", 42)
WARMUP = 1  # rounds run before the measured ones at each size (first loggers, first full copies)
LOGGER = "aif.bench.scale"
BURST = 2000  # rank 1's back-to-back posts, for the clean-up's connection (`_burst`)


# The protocols a run can measure: name -> (main process's inbox type, a rank's outbox type). The
# installed package measures its own; benchmarks/bench_scale.py adds the old one for the side-by-side.
Protocols = dict[str, tuple[Any, Any]]
PROTOCOLS: Protocols = {"new": (transport.Inbox, transport.Outbox)}


# ---------------------------------------------------------------------------------------------
# Processes: the store server, and the posters (simulated ranks)
# ---------------------------------------------------------------------------------------------


def _connect(port: int, prefix: Optional[str] = None) -> Any:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
    return dist.PrefixStore(prefix, store) if prefix else store  # type: ignore[attr-defined]


def _serve(conn: Connection) -> None:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    conn.send(server.port)
    conn.recv()  # until told to stop


def _record(count: int, rank: int) -> logging.LogRecord:
    return logging.LogRecord(LOGGER, logging.INFO, "/job/bench_scale.py", SITE[2], f"step {count} r{rank}", None, None)


def _post_calls(
    outboxes: list[tuple[int, Any]], first: int, calls: int, timings: Optional[list[float]] = None
) -> None:
    for count in range(first, first + calls):
        for rank, outbox in outboxes:
            record = _record(count, rank)
            start = time.perf_counter()
            outbox.post(*records.encode((SITE, count), record))  # as `GatherSession._post`
            if timings is not None:
                timings.append(time.perf_counter() - start)


def _settle(shares: list[list[tuple[int, Any]]]) -> None:
    """Until these ranks' clean-ups have run: in a real job they run on the ranks' own CPUs, not the main's."""
    for share in shares:
        for _, outbox in share:
            cleaner = getattr(outbox, "cleaner", None)
            if cleaner is not None and not cleaner.idle(60):
                raise RuntimeError(f"rank {outbox.rank}'s clean-up did not finish within 60 s")


def _burst(connection: Any, cleanup_connection: Any, number: int, tag: str) -> dict[str, float]:
    """Rank 1 posting `number` records back to back, its clean-up deleting each: us per post.

    As when a rank logs several in_order records in a row and the main process keeps up (its read marks
    say every record was read). Deleting costs a round trip per record: on the posts' own connection
    each delete holds up the next post, on another connection it runs beside them.
    """
    import torch.distributed as dist

    prefix = f"burst-{tag}/{transport.PREFIX}"
    store = dist.PrefixStore(prefix, connection)  # type: ignore[attr-defined]
    marks = transport.Inbox(store, 2)
    marks.cursor[1] = 2**62
    marks.publish()  # the main process's read marks: it has read all of rank 1's records
    cleanup_store = dist.PrefixStore(prefix, cleanup_connection)  # type: ignore[attr-defined]
    outbox = transport.Outbox(store, 1, cleanup_store=cleanup_store)
    timings: list[float] = []
    for count in range(1, number + 1):
        record = _record(count, 1)
        start = time.perf_counter()
        outbox.post(*records.encode((SITE, count), record))
        timings.append(time.perf_counter() - start)
    if outbox.cleaner is None or not outbox.cleaner.idle(60):
        raise RuntimeError("rank 1's clean-up did not finish within 60 s")
    timings.sort()
    return {"mean_us": statistics.mean(timings) * 1e6, "p90_us": timings[len(timings) * 9 // 10] * 1e6}


def _poster(conn: Connection, port: int, threads: int) -> None:
    """A process of simulated ranks: `threads` connections, each posting for its share of the ranks."""
    connections = [_connect(port) for _ in range(threads)]
    # As in a job: a rank's clean-up deletes on the process group's connection, not on its posts' one.
    cleanup = [_connect(port) for _ in range(threads)]
    shares: list[list[tuple[int, Any]]] = []
    while True:
        command = conn.recv()
        if command[0] == "setup":  # (setup, prefix, outbox type, ranks)
            import torch.distributed as dist

            _, prefix, outbox_type, ranks = command
            shares = [
                [
                    (r, outbox_type(dist.PrefixStore(prefix, c), r, cleanup_store=dist.PrefixStore(prefix, d)))  # type: ignore[attr-defined]
                    for r in ranks[i::threads]
                ]
                for i, (c, d) in enumerate(zip(connections, cleanup))
            ]
        elif command[0] == "post":  # (post, first count, calls)
            workers = [threading.Thread(target=_post_calls, args=(share, *command[1:])) for share in shares if share]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            _settle(shares)
        elif command[0] == "burst":  # (burst, number): rank 1's posts back to back, two clean-up connections
            conn.send(
                {
                    where: _burst(connections[0], other, command[1], where)
                    for where, other in (("posts", connections[0]), ("own", cleanup[0]))
                }
            )
            continue
        elif command[0] == "timed":  # (timed, first count, calls): this thread, each post timed
            timings: list[float] = []
            _post_calls(shares[0], command[1], command[2], timings)
            _settle(shares)
            conn.send(timings)
            continue
        else:
            return
        conn.send("done")


class Cluster:
    """One store server and `procs` poster processes, shared by every run of the benchmark."""

    def __init__(self, procs: int, threads: int) -> None:
        context = multiprocessing.get_context("spawn")
        server_end, self._server = context.Pipe()
        self.server = context.Process(target=_serve, args=(server_end,), daemon=True)
        self.server.start()
        self.port = self._server.recv()
        self.posters = []
        for threads_of_process in [1] + [threads] * procs:  # the first: rank 1 alone, timed
            mine, theirs = context.Pipe()
            process = context.Process(target=_poster, args=(theirs, self.port, threads_of_process), daemon=True)
            process.start()
            self.posters.append((process, mine))
        self.probe, self.posters = self.posters[0], self.posters[1:]

    def timed(self, first: int, calls: int) -> list[float]:
        """Rank 1's posts of `calls` calls, from a process of its own (a rank's own heap), each timed."""
        conn = self.probe[1]
        conn.send(("timed", first, calls))
        timings: list[float] = conn.recv()
        return timings

    def burst(self, number: int) -> dict[str, dict[str, float]]:
        """Rank 1's back-to-back posts (`_burst`), clean-up on the posts' connection and on its own."""
        self.probe[1].send(("burst", number))
        figures: dict[str, dict[str, float]] = self.probe[1].recv()
        return figures

    def command(self, per_poster: list[tuple[Any, ...]]) -> None:
        for (_, conn), command in zip(self.posters, per_poster):
            conn.send(command)
        for _, conn in self.posters:
            conn.recv()

    def close(self) -> None:
        for process, conn in [self.probe, *self.posters]:
            conn.send(("stop",))
            process.join(10)
        self._server.send("stop")
        self.server.join(10)
        for process in [self.server, self.probe[0], *(p for p, _ in self.posters)]:
            if process.is_alive():
                process.kill()


# ---------------------------------------------------------------------------------------------
# One run: N ranks, one protocol
# ---------------------------------------------------------------------------------------------


class _Timed:
    """The main process's store connection, with the time spent in its calls added up (its store share)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def _handler() -> IO[str]:
    logger = logging.getLogger(LOGGER)
    sink = open(os.devnull, "w")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s %(funcName)s:%(lineno)d"))  # as `bench`'s handler
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return sink


def per_record(number: int = 2000) -> dict[str, float]:
    """Microseconds one record costs the main process outside the store: decoding it, emitting it.

    Decoding from the rank's key (`records.from_bytes`) and from a delta copy in the shared slot (what a
    call's records usually are), the copy parsed with the others of its slot, as `transport` does.
    """
    payload = records.to_bytes((SITE, 1), _record(1, 2))
    copier, reader = copies.Copier(2, refresh=transport.SLOTS), copies.CopyReader()
    reader.decode(2, copies.parse_slot(copier.line(0, *records.encode((SITE, 1), _record(1, 2))), 3)[0])
    delta = copier.line(1, *records.encode((SITE, 2), _record(2, 2)))
    record = records.from_bytes(payload)[1]
    assert record is not None  # a record was encoded
    sink = _handler()

    def from_copies(slot: bytes) -> None:
        for line in copies.parse_slot(slot, 3):
            copies.build(reader.decode(2, line, (SITE, 2))[1])  # type: ignore[index,arg-type]

    slot = delta * number

    def parse() -> list[copies.CopyLine]:
        return copies.parse_slot(slot, 3)

    def decode(lines: list[copies.CopyLine]) -> list[Any]:
        return [reader.decode(2, line, (SITE, 2))[1] for line in lines]  # type: ignore[index]

    def best(function: Callable[[Any], Any], make_input: Callable[[], Any]) -> float:
        """Best of 5 runs of `function` over `number` records, each on a fresh input (decoding changes its lines)."""
        seconds: list[float] = []
        for _ in range(5):
            given = make_input()
            start = time.perf_counter()
            function(given)
            seconds.append(time.perf_counter() - start)
        return min(seconds) / number

    try:
        key = min(timeit.repeat(lambda: records.from_bytes(payload), number=number, repeat=5)) / number
        copy = min(timeit.repeat(lambda: from_copies(slot), number=1, repeat=5)) / number
        emit = min(timeit.repeat(lambda: records.emit(record), number=number, repeat=5)) / number
        parsed = best(lambda _: parse(), lambda: None)
        decoded = best(decode, parse)
        built = best(lambda entries: [copies.build(entry) for entry in entries], lambda: decode(parse()))
    finally:
        sink.close()
    return {
        "decode_us": key * 1e6,
        "decode_copy_us": copy * 1e6,
        "emit_us": emit * 1e6,
        "parse_us": parsed * 1e6,
        "decode_delta_us": decoded * 1e6,
        "build_us": built * 1e6,
    }


def run(
    cluster: Cluster, ranks: int, protocol: str, calls: int, rounds: int, tag: str, protocols: Protocols = PROTOCOLS
) -> dict[str, Any]:
    """Measure one protocol (a name in `protocols`) at `ranks` ranks; returns its result dict."""
    inbox_type, outbox_type = protocols[protocol]
    prefix = f"{tag}/{transport.PREFIX}"
    raw = _connect(cluster.port)
    keys_before = raw.num_keys()
    main_store = _Timed(_connect(cluster.port, prefix))
    others = list(range(2, ranks))
    n = len(cluster.posters)
    cluster.command([("setup", prefix, outbox_type, others[i::n]) for i in range(n)])
    cluster.probe[1].send(("setup", prefix, outbox_type, [1]))
    cluster.probe[1].recv()
    inbox = inbox_type(main_store, ranks)
    warnings: list[str] = []
    collector = _collector.Collector(inbox, ranks, 60.0, warnings.append)
    sink = _handler()
    main_per_call: list[float] = []
    store_per_call: list[float] = []
    post_seconds: list[float] = []
    keys_by_round: list[int] = []
    try:
        for round_ in range(WARMUP + rounds):
            first = round_ * calls + 1
            cluster.command([("post", first, calls)] * n)
            timings = cluster.timed(first, calls)
            main_store.seconds = 0.0
            start = time.perf_counter()
            for count in range(first, first + calls):
                collector.emit_call((SITE, count), _record(count, 0))
            if round_ >= WARMUP:
                main_per_call.append((time.perf_counter() - start) / calls)
                store_per_call.append(main_store.seconds / calls)
                post_seconds += timings
            keys_by_round.append(raw.num_keys() - keys_before)
    finally:
        sink.close()
    if warnings:
        raise RuntimeError(f"{protocol} protocol at {ranks} ranks: {warnings[0]}")
    return {
        "ranks": ranks,
        "protocol": protocol,
        "main_ms_per_call": statistics.median(main_per_call) * 1e3,
        "main_ms_by_round": [round(seconds * 1e3, 3) for seconds in main_per_call],
        "main_store_ms_per_call": statistics.median(store_per_call) * 1e3,
        "rank_us_per_call": statistics.mean(post_seconds) * 1e6,
        "store_keys_after": keys_by_round[-1],
        "store_keys_by_round": keys_by_round,
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    """Markdown table: new protocol beside the old, one row per world size."""
    old = {r["ranks"]: r for r in results.get("old", [])}
    rows = [
        "| ranks | main ms/call (new) | of which store | main ms/call (old) | speed-up | rank us/post (new) "
        "| rank us/post (old) | store keys after (new) | keys by round (new) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for new in results["results"]:
        o = old.get(new["ranks"])
        rows.append(
            f"| {new['ranks']} | {new['main_ms_per_call']:.2f} | {new['main_store_ms_per_call']:.2f} "
            + (
                f"| {o['main_ms_per_call']:.2f} | {o['main_ms_per_call'] / new['main_ms_per_call']:.1f}x "
                if o
                else "| - | - "
            )
            + f"| {new['rank_us_per_call']:.0f} | "
            + (f"{o['rank_us_per_call']:.0f}" if o else "-")
            + f" | {new['store_keys_after']} | {', '.join(map(str, new['store_keys_by_round']))} |"
        )
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelerate-inorder-fix bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,64,256,1024", help="world sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=8, help="in_order calls per round (default 8)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per run (default 9)")
    parser.add_argument("--procs", type=int, default=4, help="poster processes (default 4)")
    parser.add_argument("--threads", type=int, default=16, help="store connections per poster process (default 16)")
    parser.add_argument("--no-old", action="store_true", help="skip the old protocol (where there is one)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--plot", metavar="PNG", help="also plot main ms per call against ranks (needs matplotlib)")
    parser.add_argument("--from-json", metavar="FILE", help="do not measure: table (and plot) of an earlier --json")
    return parser


def plot(results: dict[str, Any], path: str) -> None:
    """Log-log plot of the main process's cost per call against ranks, old protocol vs new."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench scale --plot needs matplotlib: pip install 'accelerate-inorder-fix[plot]'") from None
    figure, axes = plt.subplots(figsize=(6, 4.2), dpi=120)
    for name, label, style in (("old", "old: wait + get + delete per rank", "o--"), ("results", "new: batched", "s-")):
        rows = results.get(name) or []
        axes.plot([r["ranks"] for r in rows], [r["main_ms_per_call"] for r in rows], style, label=label)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("ranks")
    axes.set_ylabel("main process, ms per in_order call")
    axes.set_title("gather mode: main process cost per call (TCPStore, loopback)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv: Optional[list[str]] = None, protocols: Protocols = PROTOCOLS) -> dict[str, Any]:
    """Run the benchmark of `protocols` (name -> (inbox type, outbox type)); print the table; return the results."""
    args = _parser().parse_args(argv)
    results: dict[str, Any]
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        print(table(results))
        if args.plot:
            plot(results, args.plot)
        return results
    sizes = [int(s) for s in args.ranks.split(",")]
    if min(sizes) < 3:
        raise SystemExit("bench scale: --ranks must be at least 3 (rank 0 main, rank 1 timed, rank 2+ posters)")
    cluster = Cluster(args.procs, args.threads)
    results = {"results": [], "old": []}
    try:
        for ranks in sizes:
            for protocol in [name for name in protocols if not (args.no_old and name == "old")]:
                print(f"{ranks} ranks, {protocol} protocol ...", file=sys.stderr, flush=True)
                result = run(cluster, ranks, protocol, args.calls, args.rounds, f"{protocol}{ranks}", protocols)
                results["results" if protocol == "new" else "old"].append(result)
        results["rank_burst"] = cluster.burst(BURST)
    finally:
        cluster.close()
    results["per_record"] = per_record()
    results["method"] = (
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {__import__('torch').__version__}; TCPStore server in its own process on 127.0.0.1; ranks 2..N-1 "
        f"from {args.procs} processes x {args.threads} connections; {args.calls} calls x {args.rounds} rounds after {WARMUP} warm-up; "
        "main: median per call, records emitted to os.devnull; rank: mean per post"
    )
    print(results["method"] + "\n")
    print(table(results))
    print(
        "\nOutside the store, each record costs the main process {decode_copy_us:.1f} us to decode from a delta "
        "copy ({decode_us:.1f} us from its key) and {emit_us:.1f} us to emit (best of 5 x 2,000, this run).".format(
            **results["per_record"]
        )
    )
    print(
        "Rank 1 posting {n:,} records back to back, clean-up deleting each: {posts[mean_us]:.0f} us mean ({posts[p90_us]:.0f} "
        "p90) with the deletes on the posts' connection, {own[mean_us]:.0f} us ({own[p90_us]:.0f}) on a connection of "
        "their own (the process group's, in a job).".format(n=BURST, **results["rank_burst"])
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results
