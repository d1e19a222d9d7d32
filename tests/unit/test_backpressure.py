"""Gather mode's bound on the store: a rank holds at most `queues.BOUND` records there, read or not; past
them its post waits for the main process's next ack (the store's own wait on that key, no polling), at
most T in all, then the rank prints its record itself, said once. Every key of a queue is deleted by the
end of the job, whichever side ends first.

Pure logic on the in-memory store; the same on a real job: tests/jobs/test_gather_backlog.py.
"""

import logging
import re
import threading
import time

import pytest

from accelerate_inorder_fix import _diagnostics, bounds
from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.gather import queues, records
from accelerate_inorder_fix.gather.side import GatherSide
from accelerate_inorder_fix.testing import InMemoryStore


SITE = ("train.py", "step", 7)
RECORD_KEY = re.compile(r"^\d+/\d+$")


def _record(count, rank=1):
    record = logging.LogRecord("aif.unit.bound", logging.INFO, "/job/train.py", 7, f"step {count}", None, None)
    record.__dict__.update(rank=rank, hostname="node-a")
    return record


def _payload(count, rank=1):
    return records.encode((SITE, count), _record(count, rank))


class CountingStore(InMemoryStore):
    """Counts the records in the store after every write; says when a rank waits on an ack."""

    def __init__(self):
        super().__init__(timeout=10.0)
        self.most = 0
        self.waits_on_acks = threading.Event()

    def compare_set(self, key, expected, desired):
        answer = super().compare_set(key, expected, desired)
        with self._changed:
            self.most = max(self.most, sum(1 for k in self.data if RECORD_KEY.match(k)))
        return answer

    def wait(self, keys, timeout=None):
        if all(k.startswith("ack/") for k in keys):
            self.waits_on_acks.set()
        return super().wait(keys, timeout)


def test_the_bound_is_the_documented_one():
    assert queues.BOUND == bounds.GATHER_QUEUE.value == 64
    assert queues.ACK_KEYS > queues.BOUND // queues.PUBLISH_EVERY  # an ack name is never reused while unread


@pytest.mark.parametrize("background", [False, True])
def test_a_rank_far_ahead_of_the_main_process_holds_at_most_the_bound_and_waits_for_its_acks(background):
    """500 posts against a main process that starts reading only once the rank waits: never more than
    `bound` records in the store, each record read once, in order, and the rank waited on an ack key."""
    store, bound, posts = CountingStore(), 16, 500
    outbox = queues.Outbox(store, 1, background=background, bound=bound, timeout=30.0)
    inbox = queues.StoreInbox(store, 2, publish_every=4)
    printed = []

    def rank():
        for count in range(1, posts + 1):
            if outbox.full and not outbox.make_room():
                printed.append(count)
                continue
            assert outbox.post(*_payload(count))

    poster = threading.Thread(target=rank)
    poster.start()
    assert store.waits_on_acks.wait(10)  # the rank is held at its bound before the main process reads
    assert store.most == bound
    counts = []
    for _ in range(posts):
        assert inbox.wait([1], 10)
        identity, record = inbox.take(1)
        counts.append(identity[1])
        inbox.end_call()
    poster.join(10)
    assert counts == list(range(1, posts + 1)) and not printed
    assert store.most <= bound
    assert not outbox.behind  # it waited, and never in vain


def test_a_full_queue_waits_at_most_T_in_all_then_its_rank_prints_its_records_said_once(monkeypatch, capsys):
    """Nobody reads: the first post past the bound waits T, and later ones not at all; each such record is
    printed on its rank, once; one line on its stderr names the call, the rank and what happens."""
    monkeypatch.setattr(_diagnostics, "DIAGNOSTICS", _diagnostics.Diagnostics())
    store, timeout = CountingStore(), 0.4
    side = GatherSide(store, 1, 2, timeout, Origin(1, "node-a", False))
    printed = []
    handler = logging.Handler()
    handler.emit = printed.append
    logger = logging.getLogger("aif.unit.bound")
    logger.addHandler(handler)
    try:
        start = time.monotonic()
        for count in range(1, queues.BOUND + 1):
            side._post((SITE, count), _record(count))
        assert time.monotonic() - start < timeout and not printed  # within the bound: no wait
        for count in range(queues.BOUND + 1, queues.BOUND + 11):
            side._post((SITE, count), _record(count))
        waited = time.monotonic() - start
    finally:
        logger.removeHandler(handler)
    assert timeout <= waited < timeout + 0.3
    assert [r.getMessage() for r in printed] == [f"step {c}" for c in range(queues.BOUND + 1, queues.BOUND + 11)]
    assert store.most == queues.BOUND
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "records in the store" in line]
    assert f"in_order call at train.py:7 in step (call {queues.BOUND + 1} from there): rank 1 holds" in line
    assert "prints this record itself" in line


