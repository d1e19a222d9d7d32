"""Fault-injection cases for in_order logging, run on every rank of a real job (tests/jobs/test_faults.py).

    torchrun --nproc_per_node 4 fault_ranks.py payloads,quiet_main,threads

Each case injects one fault (a raising filter, a slow rank, threads, a rank that dies, ...) and makes
in_order calls whose messages name the case, the call, the rank and (for threads) the thread:
`case#call r<rank> [t<thread>]`. Every record line ends with ` by=r<k>`, the rank of the process that
wrote it: in gather mode the main process writes every on-time record, so `by=r0` proves gather ran.
After each case (unless it ends the job) a collective checks that no rank skipped or added a barrier,
and `@@DONE case r<rank>` is printed. `@@RESULT case r<rank> key=json` lines carry measurements.

The package is imported explicitly (the test-suite keeps the start-up hook off). Environment:
- `AIF_RANK_TIMEOUTS=a,b,c,d`: rank k sets `ACCELERATE_INORDER_TIMEOUT` to the k-th word first;
- `AIF_CONFIGURE_MODE=<rank>:<mode>`: that rank calls `configure(mode=...)` before any in_order call;
- `AIF_SLOW=<seconds>`: how late the slow rank is (a little more than the job's timeout).
"""

import json
import logging
import os
import signal
import sys
import threading
import time


LOGGER = "aif.faults"
DONE, RESULT = "@@DONE", "@@RESULT"
BIG = 1 << 20  # a 1 MiB message
TEXT = "ünïcødé ✓ 日本語 — ok"
THREADS, THREAD_CALLS = 3, 20


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Rank:
    def __init__(self, index, size, log, handler):
        self.index, self.size, self.log, self.handler = index, size, log, handler

    def result(self, case, key, value):
        say(f"{RESULT} {case} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return value.item()

    def pids(self):
        import torch
        import torch.distributed as dist

        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(out, torch.tensor([os.getpid()], dtype=torch.int64))
        return [int(t.item()) for t in out]


# -- cases --------------------------------------------------------------------------------------


def plain(r):
    """Two ordinary in_order calls (a baseline every job can run)."""
    r.log.info("plain#1 r%d", r.index, in_order=True)
    r.log.warning("plain#2 r%d", r.index, in_order=True)


def payloads(r):
    """%-args with non-ASCII text, a 1 MiB message, stack_info, exc_info."""
    r.log.info("payloads#1 r%d %s %s", r.index, TEXT, {"k": 1}, in_order=True)
    r.log.info(f"payloads#2 r{r.index} " + "x" * BIG, in_order=True)
    r.log.info(f"payloads#3 r{r.index}", stack_info=True, in_order=True)
    try:
        raise ValueError(f"boom r{r.index} {TEXT}")
    except ValueError:
        r.log.error(f"payloads#4 r{r.index}", exc_info=True, in_order=True)


def quiet_main(r):
    """The main process's logger at WARNING, the others at INFO: an INFO call is the others' records only."""
    logging.getLogger(LOGGER).setLevel(logging.WARNING if r.index == 0 else logging.INFO)
    r.log.info(f"quiet_main#1 r{r.index}", in_order=True)
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)


def main_waits(r):
    """The main process arrives first, the others after it in reverse rank order: main waits, then the records come."""
    if r.index:
        time.sleep(0.3 * (r.size - r.index))
    start = time.monotonic()
    r.log.info(f"main_waits#1 r{r.index}", in_order=True)
    r.result("main_waits", "seconds", round(time.monotonic() - start, 3))


class _Refuse(logging.Filter):
    def filter(self, record):
        if "filter_raises#1 r2" in record.getMessage():
            raise RuntimeError("a user's filter raised")
        return True


