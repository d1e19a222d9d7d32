"""Barrier mode's bounds, each at its documented number, run on every rank of a real job (test_barrier_bounds.py).

    torchrun --nproc_per_node 3 bound_ranks.py late_last,junk_first,nested,twins
    torchrun --nproc_per_node 4 bound_ranks.py first_round_skip
    torchrun --nproc_per_node 2 bound_ranks.py stall_after_add
    torchrun --nproc_per_node 4 bound_ranks.py two_dead
    torchrun --nproc_per_node 2 bound_ranks.py signals
    torchrun --nproc_per_node 3 bound_ranks.py late_main

Records are `case#call r<rank> by=r<writer>`; `@@RESULT case r<rank> key=json` lines carry measurements
(`seconds`, the store `keys` of a site, which sites were given up); after each case a checked `all_reduce`,
then `@@DONE case r<rank>`. The last two cases stop ranks mid-call (`stop`): the survivors print their results and
leave with `os._exit(0)` (no collective can follow a death). Environment: `ACCELERATE_INORDER_TIMEOUT`.
"""

import json
import logging
import os
import signal
import sys
import time


LOGGER = "aif.bounds"
T_LATE = 0.25  # of the timeout: how late the last rank comes to the junk case


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def timeout():
    return float(os.environ["ACCELERATE_INORDER_TIMEOUT"])


