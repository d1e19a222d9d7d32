"""The main process's collector and the store protocol, on an in-memory store (pure logic, no ranks).

Every path the collector's docstring names: a block in rank order from one batched read; a late record
for a closed call, emitted alone; a call the main process never makes, flushed at exit; an absent rank
not waited for until it posts again; the deadline. Then the bound on the store's size, the fallback
for stores without `multi_get`, and a property test over random arrival orders, lateness and absences.
"""

import logging
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import queues, records
from accelerate_inorder_fix.testing import InMemoryStore, UnbatchedInMemoryStore


LOGGER = "aif.test.collector"
SITE, OTHER = ("train.py", "step", 10), ("train.py", "eval_only_on_ranks", 20)
SLACK = 0.5  # scheduling noise allowed past a deadline on a loaded CI machine


class Emitted(logging.Handler):
    """The main process's handler: what was emitted, tagged with the phase the test is in."""

    def __init__(self):
        super().__init__()
        self.phase = None
        self.seen = []  # (phase, site, count, rank)

    def emit(self, record):
        self.seen.append((self.phase, tuple(record.site), record.count, record.rank))


def _record(site, count, rank):
    record = logging.LogRecord(LOGGER, logging.INFO, site[0], site[2], f"{site}#{count} r{rank}", None, None)
    # A list: records travel as JSON data, where a tuple would arrive as its repr.
    record.site, record.count, record.rank, record.hostname = list(site), count, rank, "node-a"
    return record


class Job:
    """One main process (a Collector) and `world_size - 1` ranks (Outboxes) on one store."""

    def __init__(self, world_size, timeout=0.2, store=None, publish_every=None, clean_every=None):
        self.store = store if store is not None else InMemoryStore()
        self.warnings = []
        inbox = queues.StoreInbox(self.store, world_size, publish_every or queues.PUBLISH_EVERY)
        self.collector = _collector.Collector(inbox, world_size, timeout, self.warnings.append)
        self.outboxes = {
            r: queues.Outbox(self.store, r, clean_every or queues.CLEAN_EVERY, background=False)
            for r in range(1, world_size)
        }
        self.handler = Emitted()
        logger = logging.getLogger(LOGGER)
        logger.handlers[:] = [self.handler]
        logger.propagate = False

    def post(self, rank, site, count, dropped=False):
        record = None if dropped else _record(site, count, rank)
        self.outboxes[rank].post(*records.encode((site, count), record))  # as the session posts: deltas too

    def call(self, count, site=SITE, own=True):
        """The main process's call; returns how long it took."""
        self.handler.phase = ("block", site, count)
        start = time.monotonic()
        self.collector.emit_call((site, count), _record(site, count, 0) if own else None)
        return time.monotonic() - start

    def flush(self):
        self.handler.phase = ("flush",)
        self.collector.flush()

    def during(self, phase):
        return [(site, count, rank) for p, site, count, rank in self.handler.seen if p == phase]


def test_block_in_rank_order_from_one_slot_read_without_waiting():
    job = Job(4)
    for rank in (3, 1, 2):
        job.post(rank, SITE, 1)
    job.store.calls.clear()
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(4)]
    # every record's copy is in the shared slot: read (a compare_set that changes nothing), emptied
    assert job.store.calls == [("compare_set", 1), ("compare_set", 1)]
    assert job.store.data[queues.slot_key(0)] == b"" and not job.warnings


def test_a_copy_appended_while_its_slot_is_read_is_taken_from_the_slot():
    job = Job(4)
    for rank in (1, 2):
        job.post(rank, SITE, 1)
    swap = job.store.compare_set

    def late_append(key, expected, desired):  # rank 3 posts between the main process's read and its swap
        if desired == b"" and not late:
            late.append(job.post(3, SITE, 1))
        return swap(key, expected, desired)

    late = []
    job.store.compare_set = late_append
    job.store.calls.clear()
    job.call(1)
    assert late and job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(4)]
    # no record read from its key (a delete would have taken rank 3's copy): the slot gave all three
    assert not [c for c in job.store.calls if c[0] in ("multi_get", "get", "wait")] and not job.warnings


