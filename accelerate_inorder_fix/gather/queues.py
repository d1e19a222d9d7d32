"""Gather mode's queues in the job's c10d store: each rank's records, read by the main process.

A rank that posts waits for no one while it holds fewer than `BOUND` records in the store; only the main
process reads, in order, with bounded waits (the store and its connections: `store.connection`).

Each rank's records form a queue: key `<rank>/<n>` is that rank's n-th in_order record, written
atomically (`compare_set`). That key is the record. Only the main process reads, in order. Reading
1,024 keys costs milliseconds of per-key overhead even in one `multi_get`, one value of the same size
a tenth of a millisecond; so a rank first appends a copy of the record (`copies`) to slot `n % SLOTS`,
one key all ranks share, and the main process reads that one slot per call. Who writes and deletes what:

    rank r, its n-th record          the job's store          main process, its call n
    (Outbox.post)                   (s = n % SLOTS)          (StoreInbox, Collector.emit_call)
    --------------------------      ---------------          --------------------------------
    (BOUND records held: wait for
     the next ack, make_room)
    append(slot/s, copy line) -----> slot/s: + 1 line
    compare_set(r/n, "", record) --> r/n: the record
      (TOMBSTONE there: sealed,
       the rank prints it itself)
                                     slot/s  <-------------- compare_set(slot/s, UNSET, UNSET): read,
                                     slot/s  <-------------- compare_set(slot/s, read, ""): emptied
                                                             if unchanged (else read again), never waits
                                                             records of call n from the copies; then,
                                                             for ranks still missing, until the deadline:
                                     ack/r/i <-------------- acks due (every PUBLISH_EVERY records of r read)
                                     r/n ... <-------------- wait([r/n, ...], time left)
                                     r/n ... <-------------- multi_get([r/n, ...])  (copies unusable)
                                                             emit the block in rank order
                                     ack/r/i <-------------- multi_set: ack i of r = how far r was read
    clean-up (a BackgroundWriter), every CLEAN_EVERY posts, on a connection of its own:
    compare_set(ack/r/i, ...), delete_key(ack/r/i): its acks
    delete_key(r/k), k < r's mark -> r/k: gone
    at exit (Outbox.finish):                                 at exit (Collector.flush -> StoreInbox.seal, clear),
    compare_set(r/sent, "", CLOSED) r/next  <-------------- compare_set(r/next, "", TOMBSTONE) per rank
      (whoever comes second deletes the queue's last keys)   delete_key(slot/0 ... slot/15)

The invariants, each with the test that guards it (unit tests in tests/unit, jobs in tests/jobs):

- A rank appends its copy before it writes its key, so taking the copy takes the record: every record
  comes out exactly once (test_collector_delivery.py::test_every_record_exactly_once_in_rank_order_within_the_bound).
- The key is the record: a copy that is missing, damaged or read too early costs only itself, and the
  main process reads the key (test_collector.py::test_record_whose_copy_is_gone_or_damaged_comes_from_its_own_key).
  A copy read ahead of its rank's next record is kept, up to `BOUND` places ahead (as far as a rank can
  run), so ranks that run ahead cost no key reads
  (test_collector.py::test_ranks_running_a_bound_ahead_give_every_record_from_its_copy).
- A post whose connection fails asks again on a fresh one (`Outbox.resend`): a `compare_set` the server
  applied before the reply was lost does not make the rank print the record too
  (test_explorer_path.py::test_a_post_applied_before_its_connection_failed_is_emitted_once;
  test_faults.py::test_gather_post_applied_before_its_reply_was_lost_comes_out_once).
- A delta copy is used only against the full copy the main process decoded as its base
  (test_copies.py::test_a_delta_whose_base_was_not_read_is_not_used).
- The main process empties nothing but the slot it read, atomically (a copy appended meanwhile is read
  too: test_collector.py::test_a_copy_appended_while_its_slot_is_read_is_taken_from_the_slot), and never
  deletes one while it reads: a slot appended to faster than a round trip is left as read, and its next
  read goes on from there
  (test_collector.py::test_a_slot_appended_to_faster_than_it_can_be_emptied_loses_no_copy); it acks a rank's queue every `PUBLISH_EVERY`
  records it read there, all ranks in one `multi_set`
  (test_collector.py::test_main_process_empties_only_the_slot_it_read_and_publishes_rarely).
- A rank deletes only its own records below the main process's acked mark
  (test_collector.py::test_rank_deletes_only_what_the_main_process_has_read), in its clean-up thread, so no
  post waits for a delete (test_copies.py::test_a_rank_cleans_up_off_its_post), on a connection of its
  own, never the process group's (test_copies.py::test_a_rank_cleans_up_on_a_connection_of_its_own_not_its_posts_one).
- The clean-up thread is stopped and joined before the process group is destroyed and at exit: no
  thread of ours is inside a store call when the interpreter finalizes
  (test_copies.py::test_a_stopped_clean_up_thread_has_ended_and_deletes_no_more; tests/jobs/test_exit.py).
- A rank holds at most `BOUND` records in the store, read or not: past them its post waits on the key of
  the main process's next ack (the store's own wait), at most the timeout; a wait in vain makes the rank
  print its records itself, said once, without waiting again until an ack comes
  (test_backpressure.py::test_a_rank_far_ahead_of_the_main_process_holds_at_most_the_bound_and_waits_for_its_acks;
  test_backpressure.py::test_a_full_queue_waits_at_most_T_in_all_then_its_rank_prints_its_records_said_once).
  The store so holds at most `(ranks - 1) x (BOUND + ACK_KEYS) + SLOTS` keys of gather mode, whatever
  the job does (test_backpressure.py::test_the_store_stays_bounded_while_ranks_run_ahead_with_an_ack_every_few_records;
  test_gather_backlog.py::test_a_loaded_job_keeps_every_bound_and_every_record_once).
- The main process acks what it read before each wait: a rank held at its bound is never waited for by
  the main process while it waits for the main process's ack.
- The only blocking calls are `wait`, always with the time left to the deadline
  (test_collector.py::test_deadline_bounds_the_wait_and_names_the_missing_rank), and a full rank's wait
  for an ack, at most the timeout; the connection's own timeout is bounded too, so a dead store cannot
  hang a rank for the process group's 30 minutes.
- The seal: at exit the main process writes a tombstone at each queue's next key, atomically, taking
  whatever a rank posted there first; a rank posts the same atomic way, so a record either lands before
  the seal (the main process emits it) or meets the tombstone (the rank prints it): never both, never
  neither (test_faults.py::test_gather_mode_emits_every_record_exactly_once_under_faults, case `main_first`).
- At its exit a rank writes its closing marker where its next record would go: the main process, reading
  it, deletes the rest of that queue and its acks, and seals it no more; a rank that meets the tombstone
  instead deletes them itself (the tombstone says how many acks there were). Either way no key of gather
  mode is left when both have ended
  (test_backpressure.py::test_every_key_of_a_queue_is_deleted_at_the_end_whichever_side_ends_first).

Torch releases without `append` or `multi_get`: the same protocol on the keys alone, slower
(test_collector.py::test_older_stores_give_the_same_blocks_from_the_keys).
"""