def filter_raises(r):
    """A filter on the main process's handler raises for rank 2's record: only that record is lost."""
    refuse = _Refuse()
    if r.index == 0:
        r.handler.addFilter(refuse)
    r.log.info(f"filter_raises#1 r{r.index}", in_order=True)
    r.log.info(f"filter_raises#2 r{r.index}", in_order=True)
    r.handler.removeFilter(refuse)


def threads(r):
    """3 threads per rank, 20 in_order calls each, from one call site."""

    def work(thread):
        for call in range(1, THREAD_CALLS + 1):
            r.log.info(f"threads#{call} r{r.index} t{thread}", in_order=True)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


class Unrebuildable:
    """Pickles on its rank, and refuses to be rebuilt in the main process."""

    def __reduce__(self):
        return (_rebuild, ())

    def __repr__(self):
        return "<Unrebuildable>"


def _rebuild():
    if os.environ.get("RANK") == "0":
        raise RuntimeError("cannot be rebuilt here")
    return Unrebuildable()


class _ShowOdd(logging.Filter):
    def filter(self, record):
        if hasattr(record, "odd"):
            rank = record.getMessage().split("#", 1)[1].split()[1]
            say(f"@@ODD {rank} {type(record.odd).__name__} {record.odd!s}")
        return True


def unrebuildable(r):
    """Rank 1's record factory adds an attribute the main process cannot rebuild: it arrives as its repr."""
    previous = logging.getLogRecordFactory()
    show = _ShowOdd()
    if r.index == 1:

        def factory(*args, **kwargs):
            record = previous(*args, **kwargs)
            record.odd = Unrebuildable()
            return record

        logging.setLogRecordFactory(factory)
    if r.index == 0:
        r.handler.addFilter(show)
    r.log.info(f"unrebuildable#1 r{r.index}", in_order=True)
    logging.setLogRecordFactory(previous)
    r.log.info(f"unrebuildable#2 r{r.index}", in_order=True)
    r.handler.removeFilter(show)


def slow_rank(r):
    """Rank 2 is alive but later than the deadline: its record is emitted on its own, once."""
    if r.index == 2:
        time.sleep(float(os.environ.get("AIF_SLOW", "4")))
    start = time.monotonic()
    r.log.info(f"slow_rank#1 r{r.index}", in_order=True)
    r.result("slow_rank", "seconds", round(time.monotonic() - start, 3))
    r.result("slow_rank", "sum", r.all_reduce_sum())
    r.log.info(f"slow_rank#2 r{r.index}", in_order=True)


def others_disabled(r):
    """Only the main process has its records enabled: the others post empty markers, which nobody may wait for."""
    logging.getLogger(LOGGER).setLevel(logging.INFO if r.index == 0 else logging.WARNING)
    slowest = 0.0
    for call in range(1, 4):
        start = time.monotonic()
        r.log.info(f"others_disabled#{call} r{r.index}", in_order=True)
        slowest = max(slowest, time.monotonic() - start)
    r.result("others_disabled", "seconds", round(slowest, 3))
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)


def skips_one(r):
    """Five in_order calls from one call site; rank 1 skips the second (a user error)."""
    for call in range(1, 6):
        if r.index == 1 and call == 2:
            continue
        r.log.info(f"skips_one#{call} r{r.index}", in_order=True)


def never_reached(r):
    """A call site the main process never reaches: those records come out once it makes a call they made after."""
    if r.index != 0:
        r.log.info(f"never_reached#1 r{r.index}", in_order=True)
    r.log.info(f"never_reached#2 r{r.index}", in_order=True)


def killed(r):
    """The last rank is SIGKILLed after call 1; the others go on (run under spawn_ranks: no agent)."""
    r.log.info(f"killed#1 r{r.index}", in_order=True)
    r.all_reduce_sum()
    if r.index == r.size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    r.log.info(f"killed#2 r{r.index}", in_order=True)
    r.log.info(f"killed#3 r{r.index}", in_order=True)
    r.result("killed", "seconds", round(time.monotonic() - start, 3))
    say(f"{DONE} killed r{r.index}")
    return "stop"


