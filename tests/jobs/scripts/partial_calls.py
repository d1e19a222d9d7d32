"""in_order calls that not every rank makes, run on every rank of a real job (tests/jobs/test_barrier_checkin.py).

    torchrun --nproc_per_node 4 partial_calls.py main_only_hidden

Each case makes in_order calls whose messages name the case, the call and the rank
(`case#call r<rank>`); every record line ends with ` by=r<k>`, the rank of the process that wrote it.
After each case a checked `all_reduce` shows whether any rank skipped or added a barrier (a hang, or a
wrong sum), then `@@DONE case r<rank>`; `@@RESULT case r<rank> key=json` lines carry measurements.

The package is imported explicitly (the test-suite keeps the start-up hook off). Environment:
`ACCELERATE_INORDER_TIMEOUT` (the tests use 3), `AIF_CASE_LOOPS` (calls of the main-only loop, 20),
`AIF_NO_CHECKIN=1` (every call's check-in answers "plain barriers" at once: barrier mode as before it).
"""

import json
import logging
import os
import sys
import threading
import time


LOGGER = "aif.partial"
LOOPS = int(os.environ.get("AIF_CASE_LOOPS", "20"))


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


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

    def ordered_calls(self, log_one, first, last):
        """`log_one(call)` (an in_order call on a line of the case's own) for `first`..`last`, the low ranks
        latest (unordered output would show)."""
        for call in range(first, last + 1):
            time.sleep(0.05 * (self.size - 1 - self.index))
            log_one(call)

    def verdicts(self, case, *functions):
        """Whether each site in `functions` was given up on this rank (the one verdict every rank must share)."""
        from accelerate_inorder_fix import testing

        side = getattr(testing.side(), "checkin", None)  # the check-in's memory of each site
        sites = {} if side is None else {name.rsplit(":", 1)[1]: name in side.retired for name in side.history}
        self.result(case, "retired", {f.__name__: sites.get(f.__name__) for f in functions})


def _timed(r, case, calls):
    start = time.monotonic()
    calls()
    r.result(case, "seconds", round(time.monotonic() - start, 3))


def _timeout():
    return float(os.environ["ACCELERATE_INORDER_TIMEOUT"])


# Each case has in_order call sites of its own (a site that diverged stays unordered for the rest of the
# job): the calls are on lines of the case's own functions.


def main_only_hidden(r):
    """`if is_main_process: logger.debug(..., in_order=True)` at INFO level in a loop, then ordinary calls."""

    def calls():
        for call in range(1, LOOPS + 1):
            if r.state.is_main_process:
                r.log.debug(f"main_only_hidden#{call} r{r.index}", in_order=True)

    def after(call):
        r.log.info(f"main_only_hidden#{call} r{r.index}", in_order=True)

    _timed(r, "main_only_hidden", calls)
    r.ordered_calls(after, LOOPS + 1, LOOPS + 5)


def main_only_shown(r):
    """The same at an enabled level: rank 0 prints each of its records."""

    def calls():
        for call in range(1, LOOPS + 1):
            if r.state.is_main_process:
                r.log.info(f"main_only_shown#{call} r{r.index}", in_order=True)

    def after(call):
        r.log.info(f"main_only_shown#{call} r{r.index}", in_order=True)

    _timed(r, "main_only_shown", calls)
    r.ordered_calls(after, LOOPS + 1, LOOPS + 5)


def skip_one(r):
    """The last rank skips call 2 of 10 at one call site (no collective between the calls)."""

    def calls():
        for call in range(1, 11):
            if not (r.index == r.size - 1 and call == 2):
                r.log.info(f"skip_one#{call} r{r.index}", in_order=True)

    _timed(r, "skip_one", calls)


def late_rank(r):
    """The last rank arrives 0.6 x the timeout late: still in time, so ordered, with no warning."""

    def late_one(call):
        r.log.info(f"late_rank#{call} r{r.index}", in_order=True)

    if r.index == r.size - 1:
        time.sleep(0.6 * _timeout())
    r.ordered_calls(late_one, 1, 1)


def skip_in_loop(r):
    """Outcome b, one site: the last rank skips its call at step 2 of 12; an all_reduce ends each step."""

    def loss(step):
        r.log.info(f"skip_in_loop#{step} r{r.index}", in_order=True)

    _loop(r, "skip_in_loop", [loss], skip=(r.size - 1, 2, loss))