from __future__ import annotations

import datetime
import struct
import threading
import time
from typing import Any, Optional, Union

from .. import bounds
from .._callsite import Identity
from ..store.connection import Store, peek
from ..store.errors import is_timeout
from ..store.writer import BackgroundWriter
from . import copies, records
from .copies import PLACE, RANK, BlockEntry, CopyLine


# What an inbox hands out for one place in a rank's queue: `(identity, block entry)`, or the
# `MalformedRecord` saying why the bytes there are not a record.
Taken = Union[tuple[Identity, BlockEntry], records.MalformedRecord]


TOMBSTONE = b"accelerate_inorder_fix:sealed"
CLOSED = b"accelerate_inorder_fix:closed:"  # a rank's last key: `CLOSED` + b"<cleaned>,<acks taken>"
PUBLISH_EVERY = 8  # main process: a rank's records read between two of its acks
CLEAN_EVERY = 32  # a rank: posts between two clean-ups of what the main process has read (`docs/costs.md`)
BOUND = int(bounds.GATHER_QUEUE.value)  # a rank's records in the store, read or not: past them, its post waits
ACK_KEYS = BOUND // PUBLISH_EVERY + 2  # a rank's ack keys (`ack/<rank>/<i mod ACK_KEYS>`): more than can be unread
_ACK = struct.Struct("<QQ")  # an ack's value: (its number i, the main process's read mark then)
SLOTS = 16  # slots shared by all ranks: a rank's n-th record is copied into slot n % SLOTS
EMPTY_TRIES = 4  # main process: swaps of a slot for b"" that copies appended meanwhile may fail, before a delete


def key(rank: int, n: int) -> str:
    return f"{rank}/{n}"


def slot_key(n: int) -> str:
    return f"slot/{n % SLOTS}"


