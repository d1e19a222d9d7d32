"""Copies in the shared slots: a whole call's records in one read, never the only copy.

Pure logic, in-process: a delta copy gives exactly the record the rank's own key holds; a copy that
cannot give it (damaged, foreign, its base not read) is not used, so the record comes from the key;
and a rank's clean-up runs off its posts.
"""

import json
import logging
import threading
import time

import pytest

from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import copies, queues, records
from accelerate_inorder_fix.testing import InMemoryStore


SITE = ("train.py", "step", 7)


def _record(count, rank, **attributes):
    record = logging.LogRecord(
        "aif.unit.copies", logging.INFO, "/job/train.py", 7, f"step {count} r{rank}", None, None
    )
    record.__dict__.update(rank=rank, hostname="node-a", **attributes)
    return record


def _line(copier, n, record, count=None):
    """The record's payload, and its copy as the main process reads it from a slot."""
    payload, document = records.encode((SITE, n + 1 if count is None else count), record)
    (copy,) = copies.parse_slot(copier.line(n, payload, document), copier.rank + 1)
    return payload, copy


def test_a_rank_sends_a_full_copy_then_deltas_until_something_else_changes():
    copier = copies.Copier(1, refresh=16)
    sizes = [len(_line(copier, n, _record(n, 1, epoch=0 if n < 3 else 1))[1]) for n in range(5)]
    assert sizes == [3, 8, 8, 3, 8]  # full, deltas, full (an attribute changed), delta


def test_a_rank_sends_a_full_copy_again_every_refresh_records():
    copier = copies.Copier(1, refresh=3)
    assert [len(_line(copier, n, _record(n, 1))[1]) for n in range(7)] == [3, 8, 8, 3, 8, 8, 3]


def test_a_record_not_sent_has_a_full_copy_and_does_not_change_the_base():
    copier = copies.Copier(1, refresh=16)
    _line(copier, 0, _record(0, 1))
    assert len(_line(copier, 1, None)[1]) == 3
    assert _line(copier, 2, _record(2, 1))[1][2] == 0  # a delta against place 0


def test_a_delta_gives_exactly_the_record_the_rank_key_holds():
    copier, reader = copies.Copier(1, refresh=16), copies.CopyReader()
    for n in range(4):
        payload, line = _line(copier, n, _record(n, 1, step=[1, {"a": "b"}]))
        identity, record = reader.decode(1, line)
        key_identity, key_record = records.from_bytes(payload)
        assert (identity, record.__dict__) == (key_identity, key_record.__dict__)
        assert record.getMessage() == f"step {n} r1" and len(line) == (3 if n == 0 else 8)


def test_a_delta_whose_base_was_not_read_is_not_used():
    copier, reader = copies.Copier(1, refresh=16), copies.CopyReader()
    _line(copier, 0, _record(0, 1))  # the full copy: never read by the main process
    assert reader.decode(1, _line(copier, 1, _record(1, 1))[1]) is None
    other = copies.Copier(1, refresh=16)
    reader.decode(1, _line(other, 5, _record(5, 1))[1])  # a full copy at another place
    assert reader.decode(1, _line(copier, 2, _record(2, 1))[1]) is None  # its base is place 0, not 5


def test_a_copy_of_the_wrong_shape_or_types_is_not_used():
    copier, reader = copies.Copier(1, refresh=16), copies.CopyReader()
    reader.decode(1, _line(copier, 0, _record(0, 1))[1])
    delta = _line(copier, 1, _record(1, 1))[1]
    assert reader.decode(1, delta) is not None
    assert len(delta) == copies.DeltaCopy.LENGTH
    for place, value in ((copies.DeltaCopy.CALL_COUNT, "2"), (copies.DeltaCopy.MSG, 42)):  # not an int; not text
        assert reader.decode(1, delta[:place] + [value] + delta[place + 1 :]) is None
    assert reader.decode(1, [1, 0, b"not json".decode()]) is None


def test_lines_of_a_slot_that_are_not_copies_are_dropped():
    good = copies.Copier(2, refresh=16).line(0, *records.encode((SITE, 1), _record(1, 2)))
    blob = b"garbage\n[1,0]\n[0,0,[2]]\n[9,0,null]\n[true,0,null]\n" + good + b'{"v": 1}\n'
    assert [(rank, n) for rank, n, _ in copies.parse_slot(blob, 4)] == [(2, 0)]
    assert [(rank, n) for rank, n, _ in copies.parse_slot(good + good, 4)] == [(2, 0), (2, 0)]


def test_a_rank_cleans_up_off_its_post():
    store = InMemoryStore()
    outbox = queues.Outbox(store, 1, clean_every=2)  # background clean-up, as in a job
    inbox = queues.StoreInbox(store, 2, publish_every=1)
    for n in range(2):
        outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
    inbox.take_many([1])
    inbox.take_many([1])
    inbox.publish()
    held, real_delete = threading.Event(), store.delete_key
    store.delete_key = lambda key: held.wait(10) and real_delete(key)
    for n in range(2, 4):  # the second of these asks for the clean-up, whose deletes are held
        assert outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
    assert queues.key(1, 0) in store.data  # the post returned before its clean-up ran
    held.set()
    start = time.monotonic()
    assert outbox.cleaner.idle(10) and time.monotonic() - start < 10
    assert queues.key(1, 0) not in store.data and queues.key(1, 1) not in store.data
    assert queues.key(1, 2) in store.data and queues.key(1, 3) in store.data