def test_a_rank_waiting_for_room_goes_on_at_the_main_process_exit():
    """The main process's seal acks what it read: a rank held at its bound wakes at once, meets the
    tombstone at its next post, and prints that record itself."""
    store = CountingStore()
    outbox = queues.Outbox(store, 1, background=False, bound=4, timeout=10.0)
    inbox = queues.StoreInbox(store, 2)
    for count in range(1, 5):
        assert outbox.post(*_payload(count))
    answers = []
    holder = threading.Thread(target=lambda: answers.append((outbox.make_room(), outbox.post(*_payload(5)))))
    holder.start()
    assert store.waits_on_acks.wait(10)
    start = time.monotonic()
    for _ in range(4):
        inbox.take(1)
    assert inbox.seal(1) == []
    holder.join(10)
    assert answers == [(True, False)] and time.monotonic() - start < 2


def _read_all(inbox, rank=1):
    taken = []
    while inbox.ready(rank):
        taken.append(inbox.take(rank))
        inbox.end_call()
    return taken


@pytest.mark.parametrize("first", ["rank", "main"])
def test_every_key_of_a_queue_is_deleted_at_the_end_whichever_side_ends_first(first):
    """After a job's last call both sides end (`Outbox.finish` on the rank, seal and `clear` on the main
    process): the store holds no key of gather mode, in either order, records unread at the end included."""
    store = InMemoryStore()
    outbox = queues.Outbox(store, 1, background=False)
    inbox = queues.StoreInbox(store, 3)  # rank 2 posts nothing: its tombstone is the main process's to leave
    for count in range(1, 31):
        assert outbox.post(*_payload(count))
    assert len(_read_all(inbox)) == 30
    for count in range(31, 36):  # posted after the main process's last call: read at its exit
        assert outbox.post(*_payload(count))
    if first == "rank":
        outbox.finish()
        taken = _read_all(inbox)  # the rest, then the rank's closing marker (no record)
        assert len(taken) == 6 and taken[-1] == (queues.FINISHED, None) and inbox.closed == {1}
    for rank in (1, 2):
        inbox.seal(rank)
    inbox.clear()
    if first == "main":
        assert not outbox.post(*_payload(36))  # sealed: the rank prints it; it deletes the slot it wrote
        outbox.finish()
    left = sorted(k for k in store.data if k != queues.key(2, 0))
    assert left == [], left


def test_the_store_stays_bounded_while_ranks_run_ahead_with_an_ack_every_few_records():
    """Three ranks 300 records ahead, the main process reading with its usual ack rhythm: the store holds at
    most 3 x (BOUND + ACK_KEYS) + SLOTS keys, and nothing once the queues are closed."""
    store, ranks, posts = InMemoryStore(timeout=10.0), 3, 300
    outboxes = [queues.Outbox(store, r, background=False) for r in range(1, ranks + 1)]
    inbox = queues.StoreInbox(store, ranks + 1)
    most = []

    def rank(outbox):
        for count in range(1, posts + 1):
            assert not outbox.full or outbox.make_room()
            assert outbox.post(*_payload(count, outbox.rank))
            most.append(store.num_keys())
        outbox.finish()

    threads = [threading.Thread(target=rank, args=(o,)) for o in outboxes]
    for thread in threads:
        thread.start()
    for _ in range(posts):
        assert inbox.wait(list(range(1, ranks + 1)), 10)
        inbox.take_many(list(range(1, ranks + 1)))
        inbox.end_call()
    for thread in threads:
        thread.join(10)
    assert max(most) <= ranks * (queues.BOUND + queues.ACK_KEYS) + queues.SLOTS
    assert inbox.wait(list(range(1, ranks + 1)), 10)  # the closing markers
    inbox.take_many(list(range(1, ranks + 1)))
    assert inbox.closed == {1, 2, 3}
    for r in range(1, ranks + 1):
        inbox.seal(r)
    inbox.clear()
    assert store.num_keys() == 0, sorted(store.data)


def test_a_full_queue_whose_records_were_read_already_deletes_them_without_waiting():
    """The clean-up thread behind (or stopped, after `release`): the post deletes what the acks it took
    said was read, on its own connection, and waits for no new ack."""
    store = CountingStore()
    outbox = queues.Outbox(store, 1, background=False, clean_every=10**6, bound=8, timeout=10.0)
    inbox = queues.StoreInbox(store, 2)
    inbox.cursor[1] = 2**40
    inbox.publish()  # everything rank 1 will post is read
    start = time.monotonic()
    for count in range(1, 101):
        assert not outbox.full or outbox.make_room()
        assert outbox.post(*_payload(count))
    assert time.monotonic() - start < 5 and not store.waits_on_acks.is_set()
    assert store.most <= 8 and outbox.cleaned >= 92