def ack_key(rank: int, i: int) -> str:
    """The key of the main process's i-th ack of `rank`'s queue (i from 1); ACK_KEYS names per rank, reused."""
    return f"ack/{rank}/{i % ACK_KEYS}"


def sealed(answer: bytes) -> Optional[int]:
    """The main process's ack count written in a tombstone, or None when `answer` is no tombstone."""
    if not answer.startswith(TOMBSTONE):
        return None
    tail = answer[len(TOMBSTONE) + 1 :]
    return int(tail) if tail.isdigit() else 0


def _closed(answer: bytes) -> Optional[tuple[int, int]]:
    """`(cleaned, acks taken)` from a rank's closing marker, or None when `answer` is none."""
    if not answer.startswith(CLOSED):
        return None
    cleaned, _, acks = answer[len(CLOSED) :].partition(b",")
    return (int(cleaned), int(acks)) if cleaned.isdigit() and acks.isdigit() else (0, 0)


FINISHED: Identity = (("<closed>", "", 0), 0)  # a rank's closing marker, taken: no call's, emits nothing


def delete_acks(store: Store, rank: int, taken: int, written: int) -> None:
    """Delete `rank`'s acks after the first `taken`, up to the `written`-th: at most ACK_KEYS keys."""
    for i in range(max(taken + 1, written - ACK_KEYS + 1), written + 1):
        store.delete_key(ack_key(rank, i))