def test_a_slot_appended_to_faster_than_it_can_be_emptied_loses_no_copy():
    # 1,024 ranks posting one call append to its slot faster than a round trip: every swap of the main
    # process fails. The slot is then left as read (a delete lost the copies appended after the last read).
    job = Job(7)
    job.post(1, SITE, 1)
    swap, swaps = job.store.compare_set, []

    def appended_meanwhile(key, expected, desired):
        if desired != b"" or len(swaps) >= queues.EMPTY_TRIES:
            return swap(key, expected, desired)
        swaps.append(key)
        job.post(1 + len(swaps), SITE, 1)  # ranks 2..5: each swap fails
        answer = swap(key, expected, desired)
        if len(swaps) == queues.EMPTY_TRIES:
            job.post(6, SITE, 1)  # after the last failed swap's answer: read by no swap
        return answer

    job.store.compare_set = appended_meanwhile
    job.store.calls.clear()
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(7)]
    assert not [c for c in job.store.calls if c[0] in ("multi_get", "get", "delete_key")] and not job.warnings
    # rank 6's copy came from the slot's next read (waiting for rank 6), which emptied it
    assert job.store.data[queues.slot_key(0)] == b"" and not job.collector.source.unemptied


def test_ranks_running_a_bound_ahead_give_every_record_from_its_copy():
    # Ranks that do not wait for the main process run up to BOUND records ahead: a slot then holds
    # copies of several of their places (n, n + SLOTS, ...), read at once; each is kept, none re-read from its key.
    job = Job(3)
    ahead = queues.BOUND - 1
    for count in range(1, ahead + 1):
        for rank in (1, 2):
            job.post(rank, SITE, count)
    job.store.calls.clear()
    for count in range(1, ahead + 1):
        job.call(count)
    assert [job.during(("block", SITE, c)) for c in range(1, ahead + 1)] == [
        [(SITE, c, r) for r in range(3)] for c in range(1, ahead + 1)
    ]
    assert not [c for c in job.store.calls if c[0] in ("multi_get", "get", "wait")] and not job.warnings


def test_record_whose_copy_is_gone_or_damaged_comes_from_its_own_key():
    job = Job(4)
    for rank in (1, 2, 3):
        job.post(rank, SITE, 1)
    job.store.data[queues.slot_key(0)] = (
        b"[1,0,[2, damaged]]\n"  # rank 1's copy: damaged; rank 2's: missing; rank 3's: intact
        + b"not a copy\n"
        + job.store.data[queues.slot_key(0)].split(b"\n")[2]
        + b"\n"
    )
    job.store.calls.clear()
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(4)]
    assert ("multi_get", 2) in job.store.calls and not job.warnings


class StoreWithoutAppend(InMemoryStore):
    append = None  # as torch releases before `Store.append`


@pytest.mark.parametrize(
    "store_type, reads",
    [(StoreWithoutAppend, [("multi_get", 3)]), (UnbatchedInMemoryStore, [("get", 1)] * 3)],
    ids=["without append", "without append or multi_get"],
)
def test_older_stores_give_the_same_blocks_from_the_keys(store_type, reads):
    job = Job(4, store=store_type())
    for rank in (2, 3, 1):
        job.post(rank, SITE, 1)
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(4)]
    assert [c for c in job.store.calls if c[0] in ("get", "multi_get")] == reads
    assert not any(k.startswith("slot/") for k in job.store.data)


def test_rank_dropped_record_is_a_marker_not_a_wait():
    job = Job(3, timeout=5.0)
    job.post(1, SITE, 1, dropped=True)
    job.post(2, SITE, 1)
    assert job.call(1) < 1.0
    assert job.during(("block", SITE, 1)) == [(SITE, 1, 0), (SITE, 1, 2)]


def test_deadline_bounds_the_wait_and_names_the_missing_rank():
    job = Job(3, timeout=0.2)
    job.post(2, SITE, 1)
    took = job.call(1)
    assert 0.2 <= took < 0.2 + SLACK
    assert job.during(("block", SITE, 1)) == [(SITE, 1, 0), (SITE, 1, 2)]
    assert len(job.warnings) == 1 and "rank 1 sent no record within 0.2 s" in job.warnings[0]


def test_record_arriving_during_the_wait_is_in_its_block():
    job = Job(3, timeout=5.0)
    job.post(1, SITE, 1)
    poster = threading.Timer(0.05, job.post, (2, SITE, 1))
    poster.start()
    took = job.call(1)
    poster.join()
    assert took < 5.0
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(3)]