def skip_in_loop_two_sites(r):
    """Outcome b, two sites (loss, then lr): the last rank skips its loss call at step 2 of 12."""

    def loss(step):
        r.log.info(f"skip_in_loop_two_sites#{step} r{r.index}", in_order=True)

    def lr(step):
        r.log.info(f"skip_in_loop_two_sites#{100 + step} r{r.index}", in_order=True)

    _loop(r, "skip_in_loop_two_sites", [loss, lr], skip=(r.size - 1, 2, loss))


def _loop(r, case, sites, skip, steps=12):
    """`steps` steps of `sites` calls and a checked all_reduce; one rank skips one call. Results: seconds of
    the loop, steps whose sum was wrong, and whether each site was given up on this rank."""
    wrong = 0
    start = time.monotonic()
    for step in range(1, steps + 1):
        for site in sites:
            if (r.index, step, site) != skip:
                site(step)
        wrong += r.all_reduce_sum() != r.size * (r.size + 1) / 2
    r.result(case, "seconds", round(time.monotonic() - start, 3))
    r.result(case, "wrong_sums", wrong)
    r.verdicts(case, *sites)


def late_first(r):
    """Outcome c: rank 1 comes 1.5 x the timeout late to the first of 5 calls at one site."""

    def late_first_call(call):
        r.log.info(f"late_first#{call} r{r.index}", in_order=True)

    if r.index == 1:
        time.sleep(1.5 * _timeout())
    _timed(r, "late_first", lambda: [late_first_call(call) for call in range(1, 6)])


def _junk(r, case, key_of, log_one):
    """Outcome e: the last rank, late, writes junk into a check-in key of call 1 while the others wait, then
    makes the call itself."""
    from accelerate_inorder_fix import testing
    from accelerate_inorder_fix.barrier import checkin
    from accelerate_inorder_fix.store import connection

    if r.index == r.size - 1:
        time.sleep(_timeout() / 3)
        site = (os.path.basename(__file__), log_one.__name__, log_one.__code__.co_firstlineno + 1)
        key = key_of(checkin.Call(checkin.site_name(site), 1))
        session = testing.side().checkin.store  # the session's store, under this process group's prefix
        # a client of its own under that prefix: the rank's own may have failed (junk_counter's `add` on junk
        # closes it, and barrier mode does not reconnect)
        store = connection.Connection(session.store, session.prefix, session.timeout)
        store.set(key, b"\x00junk")
    _timed(r, case, lambda: log_one(1))
    r.verdicts(case, log_one)


def junk_counter(r):
    def junk_counter_call(call):
        r.log.info(f"junk_counter#{call} r{r.index}", in_order=True)

    _junk(r, "junk_counter", lambda c: c.counter, junk_counter_call)


def junk_verdict(r):
    def junk_verdict_call(call):
        r.log.info(f"junk_verdict#{call} r{r.index}", in_order=True)

    _junk(r, "junk_verdict", lambda c: c.key, junk_verdict_call)


def junk_marker(r):
    def junk_marker_call(call):
        r.log.info(f"junk_marker#{call} r{r.index}", in_order=True)

    _junk(r, "junk_marker", lambda c: "w/0", junk_marker_call)


def clock_step(r):
    """Outcome g: the wall clock steps 5 timeouts back, then forward, while ranks wait for the last rank,
    which skips both calls."""
    real = time.time
    for shift, log_one in ((-5.0, _clock_back), (5.0, _clock_forward)):
        offset = [0.0]
        time.time = lambda: real() + offset[0]
        timer = threading.Timer(_timeout() / 4, lambda s=shift: offset.__setitem__(0, s * _timeout()))
        timer.start()
        if r.index != r.size - 1:
            _timed(r, f"clock_step_{log_one.__name__}", lambda f=log_one: f(r))
        timer.join()
        time.time = real
    r.result("clock_step", "jumped", True)


def _clock_back(r):
    r.log.info(f"clock_step#1 r{r.index}", in_order=True)


def _clock_forward(r):
    r.log.info(f"clock_step#2 r{r.index}", in_order=True)


