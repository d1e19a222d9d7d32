"""Benchmark: gather mode's cost per in_order call at 8 to 1,024 ranks, as a user meets it.

A real job of 1,024 ranks does not fit on a laptop, but gather mode's costs are a rank's post and
the main process's reading (store traffic), decoding and emitting, so the ranks are simulated as
client connections of a real `TCPStore`:

- the server runs in a process of its own on 127.0.0.1, as torchrun's rendezvous store does;
- ranks 2..N-1 post from `--procs` processes x `--threads` threads (one store connection per thread),
  through the package's own rank-side code (`records.encode` + `queues.Outbox.post`, as
  `GatherSession._post` calls them: record, copy in the shared slot, background clean-up on a second
  connection, as the process group's);
- rank 1 posts from a process of its own (its own heap and connection, as a real rank), and each of
  its posts is timed: that is the rank's cost per call (`rank_us_per_call`, mean);
- the main process's side is this process: the real `Collector`, emitting every record through a
  real `StreamHandler` writing to os.devnull, and a handler that counts them: a run whose main process
  emitted fewer (or more) records than the ranks posted fails (`records_emitted`, `records_expected`).

Two arrivals (`--arrival`, both by default):

- `preposted`, the floor: each round, every rank posts `--calls` calls' records and its clean-ups
  have run; then the main process makes those calls, timed. Only the main process's own work is timed:
  the arrival path (`wait`, a second slot read, `multi_get`) never runs.
- `concurrent`, as in a training step: the steps of a round start every `--step-ms` ms, and in each
  step every rank, the main process included, reaches the call at a time drawn uniformly from
  `[0, --spread-ms]` ms after the step starts (seeded: the same draws for both protocols). Ranks post
  while the main process collects, their clean-ups run against the same server meanwhile, and a main
  process that arrives before a rank waits for it. `main_ms_per_call` is then what a user's main
  process meets: from its own arrival until its call returns. Where the simulated ranks cannot post
  on time (1,024 ranks from 2 CPUs), `posts_late_ms_p90` says how late they were: the figure then
  includes the simulation's own posting time, and `main_cpu_ms_per_call` (the main thread's CPU) is
  the main process's own work.

`main_ms_per_call` is the median over `--rounds` rounds (after one warm-up round) of a round's time
per call; `main_store_ms_per_call` the part spent in calls on its store connection. `store_keys_after`
is how many keys the run left in the store after its last round (`store_keys_by_round`: after each
round; it must not grow with the rounds). The old protocol (one wait, get and delete per rank) runs beside the
package's, on the same server and processes, the two rotated round by round (ABBA: new, old, old,
new, ...); `--no-old` leaves it out. This script lives in the repository, not in the wheel: a user
installs nothing to simulate 1,024 ranks.

    python benchmarks/bench_scale.py --ranks 8,64,256,1024 --json FILE --plot PNG
    python benchmarks/bench_scale.py --ranks 8,64 --calls 4 --rounds 2   # a quick look

`main(argv)` prints a Markdown table per arrival and returns the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import multiprocessing
import os
import platform
import random
import statistics
import sys
import threading
import time
import timeit
from multiprocessing.connection import Connection
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Union

from accelerate_inorder_fix import config
from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import copies, queues, records
from accelerate_inorder_fix.store import connection


if TYPE_CHECKING:  # torch's typed c10d classes; imported where used, so that `--help` needs no torch
    from torch._C._distributed_c10d import Store

SITE = ("bench_scale.py", "train_step", 42)
WARMUP = 1  # rounds run before the measured ones at each size (first loggers, first full copies)
LOGGER = "aif.bench.scale"
BURST = 2000  # rank 1's back-to-back posts, for the clean-up's connection (`_burst`)
ARRIVALS = ("preposted", "concurrent")
LEAD = 0.3  # seconds between sending a concurrent round's schedule and its first step

# The protocols a run can measure: name -> (main process's inbox type, a rank's outbox type): the
# package's own, and the one gather mode had before batching (`LegacyInbox`, below), side by side.
Protocols = dict[str, tuple[Any, Any]]
Share = list[tuple[int, Any]]  # (rank, its outbox): the ranks one store connection posts for


class CountError(RuntimeError):
    """The main process emitted a number of records other than the ranks posted: the run measured nothing."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When each rank reaches each call of a concurrent round (epoch seconds: the processes share a clock)."""

    start: float  # the first step's start
    first: int  # the round's first call count
    step: float  # seconds between two steps' starts
    spread: float  # a rank reaches the call within this many seconds after its step starts
    seed: int

    def at(self, rank: int, count: int) -> float:
        offset = random.Random(self.seed * 1_000_003 + rank * 65_537 + count).uniform(0.0, self.spread)
        return self.start + (count - self.first) * self.step + offset