def test_late_record_for_a_closed_call_is_emitted_alone():
    job = Job(3, timeout=0.1)
    job.post(1, SITE, 1)
    job.call(1)  # rank 2 misses the deadline
    job.post(2, SITE, 1)  # ... and its record arrives late
    for rank in (1, 2):
        job.post(rank, SITE, 2)
    job.call(2)
    assert job.during(("block", SITE, 2)) == [(SITE, 1, 2)] + [(SITE, 2, r) for r in range(3)]
    job.flush()
    assert job.during(("flush",)) == []
    assert [s for s in job.handler.seen if s[1:] == (SITE, 1, 2)] == [(("block", SITE, 2), SITE, 1, 2)]


def test_call_the_main_process_never_makes_is_flushed_at_exit():
    job = Job(3, timeout=0.5)
    job.post(1, OTHER, 1)  # `if not is_main_process: logger.info(..., in_order=True)`
    job.post(2, OTHER, 1)
    for rank in (1, 2):
        job.post(rank, SITE, 1)
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, r) for r in range(3)]
    job.post(2, OTHER, 2)
    job.flush()
    assert sorted(job.during(("flush",))) == [(OTHER, 1, 1), (OTHER, 1, 2), (OTHER, 2, 2)]
    assert "never made" in job.warnings[-1] and "rank(s) 1, 2" in job.warnings[-1]


def test_a_site_only_other_ranks_call_is_emitted_within_a_timeout_and_keeps_the_state_bounded():
    """`if not is_main_process: logger.info(..., in_order=True)` next to an every-rank call, for many steps."""
    timeout = 0.1
    job = Job(3, timeout=timeout)
    steps = 60
    largest = 0
    for step in range(1, steps + 1):
        for rank in (1, 2):
            job.post(rank, OTHER, step)
            job.post(rank, SITE, step)
        job.call(step)
        largest = max(largest, len(job.collector.pending))
        if step == 3:
            time.sleep(timeout)  # the kept records of OTHER are now a whole timeout old
    emitted = [(site, count, rank) for _, site, count, rank in job.handler.seen if site == OTHER]
    assert sorted(emitted) == [(OTHER, c, r) for c in range(1, steps + 1) for r in (1, 2)]  # before exit
    assert largest <= 2 * 4 and job.collector.pending == {}  # f0a0bfc: one entry per step, 60 at the end
    said = [w for w in job.warnings if "eval_only_on_ranks" in w]
    assert len(said) == 1 and "ranks 1, 2 made it and the main process has not" in said[0], job.warnings
    for step in range(1, steps + 1):
        assert (SITE, step, 0) in job.during(("block", SITE, step))
    job.flush()
    assert job.during(("flush",)) == [] and not any("never made" in w for w in job.warnings)