def forked(r):
    """Each rank forks a child (as a DataLoader worker does) that logs in_order: the child prints it itself.

    The child has a copy of its parent's store connection; writing to it would corrupt the parent's.
    """
    import multiprocessing

    def work():
        r.log.info(f"forked#1 r{r.index}", in_order=True)

    child = multiprocessing.get_context("fork").Process(target=work)
    child.start()
    child.join(30)
    r.result("forked", "exitcode", child.exitcode)
    r.log.info(f"forked#2 r{r.index}", in_order=True)


def main_first(r):
    """The main process finishes first; the others' later in_order calls are printed by each of them."""
    pids = r.pids()
    r.log.info(f"main_first#1 r{r.index}", in_order=True)
    say(f"{DONE} main_first r{r.index}")
    if r.index == 0:
        return "stop"
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pids[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)  # test side: wait until the main process has really gone
    r.log.info(f"main_first#2 r{r.index}", in_order=True)
    r.log.info(f"main_first#3 r{r.index}", in_order=True)
    return "stop"


class _RepliesLost:
    """A rank's post connection whose next record `compare_set` the server applies, then the reply is lost: it
    raises, and the connection stays failed (as a TCPStore client's does). Everything else passes through."""

    def __init__(self, store, rank):
        self._store, self._rank, self._broken = store, rank, False

    def compare_set(self, key, expected, desired):
        if self._broken:
            raise _connection_error("injected: the store connection is closed")
        answer = self._store.compare_set(key, expected, desired)
        if key.startswith(f"q/{self._rank}/"):  # a record's head (`queues.record_key`), on the rank's own key
            self._broken = True
            raise _connection_error("injected: the connection failed after the server applied compare_set")
        return answer

    def __getattr__(self, name):
        if self._broken:
            raise _connection_error("injected: the store connection is closed")
        return getattr(self._store, name)


def _connection_error(text):
    import torch.distributed as dist

    return getattr(dist, "DistNetworkError", RuntimeError)(text)


def reply_lost(r):
    """Rank 1's second post lands in the store, but its connection fails before the reply: each record once."""
    from accelerate_inorder_fix import testing

    r.log.info(f"reply_lost#1 r{r.index}", in_order=True)
    if r.index == 1:
        outbox = testing.side()._outbox  # the post connection, as the package opened it (private: a test probe)
        outbox.store = _RepliesLost(outbox.store, r.index)
    for call in (2, 3):
        start = time.monotonic()
        r.log.info(f"reply_lost#{call} r{r.index}", in_order=True)
        r.result("reply_lost", f"call{call}", round(time.monotonic() - start, 3))


CASES = {
    f.__name__: f
    for f in (
        plain,
        reply_lost,
        payloads,
        quiet_main,
        main_waits,
        filter_raises,
        threads,
        unrebuildable,
        slow_rank,
        others_disabled,
        skips_one,
        never_reached,
        killed,
        forked,
        main_first,
    )
}


def main(names):
    rank_env = os.environ.get("RANK", "0")
    timeouts = os.environ.get("AIF_RANK_TIMEOUTS")
    if timeouts:
        os.environ["ACCELERATE_INORDER_TIMEOUT"] = timeouts.split(",")[int(rank_env)]

    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix

    state = PartialState(cpu=True)
    configure = os.environ.get("AIF_CONFIGURE_MODE")
    if configure and int(configure.split(":")[0]) == state.process_index:
        accelerate_inorder_fix.configure(mode=configure.split(":")[1])
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{state.process_index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    base.propagate = False
    r = Rank(state.process_index, state.num_processes, get_logger(LOGGER), handler)
    for name in names:
        if CASES[name](r) == "stop":
            return
        r.result(name, "sum", r.all_reduce_sum())
        say(f"{DONE} {name} r{r.index}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