# ---------------------------------------------------------------------------------------------
# Processes: the store server, and the posters (simulated ranks)
# ---------------------------------------------------------------------------------------------


def _connect(port: int, prefix: Optional[str] = None) -> Store:
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=120))
    return PrefixStore(prefix, store) if prefix else store


def _serve(conn: Connection) -> None:
    from torch._C._distributed_c10d import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    conn.send(server.port)
    conn.recv()  # until told to stop


def _record(count: int, rank: int) -> logging.LogRecord:
    record = logging.LogRecord(
        LOGGER, logging.INFO, "/job/bench_scale.py", SITE[2], f"[RANK {rank}] step {count} r{rank}", None, None
    )  # tagged as gather mode tags it, and every rank's its own: with `--collapse`, nothing is grouped
    record.rank, record.hostname = rank, "node-a"  # every record from a rank's queue says where it comes from
    return record


def _post(outbox: Any, rank: int, count: int, timings: Optional[list[float]]) -> None:
    record = _record(count, rank)
    start = time.perf_counter()
    outbox.post(*records.encode((SITE, count), record))  # as `GatherSession._post`
    if timings is not None:
        timings.append(time.perf_counter() - start)


def _post_calls(share: Share, first: int, calls: int, timings: Optional[list[float]] = None) -> None:
    for count in range(first, first + calls):
        for rank, outbox in share:
            _post(outbox, rank, count, timings)


def _post_on_schedule(
    share: Share, schedule: Schedule, calls: int, late: list[float], timings: Optional[list[float]] = None
) -> None:
    """Each rank of `share` posts each call's record at its time in `schedule`; how late each post was, in `late`."""
    posts = sorted(
        (schedule.at(rank, count), rank, count, index)
        for count in range(schedule.first, schedule.first + calls)
        for index, (rank, _) in enumerate(share)
    )
    for at, rank, count, index in posts:
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)  # the rank's compute until it reaches the call (simulation side)
        late.append(max(0.0, -wait))
        _post(share[index][1], rank, count, timings)


def _wait_for_cleanups(shares: list[Share]) -> None:
    """Until these ranks' clean-ups have run: in a real job they run on the ranks' own CPUs, not the main's."""
    for share in shares:
        for _, outbox in share:
            cleaner = getattr(outbox, "cleaner", None)
            if cleaner is not None and not cleaner.idle(60):
                raise RuntimeError(f"rank {outbox.rank}'s clean-up did not finish within 60 s")