def test_records_found_while_a_main_only_call_waits_are_not_aged_by_that_wait(monkeypatch):
    """The main process waits a whole timeout in a call only it makes (`if is_main_process:
    logger.info(..., in_order=True)`); meanwhile the others post their next call's records. Timed from
    when they were found, they were a timeout old by the end of that call and went out as others-only,
    and the main process's own call there then waited once more for them (the c10d-warnings job test's 4 lines)."""
    now = [0.0]
    monkeypatch.setattr(_collector, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    job = Job(3, timeout=0.5)
    wait = job.collector.source.wait

    def others_post_then_time_runs_out(ranks, seconds):
        if not job.handler.seen and (OTHER, 1) not in job.collector.pending:
            for rank in (1, 2):
                job.post(rank, OTHER, 1)  # found by this wait: kept for OTHER, which the main process calls next
            return wait(ranks, seconds)
        now[0] += seconds  # nothing more comes: the main-only call waits its whole timeout
        return False

    job.collector.source.wait = others_post_then_time_runs_out
    job.call(1)  # only the main process calls at SITE
    assert (OTHER, 1) in job.collector.pending and job.during(("block", SITE, 1)) == [(SITE, 1, 0)]
    job.call(1, site=OTHER)
    assert job.during(("block", OTHER, 1)) == [(OTHER, 1, r) for r in range(3)]
    assert not any("has not within" in w for w in job.warnings) and len(job.warnings) == 1, job.warnings


def test_absent_rank_is_not_waited_for_until_it_posts_again():
    job = Job(3, timeout=0.3)
    job.post(1, SITE, 1)
    assert job.call(1) >= 0.3  # rank 2 has gone quiet: one timeout
    job.post(1, SITE, 2)
    assert job.call(2) < 0.15  # absent: not waited for, and no second warning
    assert len(job.warnings) == 1
    for count in (2, 3):  # it comes back: a late record, then one in time
        job.post(2, SITE, count)
    job.post(1, SITE, 3)
    job.call(3)
    assert job.during(("block", SITE, 3)) == [(SITE, 2, 2)] + [(SITE, 3, r) for r in range(3)]
    job.post(1, SITE, 4)
    poster = threading.Timer(0.05, job.post, (2, SITE, 4))
    poster.start()
    job.call(4)  # waited for again
    poster.join()
    assert job.during(("block", SITE, 4)) == [(SITE, 4, r) for r in range(3)]
    assert len(job.warnings) == 1


def test_store_size_stays_bounded_whatever_the_number_of_calls():
    world_size = 4
    job = Job(world_size, timeout=1.0)
    # A rank's records read but not yet cleaned lag its posts by at most a clean-up's and an ack's
    # interval; its acks not yet taken are those written between two clean-ups; and the slots (emptied, kept).
    per_rank = queues.CLEAN_EVERY + queues.PUBLISH_EVERY + queues.CLEAN_EVERY // queues.PUBLISH_EVERY + 1
    bound = queues.SLOTS + (world_size - 1) * per_rank
    sizes = []
    for count in range(1, 401):
        for rank in range(1, world_size):
            job.post(rank, SITE, count)
        job.call(count)
        sizes.append(job.store.num_keys())
    assert max(sizes) <= bound, (max(sizes), bound)
    assert max(sizes[200:]) <= max(sizes[:200])
    assert len(job.handler.seen) == 400 * world_size


def test_rank_deletes_only_what_the_main_process_has_read():
    job = Job(2, timeout=0.2, publish_every=1, clean_every=1)
    for count in range(1, 6):  # the rank runs ahead of the main process
        job.post(1, SITE, count)
    job.call(1)
    job.post(1, SITE, 6)  # cleans up: only record 1 is read
    assert _queues(job) == sorted(queues.key(1, n) for n in range(1, 6))  # the ack, taken, is deleted too
    for count in range(2, 7):
        assert job.call(count) < 0.2
    assert len(job.handler.seen) == 12 and not job.warnings


def test_failed_clean_up_does_not_fail_the_post_and_is_retried():
    job = Job(2, timeout=0.2, publish_every=1, clean_every=1)
    job.post(1, SITE, 1)
    job.call(1)
    real_delete = job.store.delete_key
    job.store.delete_key = lambda key: (_ for _ in ()).throw(RuntimeError("store hiccup"))
    job.post(1, SITE, 2)  # delivered, although its clean-up failed
    job.store.delete_key = real_delete
    job.call(2)
    job.post(1, SITE, 3)  # cleans up records 1 and 2
    assert _queues(job) == [queues.key(1, 2)]
    assert len(job.handler.seen) == 4 and not job.warnings


def _queues(job):
    """The store's keys but the slots (copies, read and deleted by the main process)."""
    return sorted(k for k in job.store.data if not k.startswith("slot/"))


def test_main_process_empties_only_the_slot_it_read_and_publishes_rarely():
    job = Job(3)
    for count in range(1, 33):
        for rank in (1, 2):
            job.post(rank, SITE, count)
        job.store.calls.clear()
        job.call(count)
        calls = [c[0] for c in job.store.calls]
        assert set(calls) <= {"compare_set", "multi_set", "wait"}
        assert calls.count("compare_set") == 2  # the slot, read and emptied
        assert calls.count("multi_set") == (1 if count % queues.PUBLISH_EVERY == 0 else 0)  # both ranks' acks


def test_bad_record_in_a_batch_costs_only_itself():
    job = Job(4, timeout=0.2)
    job.post(1, SITE, 1)
    job.outboxes[2].post(b"not a record")
    job.post(3, SITE, 1)
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, 0), (SITE, 1, 1), (SITE, 1, 3)]
    assert job.warnings  # the bad record is reported, whatever the codec says about it


def test_store_that_fails_costs_the_block_not_the_call():
    job = Job(3)

    def broken(*args, **kwargs):
        raise OSError("connection reset")

    job.store.wait = broken
    job.call(1)
    assert job.during(("block", SITE, 1)) == [(SITE, 1, 0)]
    assert "could not read the other ranks' records" in job.warnings[0]


# -- property: random arrival orders, lateness and absences ---------------------------------------