def main_only_before_all(r):
    """Outcome d (2 ranks): a main-only call, then an every-rank call, 10 times, on 6 placements of the two
    call sites (0-5 lines apart, in that order in the file), each pair of sites its own."""
    for offset in range(6):
        source = "\n" * (200 + 20 * offset) + PAIR.format(pad="\n" * offset)
        namespace = {}
        exec(compile(source, __file__, "exec"), namespace)
        case = f"main_only_before_all_{offset}"
        _timed(r, case, lambda: namespace["pair"](r, case))
        r.result(case, "sum", r.all_reduce_sum())


PAIR = """
def pair(r, case):
    for call in range(1, 11):
        if r.state.is_main_process:
            r.log.info(f"{{case}}#{{call}} r{{r.index}}", in_order=True)
{pad}
        r.log.info(f"{{case}}#{{100 + call}} r{{r.index}}", in_order=True)
"""


def old_store_api(r):
    """Outcome f: the store without `clone` and `append` (torch before 2.8 and 2.0): a main-only call, then
    ordered calls, and the process group's own store timeout as before."""
    from torch.distributed import distributed_c10d

    before = distributed_c10d._get_default_store().timeout.total_seconds()

    def hidden(call):
        r.log.info(f"old_store_api#{call} r{r.index}", in_order=True)

    def after(call):
        r.log.info(f"old_store_api#{call} r{r.index}", in_order=True)

    def calls():
        if r.state.is_main_process:
            hidden(1)

    _timed(r, "old_store_api", calls)
    r.ordered_calls(after, 2, 4)
    after_seconds = distributed_c10d._get_default_store().timeout.total_seconds()
    r.result("old_store_api", "store_timeout", [before, after_seconds])


def switch(r):
    """Rank 3 alone asks for gather mode before the first call (overruled); then every rank asks for gather and
    back, after the job's mode was fixed (when its process group started): said once a rank, not taken."""
    import accelerate_inorder_fix

    def first(call):
        r.log.info(f"switch#{call} r{r.index}", in_order=True)

    def gathered(call):
        r.log.info(f"switch#{call} r{r.index}", in_order=True)

    def back(call):
        r.log.info(f"switch#{call} r{r.index}", in_order=True)

    if r.index == 3:
        accelerate_inorder_fix.configure(mode="gather")
    r.ordered_calls(first, 1, 2)
    accelerate_inorder_fix.configure(mode="gather")
    r.ordered_calls(gathered, 3, 4)
    accelerate_inorder_fix.configure(mode="barrier")
    r.ordered_calls(back, 5, 6)


CASES = {
    f.__name__: f
    for f in (
        main_only_hidden,
        main_only_shown,
        late_rank,
        skip_one,
        skip_in_loop,
        skip_in_loop_two_sites,
        late_first,
        junk_counter,
        junk_verdict,
        junk_marker,
        clock_step,
        main_only_before_all,
        old_store_api,
        switch,
    )
}


def _without_clone_and_append():
    """torch's stores as before 2.8 (no `clone`) and 2.0 (no `append`): the methods taken off their classes."""
    import torch.distributed as dist

    for cls in {dist.Store, dist.TCPStore, dist.PrefixStore, dist.FileStore, dist.HashStore}:
        for name in ("clone", "append"):
            if name in vars(cls):
                delattr(cls, name)
    assert not hasattr(dist.TCPStore, "clone") and not hasattr(dist.TCPStore, "append")


def main(names):
    from accelerate import PartialState

    import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    if os.environ.get("AIF_OLD_STORE") == "1":
        _without_clone_and_append()
    if os.environ.get("AIF_NO_CHECKIN") == "1":
        from accelerate_inorder_fix.barrier.side import BarrierSide
        from accelerate_inorder_fix.barrier.turns import PlainBarriers
        from accelerate_inorder_fix.session import InOrderSession

        chosen = InOrderSession.side

        def plain_barriers(self, state, settings, call):  # the mode still agreed; its check-in never made
            side = chosen(self, state, settings, call)
            return PlainBarriers(state) if isinstance(side, BarrierSide) else side

        InOrderSession.side = plain_barriers
    from accelerate.logging import get_logger

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{state.process_index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    rank = Rank(state, get_logger(LOGGER))
    say(f"@@START r{rank.index}")  # a job silent from here on is a hung one (the test's stall)
    for name in names:
        CASES[name](rank)
        rank.result(name, "sum", rank.all_reduce_sum())
        say(f"@@DONE {name} r{rank.index}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