def _in_threads(shares: list[Share], target: Callable[..., None], *args: Any) -> list[float]:
    """`target(share, *args, late)` for each share, in a thread each; the lateness of their posts."""
    late: list[list[float]] = [[] for _ in shares]
    workers = [
        threading.Thread(target=target, args=(share, *args, late[i])) for i, share in enumerate(shares) if share
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [seconds for part in late for seconds in part]


def _post_now(share: Share, first: int, calls: int, late: list[float]) -> None:
    _post_calls(share, first, calls)


def _poster(conn: Connection, port: int, threads: int) -> None:
    """A process of simulated ranks: `threads` connections, each posting for its share of the ranks.

    Commands (tuples): `setup` a run's outboxes under its tag; `post` a round's records now (preposted),
    or `schedule` them (concurrent); rank 1's process `timed`/`timed_schedule` times each post; `burst`.
    """
    connections = [_connect(port) for _ in range(threads)]
    # As in a job: a rank's clean-up deletes on the process group's connection, not on its posts' one.
    cleanup = [_connect(port) for _ in range(threads)]
    runs: dict[str, list[Share]] = {}
    while True:
        command = conn.recv()
        kind = command[0]
        if kind == "setup":  # (setup, tag, prefix, outbox type, ranks)
            from torch._C._distributed_c10d import PrefixStore as prefixed

            _, tag, prefix, outbox_type, ranks = command
            runs[tag] = [
                [
                    (r, outbox_type(prefixed(prefix, c), r, cleanup_store=prefixed(prefix, d)))
                    for r in ranks[i::threads]
                ]
                for i, (c, d) in enumerate(zip(connections, cleanup))
            ]
            conn.send("done")
        elif kind == "post":  # (post, tag, first count, calls): all ranks' records, now
            _in_threads(runs[command[1]], _post_now, command[2], command[3])
            _wait_for_cleanups(runs[command[1]])
            conn.send("done")
        elif kind == "schedule":  # (schedule, tag, Schedule, calls): each record at its rank's time
            late = _in_threads(runs[command[1]], _post_on_schedule, command[2], command[3])
            _wait_for_cleanups(runs[command[1]])
            conn.send(late)
        elif kind == "timed":  # (timed, tag, first count, calls): this thread, each post timed
            timings: list[float] = []
            _post_calls(runs[command[1]][0], command[2], command[3], timings)
            _wait_for_cleanups(runs[command[1]])
            conn.send(timings)
        elif kind == "timed_schedule":  # (timed_schedule, tag, Schedule, calls)
            timings = []
            _post_on_schedule(runs[command[1]][0], command[2], command[3], [], timings)
            _wait_for_cleanups(runs[command[1]])
            conn.send(timings)
        elif kind == "burst":  # (burst, number): rank 1's posts back to back, two clean-up connections
            conn.send(
                {
                    where: _burst(connections[0], other, command[1], where)
                    for where, other in (("posts", connections[0]), ("own", cleanup[0]))
                }
            )
        else:
            return


def _burst(posts_connection: Store, cleanup_connection: Store, number: int, tag: str) -> dict[str, float]:
    """Rank 1 posting `number` records back to back, its clean-up deleting each: us per post.

    As when a rank logs several in_order records in a row and the main process keeps up (its read marks
    say every record was read). Deleting costs a round trip per record: on the posts' own connection
    each delete holds up the next post, on another connection it runs beside them.
    """
    from torch._C._distributed_c10d import PrefixStore

    prefix = f"burst-{tag}/{connection.PREFIX}"
    store = PrefixStore(prefix, posts_connection)
    marks = queues.StoreInbox(store, 2)
    marks.cursor[1] = 2**62
    marks.publish()  # the main process's read marks: it has read all of rank 1's records
    cleanup_store = PrefixStore(prefix, cleanup_connection)
    outbox = queues.Outbox(store, 1, cleanup_store=cleanup_store)
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


class Cluster:
    """One store server and `procs` poster processes, shared by every run of the benchmark."""

    def __init__(self, procs: int, threads: int) -> None:
        context = multiprocessing.get_context("spawn")
        server_end, self._server = context.Pipe()
        self.server = context.Process(target=_serve, args=(server_end,), daemon=True)
        self.server.start()
        self.port: int = self._server.recv()
        posters = []
        for threads_of_process in [1] + [threads] * procs:  # the first: rank 1 alone, timed
            mine, theirs = context.Pipe()
            process = context.Process(target=_poster, args=(theirs, self.port, threads_of_process), daemon=True)
            process.start()
            posters.append((process, mine))
        self.probe = posters[0]
        self.posters = posters[1:]

    def send(self, per_poster: list[tuple[Any, ...]], probe: Optional[tuple[Any, ...]] = None) -> None:
        """A command to each poster process (and one to rank 1's); their answers come with `receive`."""
        for (_, conn), command in zip(self.posters, per_poster):
            conn.send(command)
        if probe is not None:
            self.probe[1].send(probe)

    def receive(self, probe: bool = False) -> tuple[list[Any], Any]:
        answers = [conn.recv() for _, conn in self.posters]
        return answers, (self.probe[1].recv() if probe else None)

    def timed(self, tag: str, first: int, calls: int) -> list[float]:
        """Rank 1's posts of `calls` calls, from a process of its own (a rank's own heap), each timed."""
        self.probe[1].send(("timed", tag, first, calls))
        timings: list[float] = self.probe[1].recv()
        return timings

    def burst(self, number: int) -> dict[str, dict[str, float]]:
        """Rank 1's back-to-back posts (`_burst`), clean-up on the posts' connection and on its own."""
        self.probe[1].send(("burst", number))
        figures: dict[str, dict[str, float]] = self.probe[1].recv()
        return figures

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
# One run: N ranks, one protocol, one arrival
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


class EmittedCount(logging.Handler):
    """Counts every record the main process's handlers receive: the run's proof that it delivered."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += len(getattr(record, "ranks", ()) or (record,))  # a collapsed line: each rank it names


def _handlers() -> tuple[IO[str], EmittedCount]:
    """The benchmark logger's handlers: a `StreamHandler` to os.devnull (as `bench`'s), and a count."""
    logger = logging.getLogger(LOGGER)
    sink = open(os.devnull, "w")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s %(funcName)s:%(lineno)d"))  # as `bench`'s handler
    counter = EmittedCount()
    logger.handlers[:] = [handler, counter]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return sink, counter


def _copied_entry(reader: copies.CopyReader, line: copies.CopyLine) -> Union[logging.LogRecord, copies.DeferredRecord]:
    """Rank 2's entry for call 2 from its delta copy `line`; a copy that cannot give it fails the benchmark.

    Args:
        reader (`copies.CopyReader`): the main process's reader, rank 2's full copy already read.
        line (`copies.CopyLine`): one parsed line of the shared slot.
    """
    decoded = reader.decode(2, line, (SITE, 2))
    if decoded is None or decoded[1] is None:
        raise RuntimeError("a delta copy did not give its record: the speed check measured nothing")
    return decoded[1]


def per_record(number: int = 2000) -> dict[str, float]:
    """Microseconds one record costs the main process outside the store: decoding it, emitting it.

    Decoding from the rank's key (`records.from_bytes`) and from a delta copy in the shared slot (what a
    call's records usually are), the copy parsed with the others of its slot, as `queues` does.
    """
    payload = records.to_bytes((SITE, 1), _record(1, 2))
    copier, reader = copies.Copier(2, refresh=queues.SLOTS), copies.CopyReader()
    reader.decode(2, copies.parse_slot(copier.line(0, *records.encode((SITE, 1), _record(1, 2))), 3)[0])
    delta = copier.line(1, *records.encode((SITE, 2), _record(2, 2)))
    record = records.from_bytes(payload)[1]
    assert record is not None  # a record was encoded
    sink, _ = _handlers()

    def from_copies(slot: bytes) -> None:
        for line in copies.parse_slot(slot, 3):
            copies.build(_copied_entry(reader, line))

    slot = delta * number

    def parse() -> list[copies.CopyLine]:
        return copies.parse_slot(slot, 3)

    def decode(lines: list[copies.CopyLine]) -> list[Any]:
        return [_copied_entry(reader, line) for line in lines]

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


def check_delivery(tag: str, emitted: int, expected: int, warnings: list[str]) -> None:
    """`CountError` unless the main process emitted exactly the records its ranks posted, without a warning."""
    if warnings:
        raise CountError(f"{tag}: {warnings[0]}")
    if emitted != expected:
        raise CountError(f"{tag}: the main process emitted {emitted:,} records, the ranks posted {expected:,}")


class Run:
    """One protocol at one size and arrival: its inbox, collector and store prefix, measured round by round."""

    def __init__(
        self, cluster: Cluster, ranks: int, protocol: str, arrival: str, args: argparse.Namespace, protocols: Protocols
    ) -> None:
        inbox_type, outbox_type = protocols[protocol]
        self.cluster = cluster
        self.ranks = ranks
        self.protocol = protocol
        self.arrival = arrival
        self.args = args
        self.tag = f"{protocol}-{arrival}-{ranks}"
        prefix = f"{self.tag}/{connection.PREFIX}"
        self.raw = _connect(cluster.port)
        self.keys_before = self.raw.num_keys()
        self.store = _Timed(_connect(cluster.port, prefix))
        others = list(range(2, ranks))
        n = len(cluster.posters)
        cluster.send(
            [("setup", self.tag, prefix, outbox_type, others[i::n]) for i in range(n)],
            ("setup", self.tag, prefix, outbox_type, [1]),
        )
        cluster.receive(probe=True)
        self.warnings: list[str] = []
        self.collector = _collector.Collector(inbox_type(self.store, ranks), ranks, 60.0, self.warnings.append)
        self.rounds = 0
        self.emitted = 0
        self.wall: list[float] = []  # per measured round: seconds per call
        self.cpu: list[float] = []
        self.store_seconds: list[float] = []
        self.posts: list[float] = []  # rank 1's posts, seconds each
        self.late: list[float] = []  # concurrent: how late the simulated ranks posted, seconds
        self.keys_by_round: list[int] = []

    def round(self, counter: EmittedCount) -> None:
        calls = self.args.calls
        first = self.rounds * calls + 1
        emitted_before = counter.count
        self.store.seconds = 0.0
        if self.arrival == "preposted":
            wall, cpu, timings, late = self._preposted(first, calls)
        else:
            wall, cpu, timings, late = self._concurrent(first, calls)
        if self.rounds >= WARMUP:
            self.wall.append(wall / calls)
            self.cpu.append(cpu / calls)
            self.store_seconds.append(self.store.seconds / calls)
            self.posts += timings
            self.late += late
        self.emitted += counter.count - emitted_before
        self.keys_by_round.append(self.raw.num_keys() - self.keys_before)
        self.rounds += 1

    def _calls(self, first: int, calls: int, arrive: Optional[Schedule] = None) -> tuple[float, float]:
        """The main process's calls `first...`, each from its arrival (now, or its time in `arrive`)."""
        wall = 0.0
        cpu = 0.0
        for count in range(first, first + calls):
            if arrive is not None:
                wait = arrive.at(0, count) - time.time()
                if wait > 0:
                    time.sleep(wait)  # the main process's own compute until it reaches the call
            start = time.perf_counter()
            cpu_start = time.thread_time()
            self.collector.emit_call((SITE, count), _record(count, 0))
            wall += time.perf_counter() - start
            cpu += time.thread_time() - cpu_start
        return wall, cpu

    def _preposted(self, first: int, calls: int) -> tuple[float, float, list[float], list[float]]:
        self.cluster.send([("post", self.tag, first, calls)] * len(self.cluster.posters))
        self.cluster.receive()
        timings = self.cluster.timed(self.tag, first, calls)  # then rank 1's, each timed
        wall, cpu = self._calls(first, calls)
        return wall, cpu, timings, []

    def _concurrent(self, first: int, calls: int) -> tuple[float, float, list[float], list[float]]:
        args = self.args
        schedule = Schedule(time.time() + LEAD, first, args.step_ms / 1e3, args.spread_ms / 1e3, args.seed)
        self.cluster.send(
            [("schedule", self.tag, schedule, calls)] * len(self.cluster.posters),
            ("timed_schedule", self.tag, schedule, calls),
        )
        wall, cpu = self._calls(first, calls, schedule)
        late, timings = self.cluster.receive(probe=True)
        return wall, cpu, timings, [seconds for part in late for seconds in part]

    def result(self) -> dict[str, Any]:
        """The figures; `CountError` when the main process did not emit exactly one record per rank and call."""
        keys_after = self.keys_by_round[-1]
        self.collector.flush()  # what was delivered and not yet emitted (nothing, in a sound run), then the seal
        expected = self.ranks * self.args.calls * self.rounds
        check_delivery(self.tag, self.emitted, expected, self.warnings)
        late = sorted(self.late)
        return {
            "ranks": self.ranks,
            "arrival": self.arrival,
            "protocol": self.protocol,
            "main_ms_per_call": statistics.median(self.wall) * 1e3,
            "main_ms_by_round": [round(seconds * 1e3, 3) for seconds in self.wall],
            "main_cpu_ms_per_call": statistics.median(self.cpu) * 1e3,
            "main_store_ms_per_call": statistics.median(self.store_seconds) * 1e3,
            "rank_us_per_call": statistics.mean(self.posts) * 1e6,
            "records_emitted": self.emitted,
            "records_expected": expected,
            "posts_late_ms_p90": late[len(late) * 9 // 10] * 1e3 if late else 0.0,
            "store_keys_after": keys_after,
            "store_keys_by_round": self.keys_by_round,
        }


def measure(
    cluster: Cluster, ranks: int, arrival: str, names: list[str], args: argparse.Namespace, protocols: Protocols
) -> list[dict[str, Any]]:
    """Every protocol in `names` at one size and arrival, rotated ABBA round by round (none always first)."""
    runs = [Run(cluster, ranks, name, arrival, args, protocols) for name in names]
    sink, counter = _handlers()
    try:
        for round_ in range(WARMUP + args.rounds):
            for run in runs if round_ % 2 == 0 else runs[::-1]:
                run.round(counter)
        return [run.result() for run in runs]
    finally:
        sink.close()


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def table(results: list[dict[str, Any]], arrival: str) -> str:
    """Markdown table for one arrival: the new protocol beside the old (if measured), one row per world size."""
    rows = [
        "| ranks | main ms/call (new) | main CPU ms/call | of which store | main ms/call (old) | old / new "
        "| rank us/post (new) | rank us/post (old) | records emitted / expected | posts late p90 ms "
        "| store keys after (new) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mine = [r for r in results if r["arrival"] == arrival]
    old = {r["ranks"]: r for r in mine if r["protocol"] == "old"}
    for new in [r for r in mine if r["protocol"] == "new"]:
        o = old.get(new["ranks"])
        emitted = f"{new['records_emitted']:,} / {new['records_expected']:,}"
        rows.append(
            f"| {new['ranks']} | {new['main_ms_per_call']:.2f} | {new['main_cpu_ms_per_call']:.2f} "
            f"| {new['main_store_ms_per_call']:.2f} "
            + (
                f"| {o['main_ms_per_call']:.2f} | {o['main_ms_per_call'] / new['main_ms_per_call']:.1f}x "
                if o
                else "| - | - "
            )
            + f"| {new['rank_us_per_call']:.0f} | "
            + (f"{o['rank_us_per_call']:.0f}" if o else "-")
            + f" | {emitted} | {new['posts_late_ms_p90']:.1f} | {new['store_keys_after']} |"
        )
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench_scale.py",
        description=__doc__.split("\n\n")[0],
        epilog="The recorded run (benchmarks/RESULTS-scale.md): --ranks 8,64,256,1024 --json FILE, every other "
        "option at its default.",
    )
    parser.add_argument("--ranks", default="8,64,256,1024", help="world sizes, comma-separated")
    parser.add_argument("--arrival", default="preposted,concurrent", help="preposted, concurrent or both (default)")
    parser.add_argument("--calls", type=int, default=8, help="in_order calls per round (default 8)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per run (default 9)")
    parser.add_argument("--step-ms", type=float, default=60.0, help="concurrent: ms between steps (default 60)")
    parser.add_argument(
        "--spread-ms", type=float, default=10.0, help="concurrent: ranks reach a call within this (10)"
    )
    parser.add_argument("--seed", type=int, default=0, help="concurrent: seed of the arrival times")
    parser.add_argument("--procs", type=int, default=4, help="poster processes (default 4)")
    parser.add_argument("--threads", type=int, default=16, help="store connections per poster process (default 16)")
    parser.add_argument("--no-old", action="store_true", help="skip the old protocol (where there is one)")
    parser.add_argument(
        "--collapse", action="store_true", help="collapse on in the main process (every rank's message differs)"
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--plot", metavar="PNG", help="also plot main ms per call against ranks (needs matplotlib)")
    parser.add_argument("--from-json", metavar="FILE", help="do not measure: tables (and plot) of an earlier --json")
    return parser


def plot(results: dict[str, Any], path: str) -> None:
    """Log-log plot of the main process's cost per call against ranks: each protocol, each arrival."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "bench_scale.py --plot needs matplotlib: pip install 'accelerate-inorder-fix[plot]'"
        ) from None
    figure, axes = plt.subplots(figsize=(6, 4.2), dpi=120)
    labels = {"old": "old: wait + get + delete per rank", "new": "new: batched"}
    for arrival in results["arrivals"]:
        for protocol, style in (("old", "o--"), ("new", "s-")):
            rows = [r for r in results["results"] if r["protocol"] == protocol and r["arrival"] == arrival]
            if rows:
                label = f"{labels[protocol]}, {arrival}"
                axes.plot([r["ranks"] for r in rows], [r["main_ms_per_call"] for r in rows], style, label=label)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("ranks")
    axes.set_ylabel("main process, ms per in_order call")
    axes.set_title("gather mode: main process cost per call (TCPStore, loopback)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def _print(results: dict[str, Any]) -> None:
    print(results["method"] + "\n")
    for arrival in results["arrivals"]:
        print(f"arrival: {arrival}\n")
        print(table(results["results"], arrival) + "\n")
    print(
        "Outside the store, each record costs the main process {decode_copy_us:.1f} us to decode from a delta "
        "copy ({decode_us:.1f} us from its key) and {emit_us:.1f} us to emit (best of 5 x 2,000, this run).".format(
            **results["per_record"]
        )
    )
    print(
        "Rank 1 posting {n:,} records back to back, clean-up deleting each: {posts[mean_us]:.0f} us mean ({posts[p90_us]:.0f} "
        "p90) with the deletes on the posts' connection, {own[mean_us]:.0f} us ({own[p90_us]:.0f}) on a connection of "
        "their own (the process group's, in a job).".format(n=BURST, **results["rank_burst"])
    )


def main(argv: Optional[list[str]] = None, protocols: Optional[Protocols] = None) -> dict[str, Any]:
    """Run the benchmark of `protocols` (name -> (inbox type, outbox type)); print the tables; return the results.

    Exits with status 1 when a run's main process did not emit exactly the records its ranks posted.
    """
    protocols = PROTOCOLS if protocols is None else protocols
    args = _parser().parse_args(argv)
    results: dict[str, Any]
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        _print(results)
        if args.plot:
            plot(results, args.plot)
        return results
    sizes = [int(s) for s in args.ranks.split(",")]
    arrivals = [a for a in args.arrival.split(",") if a]
    if min(sizes) < 3:
        raise SystemExit("bench_scale.py: --ranks must be at least 3 (rank 0 main, rank 1 timed, rank 2+ posters)")
    if not arrivals or not set(arrivals) <= set(ARRIVALS):
        raise SystemExit(
            f"bench_scale.py: --arrival takes {', '.join(ARRIVALS)} (comma-separated), not {args.arrival!r}"
        )
    names = [name for name in protocols if not (args.no_old and name == "old")]
    config.SETTINGS.configure(collapse=args.collapse)  # read by the collector where it prints
    cluster = Cluster(args.procs, args.threads)
    results = {"arrivals": arrivals, "results": []}
    try:
        for arrival in arrivals:
            for ranks in sizes:
                print(f"{ranks} ranks, {arrival}, {' / '.join(names)} ...", file=sys.stderr, flush=True)
                results["results"] += measure(cluster, ranks, arrival, names, args, protocols)
        results["rank_burst"] = cluster.burst(BURST)
    except CountError as exc:
        raise SystemExit(f"bench_scale.py: FAILED, {exc}") from None
    finally:
        cluster.close()
    results["per_record"] = per_record()
    results["method"] = (
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {__import__('torch').__version__}; TCPStore server in its own process on 127.0.0.1; ranks 2..N-1 "
        f"from {args.procs} processes x {args.threads} connections; {args.calls} calls x {args.rounds} rounds after "
        f"{WARMUP} warm-up, protocols rotated ABBA by round; concurrent: a step every {args.step_ms:g} ms, ranks reach "
        f"the call within {args.spread_ms:g} ms (uniform, seed {args.seed}); main: median per call, records emitted to "
        f"os.devnull and counted; rank: mean per post; collapse {'on' if args.collapse else 'off'}"
    )
    _print(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results


class LegacyOutbox:
    """The rank side before batching: append to its queue, never clean (the main process deleted)."""

    def __init__(self, store: Any, rank: int, cleanup_store: Any = None) -> None:  # never cleans
        self.store = store
        self.rank = rank
        self.sent = 0

    def post(self, payload: bytes, document: Any = None) -> bool:
        self.store.set(queues.key(self.rank, self.sent), payload)
        self.sent += 1
        return True


class LegacyInbox:
    """The main process's side before batching: per rank a wait or check, a get and a delete.

    Implements the collector's `RecordSource` protocol (`accelerate_inorder_fix.gather.collector.RecordSource`).
    """

    def __init__(self, store: Any, world_size: int) -> None:
        self.store = store
        self.cursor = [0] * world_size

    def _next_key(self, rank: int) -> str:
        return queues.key(rank, self.cursor[rank])

    def wait(self, ranks: list[int], seconds: float) -> bool:
        try:
            self.store.wait([self._next_key(r) for r in ranks], datetime.timedelta(seconds=seconds))
        except RuntimeError:
            return False
        return True

    def ready(self, rank: int) -> bool:
        return bool(self.store.check([self._next_key(rank)]))

    def take(self, rank: int) -> Any:
        name = self._next_key(rank)
        payload = self.store.get(name)
        self.store.delete_key(name)
        self.cursor[rank] += 1
        return records.decode(payload)

    def take_many(self, ranks: list[int]) -> list[Any]:
        return [self.take(rank) for rank in ranks]  # exactly the old loop: one rank after another

    def take_copied(self, ranks: list[int], current: Any, into: Any) -> list[Any]:
        return []  # no shared slots then

    def end_call(self) -> None:
        pass

    def seal(self, rank: int) -> list[Any]:
        return []


PROTOCOLS: Protocols = {"new": (queues.StoreInbox, queues.Outbox), "old": (LegacyInbox, LegacyOutbox)}


if __name__ == "__main__":
    main()