class Outbox:
    """A rank's side: append records to its own queue, and delete those already read.

    A post never waits while the rank holds fewer than `bound` records in the store (read or not). Past
    that, `make_room` waits for the main process's next ack, at most `timeout` seconds.
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        clean_every: int = CLEAN_EVERY,
        background: bool = True,
        cleanup_store: Optional[Store] = None,
        bound: int = BOUND,
        timeout: float = 30.0,
    ) -> None:
        """`cleanup_store`: where `clean` deletes (in a job, a connection of its own: `connection.own_connection`); `store` if None.

        `bound`: records held in the store before a post must wait; `timeout`: how long a post may wait
        for the main process to read (ACCELERATE_INORDER_TIMEOUT, 30 s by default).
        """
        self.store = store
        self.rank = rank
        self.clean_every = clean_every
        self.cleanup_store = store if cleanup_store is None else cleanup_store
        self.cleaner = BackgroundWriter(self.clean, "accelerate-inorder-fix-clean") if background else None
        self.sent = 0
        self.cleaned = 0  # records below this index are deleted
        self.mark = 0  # the main process's read mark, as last learnt from its acks
        self.acks = 0  # acks learnt (and deleted)
        self.bound = bound
        self.timeout = timeout
        self.behind = False  # a post waited `timeout` in vain, and no ack has come since
        self.lock = threading.Lock()  # the clean-up thread's `clean` and the post's `make_room`
        self.slotted = callable(getattr(store, "append", None))
        self.copier = copies.Copier(rank, refresh=SLOTS)

    def post(self, payload: bytes, document: Optional[list[Any]] = None) -> bool:
        """Append `payload` (`document`: its data, if known); False when the main process has sealed the queue."""
        n = self.sent
        if self.slotted:  # the copy first: whoever sees the rank's key below finds the copy already there
            try:
                self.store.append(slot_key(n), self.copier.line(n, payload, document))
            except (RuntimeError, NotImplementedError):  # a store without `append`: the rank's key alone
                self.slotted = False
        if sealed(bytes(self.store.compare_set(key(self.rank, n), "", payload))) is not None:
            if self.slotted:  # nobody reads slots any more: the last to append deletes
                self.store.delete_key(slot_key(n))
            return False
        self.sent += 1
        if self.sent % self.clean_every == 0:
            if self.cleaner is not None:
                self.cleaner.request(self.sent)
                return True
            try:
                self.clean(self.sent)
            except (RuntimeError, OSError):  # the record is delivered; what was not deleted goes next time
                pass
        return True

    @property
    def full(self) -> bool:
        """Whether the rank holds `bound` records in the store: the next post must `make_room` first."""
        return self.sent - self.cleaned >= self.bound

    def make_room(self) -> bool:
        """Delete what the main process has read, waiting for its acks while the queue is full; False when
        the main process read nothing for `timeout` seconds (the rank prints its record itself).

        The wait is the store's own, on the key of the main process's next ack: no polling. After a wait
        in vain, later posts do not wait until an ack comes: a main process that reads nothing costs the
        rank one timeout, not one per record.
        """
        with self.lock:
            waited = 0.0
            while self.full:
                if self.mark > self.cleaned:  # read already, not deleted yet: the clean-up thread is behind
                    self._delete(self.store, min(self.mark, self.sent), stoppable=False)
                    continue
                if self._learn(self.store):
                    self.behind = False
                    continue
                if self.behind:
                    return False
                start = time.monotonic()
                try:
                    self.store.wait(
                        [ack_key(self.rank, self.acks + 1)],
                        datetime.timedelta(seconds=max(0.0, self.timeout - waited)),
                    )
                except RuntimeError:  # its deadline, or a failed store: either way nothing is read for this rank
                    self.behind = True
                    return False
                waited += time.monotonic() - start
                if waited >= self.timeout and not self._learn(self.store):  # not an ack there
                    self.behind = True
                    return False
            return True

    def resend(self, store: Store, n: int, payload: bytes) -> bool:
        """After post `n` raised: ask `store` (a fresh connection) whether it landed, and post it if not.

        One atomic `compare_set(key, "", payload)` answers all three: the payload (the first post landed,
        or this one did: delivered, the main process emits it), or the tombstone (sealed: False, the rank
        prints it). Anything else there raises: the record did not land. Delivered, the outbox goes on
        on `store` (a failed connection stays failed).

        Args:
            store: a fresh connection to the job's store (prefixed).
            n (`int`): the place of the post that raised in this rank's queue.
            payload (`bytes`): what that post sent.
        """
        answer = bytes(store.compare_set(key(self.rank, n), "", payload))
        if sealed(answer) is not None:
            return False
        if answer != payload:
            raise RuntimeError(f"key {key(self.rank, n)} holds another record")
        self.store, self.sent = store, n + 1
        return True

    def clean(self, sent: int) -> None:
        """Delete this rank's first `sent` records, those the main process has read (its acks say how far)."""
        with self.lock:
            self._learn(self.cleanup_store)
            self._delete(self.cleanup_store, min(self.mark, sent), stoppable=True)

    def _learn(self, store: Store) -> bool:
        """Take the main process's acks of this queue that are there (never waits); True if there was one."""
        learnt = False
        while True:
            name = ack_key(self.rank, self.acks + 1)
            blob = peek(store, name)
            if blob is None or len(blob) != _ACK.size:
                return learnt
            i, mark = _ACK.unpack(blob)
            store.delete_key(name)
            self.acks = max(self.acks + 1, i)
            self.mark = max(self.mark, mark)
            learnt = True

    def _delete(self, store: Store, below: int, stoppable: bool) -> None:
        cleaner = self.cleaner
        for n in range(self.cleaned, below):
            if stoppable and cleaner is not None and cleaner.stopping:
                return
            store.delete_key(key(self.rank, n))
            self.cleaned = n + 1

    def close(self, timeout: float) -> bool:
        """Stop the clean-up thread, waiting up to `timeout` s for it; True when none is running."""
        return self.cleaner is None or self.cleaner.stop(timeout)

    def finish(self) -> None:
        """At exit, after `close`: this rank posts no more. Its last key says so, and what it has deleted.

        The main process, when it reads that marker, deletes the rest of the queue and its acks. If the
        main process has sealed the queue already (it read everything before the tombstone), the rank
        deletes them itself, the tombstone with them: either way no key of the queue is left.
        """
        with self.lock:
            store, n = self.store, self.sent
            marker = CLOSED + b"%d,%d" % (self.cleaned, self.acks)
            written = sealed(bytes(store.compare_set(key(self.rank, n), "", marker)))
            if written is None:
                return
            for place in range(self.cleaned, n + 1):
                store.delete_key(key(self.rank, place))
            self.cleaned = n
            delete_acks(store, self.rank, self.acks, written)