FATES = ("on_time", "late", "skip", "dropped")


@st.composite
def schedules(draw):
    world_size = draw(st.integers(2, 5))
    calls = draw(st.integers(1, 4))
    fates = {
        (rank, count): draw(st.sampled_from(FATES)) for rank in range(1, world_size) for count in range(1, calls + 1)
    }
    extras = draw(st.lists(st.tuples(st.integers(1, world_size - 1), st.integers(0, 2 * calls)), max_size=4))
    shuffle = draw(st.randoms(use_true_random=False))
    intervals = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))  # publish_every, clean_every
    return world_size, calls, fates, extras, shuffle, intervals


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_every_record_exactly_once_blocks_in_rank_order_waits_bounded(schedule):
    world_size, calls, fates, extras, shuffle, (publish_every, clean_every) = schedule
    timeout = 0.02
    job = Job(world_size, timeout=timeout, publish_every=publish_every, clean_every=clean_every)
    # A post happens in a slot: 2(c-1) is before the main process's call c, 2(c-1)+1 after it.
    posts = []
    for (rank, count), fate in fates.items():
        if fate != "skip":
            posts.append((2 * (count - 1) + (fate == "late"), rank, SITE, count, fate == "dropped"))
    extra_counts = {}
    for rank, slot in sorted(extras):
        extra_counts[rank] = extra_counts.get(rank, 0) + 1
        posts.append((slot, rank, OTHER, extra_counts[rank], False))
    shuffle.shuffle(posts)  # any order across ranks; each rank's own order is its program order below
    posts.sort(key=lambda p: (p[0], p[2] == OTHER and p[3] or 0))

    def post_slot(slot):
        for _, rank, site, count, dropped in [p for p in posts if p[0] == slot]:
            job.post(rank, site, count, dropped)

    for count in range(1, calls + 1):
        post_slot(2 * (count - 1))
        assert job.call(count) <= timeout + SLACK
        post_slot(2 * (count - 1) + 1)
    post_slot(2 * calls)
    job.flush()

    expected = {(SITE, c, 0) for c in range(1, calls + 1)}
    expected |= {(site, count, rank) for _, rank, site, count, dropped in posts if not dropped}
    emitted = [(site, count, rank) for _, site, count, rank in job.handler.seen]
    assert sorted(emitted) == sorted(expected)  # each exactly once
    for count in range(1, calls + 1):
        phase = job.during(("block", SITE, count))
        own = [i for i, (site, c, _) in enumerate(phase) if (site, c) == (SITE, count)]
        ranks = [phase[i][2] for i in own]
        assert own == list(range(own[0], own[0] + len(own))), phase  # one contiguous block ...
        assert ranks == sorted(ranks) and ranks[0] == 0, phase  # ... in rank order, main process first
        on_time = {r for (r, c), fate in fates.items() if c == count and fate == "on_time"}
        assert on_time <= set(ranks), (on_time, phase)
    # Records of the site the main process never calls from come out once each (above): at exit, or earlier
    # once kept a whole timeout (others-only), never inside a block (each block is contiguous, above).


@pytest.fixture(autouse=True)
def _quiet_logger():
    yield
    logging.getLogger(LOGGER).handlers[:] = []


def test_exit_warning_summarises_calls_the_main_process_never_made_in_a_few_lines():
    """Before, one line listing every call: 729,000 characters at 10,000 calls."""
    job = Job(3, timeout=0.5)
    sites = [("train.py", f"only_others_{n}", 100 + n) for n in range(7)]
    for count in range(1, 1001):
        for rank in (1, 2):
            job.post(rank, sites[0], count)
    for site in sites[1:]:
        job.post(1, site, 1)
    job.flush()
    assert len(job.during(("flush",))) == 2000 + 6
    summary = job.warnings[-1]
    lines = summary.splitlines()
    assert len(summary) < 1000 and len(lines) == 1 + _collector.SUMMARY_SITES + 1, summary
    assert lines[0].startswith("records of 1006 in_order call(s) the main process never made were emitted at exit")
    assert lines[1] == "  train.py:100 in only_others_0: 1000 call(s) from rank(s) 1, 2 (calls 1, 2, 3, ...)"
    assert lines[2] == "  train.py:101 in only_others_1: 1 call(s) from rank(s) 1 (calls 1)"
    assert lines[-1] == "  and 2 more call site(s)"