class Rank:
    def __init__(self, state, log):
        self.index, self.size, self.log, self.state = state.process_index, state.num_processes, log, state

    def result(self, case, key, value):
        say(f"@@RESULT {case} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return value.item()


def checkin():
    """Test-only look inside: this process's check-in (its memory of each site, its store connection)."""
    from accelerate_inorder_fix import testing

    return testing.side().checkin


class SiteState:
    """What the check-in knows of one site: its name in the store, its calls there, whether it is retired."""

    def __init__(self, name, count, retired):
        self.name, self.count, self.retired = name, count, retired


def sites():
    """{(file, function, line): SiteState} of this process's check-in (its history and retired sites)."""
    side, found = checkin(), {}
    for name, (count, _, _) in side.history.items():
        filename, line, function = name.rsplit(":", 2)
        found[(filename, function, int(line))] = SiteState(name, count, name in side.retired)
    return found


def site_of(function):
    """This process's site state for the in_order call inside `function` (by the function's name)."""
    return next(s for site, s in sites().items() if site[1] == function.__name__)


def site_keys(r, function):
    """How many of the site's keys the store holds: its counter, verdicts and handoff keys (the bound: N + 3)."""
    from accelerate_inorder_fix.barrier.checkin import Call

    state = site_of(function)
    calls = [Call(state.name, k) for k in range(1, state.count + 1)]
    keys = [calls[0].counter] + [c.key for c in calls] + [c.handoff(q) for c in calls for q in range(r.size)]
    store = checkin().store
    return sum(bool(store.check([key])) for key in keys)


def retired(r, case, *functions):
    r.result(case, "retired", {f.__name__: site_of(f).retired for f in functions})


def timed(r, case, calls):
    start = time.monotonic()
    calls()
    r.result(case, "seconds", round(time.monotonic() - start, 3))


# -- cases on 3 ranks ----------------------------------------------------------------------------------


def late_last(r):
    """The last rank comes 1.5 T late to call 3 of 4 (given up at T): it is the call's last arrival, and
    still deletes its handoff key of call 1. The site's keys are counted after every rank has left it."""

    def late_last_call(call):
        r.log.info(f"late_last#{call} r{r.index}", in_order=True)

    for call in range(1, 5):
        if r.index == r.size - 1 and call == 3:
            time.sleep(1.5 * timeout())
        late_last_call(call)
    r.all_reduce_sum()
    if r.index == 0:
        r.result("late_last", "keys", site_keys(r, late_last_call))


def first_round_skip(r):
    """An eval loop logging two lines a batch (loss, then lr), 6 batches, no collective between them;
    rank 1 skips loss in batch 1 (an empty batch), before any history. Loss's call 1 is given up (the call rank 0
    waits at in a first-round cycle) and counts as made by rank 1: every later call of both lines goes, each block
    of one batch."""

    def batch_calls(batch):
        if not (r.index == 1 and batch == 1):
            r.log.info(f"first_round_skip#{batch} r{r.index}", in_order=True)
        r.log.info(f"first_round_skip#{100 + batch} r{r.index}", in_order=True)

    timed(r, "first_round_skip", lambda: [batch_calls(batch) for batch in range(1, 7)])
    state = sites()
    r.result(
        "first_round_skip", "retired", sorted(s[2] for s, v in state.items() if v.retired and s[1] == "batch_calls")
    )
    r.result("first_round_skip", "sites", len([s for s in state if s[1] == "batch_calls"]))


def junk_first(r):
    """Junk in the verdict key of call 1 before any rank comes, the last rank a quarter T late: a decided call
    (a damaged skip) costs no rank a wait."""
    from accelerate_inorder_fix import testing
    from accelerate_inorder_fix.barrier import checkin as protocol

    def junk_first_call(call):
        r.log.info(f"junk_first#{call} r{r.index}", in_order=True)

    if r.index == r.size - 1:
        site = (os.path.basename(__file__), junk_first_call.__name__, junk_first_call.__code__.co_firstlineno + 1)
        store = testing.side().checkin.store  # the session's store, under this process group's prefix
        store.set(protocol.Call(protocol.site_name(site), 1).key, b"\x00junk")
    r.all_reduce_sum()
    if r.index == r.size - 1:
        time.sleep(T_LATE * timeout())  # the others come first: the first to read the junk wakes them
    timed(r, "junk_first", lambda: junk_first_call(1))


class Nesting(logging.Handler):
    """A user's handler that logs in_order itself for each record of the outer calls from call 3 on."""

    def __init__(self, r):
        super().__init__()
        self.r = r

    def emit(self, record):
        text = record.getMessage()  # "[RANK r] nested#<call> r<rank>" (no prefix before accelerate 1.13)
        if "nested#" in text and int(text.split("#")[1].split()[0]) >= 3:
            self.inner(int(text.split("#")[1].split()[0]))

    def inner(self, call):
        self.r.log.info(f"inner#{call} r{self.r.index}", in_order=True)


def nested(r):
    """Outer calls 1-5 at one site; from call 3 each rank's handler makes an in_order call of its own in its turn.
    The last rank comes 0.7 T late to call 3, so that its `go` is its own and its turn (and nested call) comes
    after its check-in: the outer call's deletions must still be made. Keys counted at the end."""
    handler = Nesting(r)
    logging.getLogger(LOGGER).addHandler(handler)

    def nested_call(call):
        r.log.info(f"nested#{call} r{r.index}", in_order=True)

    start = time.monotonic()
    for call in range(1, 6):
        if r.index == r.size - 1 and call == 3:
            time.sleep(0.7 * timeout())
        nested_call(call)
    r.result("nested", "seconds", round(time.monotonic() - start, 3))
    logging.getLogger(LOGGER).removeHandler(handler)
    r.all_reduce_sum()
    if r.index == 0:
        r.result("nested", "keys", site_keys(r, nested_call))


def twins(r):
    """A main-only call in twins/a/steps.py and an every-rank call in twins/b/steps.py: one basename, function
    and line. Two sites: the main-only call is given up halfway, the every-rank call goes, 5 steps."""
    from twins.a import steps as main_only
    from twins.b import steps as every_rank

    def loop():
        for step in range(1, 6):
            if r.state.is_main_process:
                main_only.step(r, step)
            every_rank.step(r, step)
            r.all_reduce_sum()

    timed(r, "twins", loop)
    r.result("twins", "sites", sorted(site[0] for site in sites() if site[1] == "step"))


def late_main(r):
    """Rank 0 does main-only work for 1.25 T (a checkpoint, an eval) before a line every rank logs at, then every
    rank makes 6 calls there with no delay: call 1 is given up at T (rank 0's record out at once), calls 2-6 go."""

    def late_main_call(step):
        r.log.info(f"late_main#{step} r{r.index}", in_order=True)

    start = time.monotonic()
    for step in range(1, 7):
        if step == 1 and r.index == 0:
            time.sleep(1.25 * timeout())
        late_main_call(step)
    r.result("late_main", "seconds", round(time.monotonic() - start, 3))


def signals(r):
    """Rank 0 alone makes two in_order calls (at two sites), each waiting T for ranks that never come, with a
    signal in the wait: a Ctrl-C (SIGINT) at T/4 into the first, a SIGCHLD (the handler DataLoader installs for
    the life of the process) at 0.9 T into the second. Results: how long the Ctrl-C took to act, how long the
    second call took."""
    import threading

    def interrupted_call():
        r.log.info(f"signals#1 r{r.index}", in_order=True)

    def sigchld_call():
        r.log.info(f"signals#2 r{r.index}", in_order=True)

    def at(fraction, signum):
        main = threading.get_ident()
        threading.Timer(fraction * timeout(), signal.pthread_kill, (main, signum)).start()

    if r.index == 0:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        before = signal.signal(signal.SIGCHLD, lambda *_: None)
        at(0.25, signal.SIGINT)
        start = time.monotonic()
        try:
            interrupted_call()
        except KeyboardInterrupt:
            r.result("signals", "interrupt", round(time.monotonic() - start - 0.25 * timeout(), 3))
        at(0.9, signal.SIGCHLD)
        timed(r, "signals", sigchld_call)
        signal.signal(signal.SIGCHLD, before)


# -- cases that kill ranks ---------------------------------------------------------------------------


class StopAfter:
    """The store, as rank 0 sees it: the rank stops (dies) right after one write of its check-in of a call:
    its `add` at the counter that makes it the last arrival (before its `go`), or its marker (before its count)."""

    def __init__(self, store, counter, last, marker):
        self.store, self.counter, self.last, self.marker = store, counter, last, marker

    def __getattr__(self, name):
        return getattr(self.store, name)

    def add(self, key, amount):
        value = self.store.add(key, amount)
        if key == self.counter and value == self.last:
            stop()
        return value

    def set(self, key, value):
        self.store.set(key, value)
        if self.marker is not None and value == self.marker:
            stop()


def stall_after_add(r):
    """2 ranks. Rank 0 comes last to call 3 of a site and stops (dies) between its count and its `go`. Rank 1's calls
    from then on (calls 3 and 4 there, two calls at another site) wait 1.75 T in all (bounds.DEATH)."""
    _stall(r, "stall_after_add", after_marker=False)


def stall_after_marker(r):
    """The same, rank 0 stopped between its marker and its count: the call is given up naming nobody."""
    _stall(r, "stall_after_marker", after_marker=True)


def _stall(r, case, after_marker):
    signal.signal(signal.SIGTERM, lambda *_: None)  # the agent's stop when rank 0 dies: finish first

    def stalled_call(call):
        r.log.info(f"{case}#{call} r{r.index}", in_order=True)

    def other_call(call):
        r.log.info(f"{case}#{100 + call} r{r.index}", in_order=True)

    for call in (1, 2):
        stalled_call(call)
    r.all_reduce_sum()
    if r.index == 0:
        side, state = checkin(), site_of(stalled_call)
        marker = f"{state.name}/3" if after_marker else None
        side.store = StopAfter(side.store, f"c/{state.name}", 3 * r.size, marker)
        time.sleep(0.3)  # rank 1 first: rank 0 is the last arrival
    start = time.monotonic()
    for call in (3, 4):
        stalled_call(call)
    for call in (1, 2):
        other_call(call)
    r.result(case, "seconds", round(time.monotonic() - start, 3))
    say(f"@@DONE {case} r{r.index}")
    sys.stderr.flush()
    os._exit(0)


def stop():
    """This rank stops for 4 T (it hangs: to the others, dead), then dies. Dying at once would make the agent
    SIGTERM the others mid-call, which ends their store waits early and blurs what is measured."""
    sys.stdout.flush()
    time.sleep(4 * timeout())
    os._exit(3)


class StopInTurn(logging.Filter):
    def filter(self, record):
        if "#3 " in record.getMessage():
            stop()
        return True


def two_dead(r):
    """4 ranks. Ranks 1 and 3 stop (die) in their turns of call 3: rank 2 names rank 1, takes its turn, and waits for
    rank 3 no longer than its call's bound (bounds.CALL), and names rank 3 too."""
    signal.signal(signal.SIGTERM, lambda *_: None)

    def dead_call(call):
        r.log.info(f"two_dead#{call} r{r.index}", in_order=True)

    for call in (1, 2):
        dead_call(call)
    r.all_reduce_sum()
    if r.index in (1, 3):
        logging.getLogger(LOGGER).handlers[0].addFilter(StopInTurn())
    if r.index == 3:  # the last arrival, after rank 2's halfway look: rank 2 learns the `go` at its deadline
        time.sleep(0.75 * timeout())
    start = time.monotonic()
    dead_call(3)
    r.result("two_dead", "seconds", round(time.monotonic() - start, 3))
    say(f"@@DONE two_dead r{r.index}")
    sys.stderr.flush()
    os._exit(0)


CASES = {
    f.__name__: f
    for f in (
        late_last,
        first_round_skip,
        junk_first,
        nested,
        twins,
        late_main,
        signals,
        stall_after_add,
        stall_after_marker,
        two_dead,
    )
}


def main(names):
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s by=r{state.process_index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    rank = Rank(state, get_logger(LOGGER))
    for name in names:
        CASES[name](rank)
        rank.result(name, "sum", rank.all_reduce_sum())
        say(f"@@DONE {name} r{rank.index}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