def test_a_stopped_clean_up_thread_has_ended_and_deletes_no_more():
    """`stop` (before destroy_process_group and at exit) ends the thread after the delete it is in: no
    thread of ours is left inside a store call when the interpreter finalizes."""
    store = InMemoryStore()
    outbox = queues.Outbox(store, 1, clean_every=2)
    inbox = queues.StoreInbox(store, 2, publish_every=1)
    for n in range(4):
        outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
        inbox.take_many([1])
    assert outbox.cleaner.idle(10) and outbox.cleaned == 0  # nothing read yet when it looked
    inbox.publish()  # the main process has read 4
    inside, held, real_delete = threading.Event(), threading.Event(), store.delete_key
    store.delete_key = lambda key: (inside.set(), held.wait(10), real_delete(key))[-1]
    for n in range(4, 6):  # the second asks for the clean-up of 6 records; its first delete is held
        outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
    assert inside.wait(10)
    thread = outbox.cleaner._thread
    assert not outbox.close(0.2) and thread.is_alive()  # still in its store call: not released yet
    held.set()
    assert outbox.close(10) and not thread.is_alive()
    assert (outbox.acks, outbox.cleaned) == (1, 0)  # the delete it was in (the ack's), and no other
    for n in range(6, 10):  # later posts are delivered; nothing restarts the thread
        assert outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
    assert outbox.cleaner._thread is thread and outbox.cleaned == 0
    assert queues.Outbox(store, 2).close(0)  # never started: nothing to wait for


class _Connection:
    """One connection to a shared store: which calls went through it."""

    def __init__(self, store):
        self._store, self.calls = store, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self._store, name)


def test_a_rank_cleans_up_on_a_connection_of_its_own_not_its_posts_one():
    store = InMemoryStore()
    posts, cleanup = _Connection(store), _Connection(store)
    outbox = queues.Outbox(posts, 1, clean_every=2, background=False, cleanup_store=cleanup)
    inbox = queues.StoreInbox(store, 2, publish_every=1)
    for n in range(4):
        outbox.post(*records.encode((SITE, n + 1), _record(n, 1)))
        inbox.take_many([1])
        inbox.publish()
    assert queues.key(1, 0) not in store.data and queues.key(1, 2) not in store.data  # cleaned up
    assert "delete_key" in cleanup.calls and "delete_key" not in posts.calls
    assert set(posts.calls) <= {"append", "compare_set"}, posts.calls


def test_a_block_of_delta_copies_comes_out_whole_and_in_rank_order():
    store, seen = InMemoryStore(), []
    outboxes = {rank: queues.Outbox(store, rank, background=False) for rank in (1, 2, 3)}
    collector = _collector.Collector(queues.StoreInbox(store, 4), 4, 1.0, pytest.fail)
    handler = logging.Handler()
    handler.emit = lambda record: seen.append((record.getMessage(), record.funcName, record.lineno))
    logger = logging.getLogger("aif.unit.copies")
    logger.handlers[:], logger.propagate = [handler], False
    for count in range(1, 5):
        for rank in (3, 1, 2):
            outboxes[rank].post(*records.encode((SITE, count), _record(count, rank)))
        lines = [json.loads(line) for line in store.data[queues.slot_key(count - 1)].splitlines()]
        assert [len(line) for line in lines] == [3 if count == 1 else 8] * 3  # deltas from the second call
        collector.emit_call((SITE, count), _record(count, 0))
        assert seen == [(f"step {count} r{rank}", None, 7) for rank in range(4)]
        seen.clear()


class _LosesReplies:
    """A post connection whose record `compare_set`s the server applies (`applied`) or not, then fails."""

    def __init__(self, store, applied):
        self.store, self.applied = store, applied

    def append(self, key, value):
        self.store.append(key, value)

    def compare_set(self, key, expected, desired):
        if self.applied:
            self.store.compare_set(key, expected, desired)
        raise ConnectionError("connection closed")


@pytest.mark.parametrize("applied", [True, False])
def test_a_post_whose_connection_failed_is_settled_once_on_a_fresh_one(applied):
    """Applied before the reply was lost, or not applied: asked again, the record is in its key once, the
    outbox goes on on the fresh connection, and the main process takes each record once."""
    store = InMemoryStore()
    outbox = queues.Outbox(_LosesReplies(store, applied), 1, background=False)
    payload = records.encode((SITE, 1), _record(1, 1))[0]
    with pytest.raises(ConnectionError):
        outbox.post(payload)
    assert outbox.resend(store, 0, payload) and outbox.store is store and outbox.sent == 1
    assert bytes(store.data[queues.key(1, 0)]) == payload
    outbox.post(records.encode((SITE, 2), _record(2, 1))[0])
    inbox = queues.StoreInbox(store, 2)
    taken = inbox.take_many([1]) + inbox.take_many([1])
    assert [identity for identity, _entry in taken] == [(SITE, 1), (SITE, 2)] and inbox.seal(1) == []


def test_a_post_that_meets_the_seal_on_its_fresh_connection_is_the_ranks_to_print():
    store = InMemoryStore()
    queues.StoreInbox(store, 2).seal(1)
    outbox = queues.Outbox(_LosesReplies(store, False), 1, background=False)
    payload = records.encode((SITE, 1), _record(1, 1))[0]
    with pytest.raises(ConnectionError):
        outbox.post(payload)
    assert not outbox.resend(store, 0, payload) and queues.sealed(bytes(store.data[queues.key(1, 0)])) == 0