class StoreInbox:
    """The main process's side: read each rank's queue in order, with bounded waits, in batches.

    What it hands out is decoded (`Taken`). It is the collector's `RecordSource` in a job.
    """

    def __init__(self, store: Store, world_size: int, publish_every: int = PUBLISH_EVERY) -> None:
        self.store = store
        self.cursor = [0] * world_size  # per rank: the place of its next record not taken yet
        self.publish_every = publish_every
        self.batched = callable(getattr(store, "multi_get", None))
        self.slotted = callable(getattr(store, "append", None))
        self.kept: dict[tuple[int, int], CopyLine] = {}  # (rank, place) -> a copy read from a slot, not yet taken
        self.unemptied: dict[str, int] = {}  # slot -> the length read of it, when `_empty` could not empty it
        self.reader = copies.CopyReader()
        self.acks = [0] * world_size  # per rank: acks written
        self.acked = [0] * world_size  # per rank: the read mark its last ack said
        self.closed: set[int] = set()  # ranks whose closing marker was read: they post no more
        self._set_many = getattr(store, "multi_set", None)

    def _next_key(self, rank: int) -> str:
        return f"{rank}/{self.cursor[rank]}"  # `key`, inline: once per waited-for rank and call

    def wait(self, ranks: list[int], seconds: float) -> bool:
        """Wait up to `seconds` until every rank in `ranks` has a next record; False on timeout.

        What was read is acked first (every `publish_every` records a rank): a rank whose queue is full
        may be waiting for it before it can post the record waited for here.
        """
        self.publish(self.publish_every)
        try:
            self.store.wait([self._next_key(r) for r in ranks], datetime.timedelta(seconds=seconds))
        except RuntimeError as exc:
            if is_timeout(exc):
                return False
            raise
        return True

    def ready(self, rank: int) -> bool:
        """Non-blocking: has `rank` a next record?"""
        return bool(self.store.check([self._next_key(rank)]))

    def take(self, rank: int) -> Taken:
        """The next record of `rank` (known to be there)."""
        return self.take_many([rank])[0]

    def take_many(self, ranks: list[int]) -> list[Taken]:
        """The next record of each rank in `ranks` (each known to be there), in a few round trips.

        Ranks at the same place in their queues share a slot: one read of it gives them all (and
        empties it: a slot holds what was appended since it was last read, `_empty`). A record whose
        copy cannot give it (a store without `append`, a damaged copy) comes from its own key.
        """
        for copy in self._read_slots(ranks):
            self._keep(copy)
        items: list[Optional[Taken]] = [self._from_kept(rank) for rank in ranks]
        missing = [i for i, item in enumerate(items) if item is None]
        if missing:
            names = [self._next_key(ranks[i]) for i in missing]
            payloads = self.store.multi_get(names) if self.batched else [self.store.get(name) for name in names]
            for i, payload in zip(missing, payloads):
                items[i] = self._decode(ranks[i], bytes(payload))
        for rank in ranks:
            self.cursor[rank] += 1
        return [item for item in items if item is not None]  # each is, by now

    def take_copied(self, ranks: list[int], current: Identity, into: dict[int, BlockEntry]) -> list[tuple[int, Taken]]:
        """The next record of each rank in `ranks` whose copy is in its slot already: no waiting.

        Records of the call `current` go into `into` (`{rank: entry}`, a delta copy's record deferred);
        the others come back as `(rank, (identity, entry))`, in order.
        A copy is appended before the rank writes its key, so the key will hold the same record: taking
        the copy takes the record. (If the rank's store connection fails between the two, the rank writes
        the key on a fresh connection; only a rank that cannot open one prints the record too.)
        """
        if not self.slotted:
            return []
        cursor = self.cursor
        decode = self.reader.decode
        others: list[tuple[int, Taken]] = []
        wanted = set(ranks)
        kept = [self.kept.pop((rank, cursor[rank]), None) for rank in ranks] if self.kept else []
        for copy in [copy for copy in kept if copy is not None] + self._read_slots(wanted):
            rank = copy[RANK]
            if copy[PLACE] != cursor[rank] or rank not in wanted:
                self._keep(copy)
                continue
            item = decode(rank, copy, current)  # None: a copy that cannot give the record; its key will
            if item is not None:
                if item[0] == current:
                    into[rank] = item[1]
                else:
                    others.append((rank, item))
                cursor[rank] += 1
                wanted.discard(rank)  # one record per rank: a deferred one's base stays its base
        return others

    def _from_kept(self, rank: int) -> Optional[Taken]:
        copy = self.kept.pop((rank, self.cursor[rank]), None)
        return None if copy is None else self.reader.decode(rank, copy)

    def _keep(self, copy: CopyLine) -> None:
        """Keep a copy of a record not taken yet (the first of each), if it is among its rank's next `BOUND`.

        A rank runs up to `BOUND` records ahead of the main process, so a slot holds copies of up to
        `BOUND // SLOTS` places of each rank: a copy dropped here would make its record come from its key.
        """
        rank = copy[RANK]
        place = copy[PLACE]
        if 0 <= place - self.cursor[rank] < BOUND:
            self.kept.setdefault((rank, place), copy)

    def _read_slots(self, ranks: Union[list[int], set[int]]) -> list[CopyLine]:
        """Read and empty the slot of every place `ranks` are at (usually one); the copies in them.

        A slot that could not be emptied last time (`_empty`) still starts with what was read then:
        only what follows it is parsed.
        """
        found: list[CopyLine] = []
        for n in {self.cursor[r] for r in ranks} if self.slotted else ():
            name = slot_key(n)
            blob = peek(self.store, name)  # never waits
            if blob:  # absent (None) or emptied (b""): no copy there
                done = self.unemptied.pop(name, 0)
                read = self._empty(name, blob)
                found.extend(copies.parse_slot(read[done:] if len(blob) >= done else read, len(self.cursor)))
        return found

    def _empty(self, name: str, blob: bytes) -> bytes:
        """Empty slot `name`, read as `blob`, and give every copy it held: those appended since too.

        Emptied only if it still holds what was read (`compare_set(name, read, b"")`): a copy appended
        between the read and a delete would be lost with it, and its record read from its key, whole.
        An append in between fails the swap, whose answer is the slot now: the read grows by it, and
        the swap is tried again, `EMPTY_TRIES` times at most. Past them (ranks appending to it faster
        than a round trip, as 1,024 ranks posting the same call do), the slot is left as it is and its
        length noted in `unemptied`: the next read parses only what was appended after it and empties
        it. An emptied slot stays, as b"": a copy appended to it is a line like any other.
        """
        read = blob
        for _ in range(EMPTY_TRIES):
            now = bytes(self.store.compare_set(name, read, b""))
            if now == b"" or now == read:  # emptied; or gone (an absent key answers what was expected)
                return read
            read = now
        self.unemptied[name] = len(read)
        return read

    def _decode(self, rank: int, payload: bytes) -> Taken:
        """The record in `rank`'s key at its cursor; its closing marker is no record (`FINISHED`)."""
        ended = _closed(payload)
        if ended is None:
            return records.decode(payload, rank)
        self._finish(rank, ended)
        return FINISHED, None

    def _finish(self, rank: int, ended: tuple[int, int]) -> None:
        """`rank` has closed its queue (its marker at its cursor): delete what is left of it and of its acks."""
        cleaned, taken = ended
        for place in range(cleaned, self.cursor[rank] + 1):
            self.store.delete_key(key(rank, place))
        delete_acks(self.store, rank, taken, self.acks[rank])
        self.closed.add(rank)

    def end_call(self) -> None:
        """After a call's block: ack each rank's records read, every `publish_every` of them."""
        self.publish(self.publish_every)

    def publish(self, every: int = 1) -> None:
        """Ack each rank whose queue was read `every` records further since its last ack: one `multi_set`.

        A rank deletes what an ack says was read, and a rank whose queue is full waits for its next ack.
        """
        cursor, acked = self.cursor, self.acked
        self._ack([r for r in range(1, len(cursor)) if cursor[r] - acked[r] >= every and r not in self.closed])

    def _ack(self, moved: list[int]) -> None:
        if not moved:
            return
        acked = self.acked
        names, values = [], []
        for rank in moved:
            self.acks[rank] += 1
            acked[rank] = self.cursor[rank]
            names.append(ack_key(rank, self.acks[rank]))
            values.append(_ACK.pack(self.acks[rank], self.cursor[rank]))
        if self._set_many is not None:
            self._set_many(names, values)
        else:
            for name, value in zip(names, values):
                self.store.set(name, value)

    def seal(self, rank: int) -> list[Taken]:
        """At exit: close `rank`'s queue for good; what it posted meanwhile, in order (decoded).

        The tombstone says how many acks were written, for the rank to delete them (`Outbox.finish`).
        """
        found: list[Taken] = []
        if rank not in self.closed and self.cursor[rank] > self.acked[rank]:
            self._ack([rank])  # a rank waiting for room goes on, and meets the tombstone
        tombstone = TOMBSTONE + b"/%d" % self.acks[rank]
        while rank not in self.closed:
            name = self._next_key(rank)
            payload = bytes(self.store.compare_set(name, "", tombstone))
            if payload == tombstone:
                return found
            item = self._decode(rank, payload)
            if rank not in self.closed:
                found.append(item)
                self.store.delete_key(name)
            self.cursor[rank] += 1
        return found

    def clear(self) -> None:
        """At exit, after every queue is sealed: delete the slots (a later post deletes the slot it wrote)."""
        if self.slotted:
            for n in range(SLOTS):
                self.store.delete_key(slot_key(n))
