"""Gather mode's queues in the job's c10d store: each rank's records, read by the main process.

A rank that posts never waits for anyone; only the main process reads, in order, with bounded waits
(the store and its connections: `store.connection`).

Each rank's records form a queue: key `<rank>/<n>` is that rank's n-th in_order record, written
atomically (`compare_set`). That key is the record. Only the main process reads, in order. Reading
1,024 keys costs milliseconds of per-key overhead even in one `multi_get`, one value of the same size
a tenth of a millisecond; so a rank first appends a copy of the record (`copies`) to slot `n % SLOTS`,
one key all ranks share, and the main process reads that one slot per call. Who writes and deletes what:

    rank r, its n-th record          the job's store          main process, its call n
    (Outbox.post, never waits)      (s = n % SLOTS)          (StoreInbox, Collector.emit_call)
    --------------------------      ---------------          --------------------------------
    append(slot/s, copy line) -----> slot/s: + 1 line
    compare_set(r/n, "", record) --> r/n: the record
      (TOMBSTONE there: sealed,
       the rank prints it itself)
                                     slot/s  <-------------- compare_set(slot/s, UNSET, UNSET): read,
                                     slot/s  <-------------- delete_key(slot/s)    never waits
                                                             records of call n from the copies; then,
                                                             for ranks still missing, until the deadline:
                                     r/n ... <-------------- wait([r/n, ...], time left)
                                     r/n ... <-------------- multi_get([r/n, ...])  (copies unusable)
                                                             emit the block in rank order
                                     read    <-------------- every PUBLISH_EVERY calls: set(read, marks)
    clean-up (a BackgroundWriter), every CLEAN_EVERY posts, on a connection of its own:
    check(read), get(read) ---------> read
    delete_key(r/k), k < r's mark -> r/k: gone
                                                             at exit (Collector.flush -> StoreInbox.seal),
                                     r/next  <-------------- compare_set(r/next, "", TOMBSTONE) per rank

The invariants, each with the test that guards it (unit tests in tests/unit, jobs in tests/jobs):

- A rank appends its copy before it writes its key, so taking the copy takes the record: every record
  comes out exactly once (test_collector_delivery.py::test_every_record_exactly_once_in_rank_order_within_the_bound).
- The key is the record: a copy that is missing, damaged or read too early costs only itself, and the
  main process reads the key (test_collector.py::test_record_whose_copy_is_gone_or_damaged_comes_from_its_own_key).
- A post whose connection fails asks again on a fresh one (`Outbox.resend`): a `compare_set` the server
  applied before the reply was lost does not make the rank print the record too
  (test_explorer_path.py::test_a_post_applied_before_its_connection_failed_is_emitted_once;
  test_faults.py::test_gather_post_applied_before_its_reply_was_lost_comes_out_once).
- A delta copy is used only against the full copy the main process decoded as its base
  (test_copies.py::test_a_delta_whose_base_was_not_read_is_not_used).
- The main process deletes nothing but the slot it read, and writes its read marks every
  `PUBLISH_EVERY` calls (test_collector.py::test_main_process_deletes_only_the_slot_it_read_and_publishes_rarely).
- A rank deletes only its own records below the main process's mark
  (test_collector.py::test_rank_deletes_only_what_the_main_process_has_read), in its clean-up thread, so no
  post waits for a delete (test_copies.py::test_a_rank_cleans_up_off_its_post), on a connection of its
  own, never the process group's (test_copies.py::test_a_rank_cleans_up_on_a_connection_of_its_own_not_its_posts_one).
- The clean-up thread is stopped and joined before the process group is destroyed and at exit: no
  thread of ours is inside a store call when the interpreter finalizes
  (test_copies.py::test_a_stopped_clean_up_thread_has_ended_and_deletes_no_more; tests/jobs/test_exit.py).
- The store holds, per rank, what the main process had not read at the rank's last clean-up plus at
  most `CLEAN_EVERY + PUBLISH_EVERY` records, and at most `SLOTS` slots, whatever the number of calls
  (test_collector.py::test_store_size_stays_bounded_whatever_the_number_of_calls;
  test_gather_scale.py::test_sixteen_ranks_gather_every_record_once_in_order_with_a_bounded_store).
- The only blocking call is `wait`, always with the time left to the deadline
  (test_collector.py::test_deadline_bounds_the_wait_and_names_the_missing_rank); the connection's own
  timeout is bounded too, so a dead store cannot hang a rank for the process group's 30 minutes.
- The seal: at exit the main process writes a tombstone at each queue's next key, atomically, taking
  whatever a rank posted there first; a rank posts the same atomic way, so a record either lands before
  the seal (the main process emits it) or meets the tombstone (the rank prints it): never both, never
  neither (test_faults.py::test_gather_mode_emits_every_record_exactly_once_under_faults, case `main_first`).

Torch releases without `append` or `multi_get`: the same protocol on the keys alone, slower
(test_collector.py::test_older_stores_give_the_same_blocks_from_the_keys).
"""

from __future__ import annotations

import datetime
import struct
from typing import Any, Optional, Union

from .._callsite import Identity
from ..store.connection import Store, peek
from ..store.writer import BackgroundWriter
from . import copies, records
from .copies import PLACE, RANK, BlockEntry, CopyLine


# What an inbox hands out for one place in a rank's queue: `(identity, block entry)`, or the
# `MalformedRecord` saying why the bytes there are not a record.
Taken = Union[tuple[Identity, BlockEntry], records.MalformedRecord]


TOMBSTONE = b"accelerate_inorder_fix:sealed"
READ_KEY = "read"
PUBLISH_EVERY = 8  # main process: calls between two publications of its read marks
CLEAN_EVERY = 8  # a rank: posts between two clean-ups of what the main process has read
_MARK = struct.Struct("<Q")
SLOTS = 16  # slots shared by all ranks: a rank's n-th record is copied into slot n % SLOTS


def key(rank: int, n: int) -> str:
    return f"{rank}/{n}"


def slot_key(n: int) -> str:
    return f"slot/{n % SLOTS}"


def read_mark(marks: bytes, rank: int) -> int:
    """How many of `rank`'s records the main process had read, from a `read` value (0 if not listed)."""
    offset = rank * _MARK.size
    if offset + _MARK.size > len(marks):
        return 0
    return int(_MARK.unpack_from(marks, offset)[0])


class Outbox:
    """A rank's side: append records to its own queue, and delete those already read. Never waits."""

    def __init__(
        self,
        store: Store,
        rank: int,
        clean_every: int = CLEAN_EVERY,
        background: bool = True,
        cleanup_store: Optional[Store] = None,
    ) -> None:
        """`cleanup_store`: where `clean` deletes (`cleanup_store()` in a job); `store` if None."""
        self.store = store
        self.rank = rank
        self.clean_every = clean_every
        self.cleanup_store = store if cleanup_store is None else cleanup_store
        self.cleaner = BackgroundWriter(self.clean, "accelerate-inorder-fix-clean") if background else None
        self.sent = 0
        self.cleaned = 0  # records below this index are deleted
        self.published = False  # the main process has written READ_KEY (it is never deleted)
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
        if bytes(self.store.compare_set(key(self.rank, n), "", payload)) == TOMBSTONE:
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
        if answer == TOMBSTONE:
            return False
        if answer != payload:
            raise RuntimeError(f"key {key(self.rank, n)} holds another record")
        self.store, self.sent = store, n + 1
        return True

    def clean(self, sent: int) -> None:
        """Delete this rank's first `sent` records, those the main process has read.

        `check` for the main process's read marks until it has published them: `get` would wait.
        """
        store = self.cleanup_store
        self.published = self.published or bool(store.check([READ_KEY]))
        if not self.published:
            return
        read = min(read_mark(store.get(READ_KEY), self.rank), sent)
        cleaner = self.cleaner
        for n in range(self.cleaned, read):
            if cleaner is not None and cleaner.stopping:
                return
            store.delete_key(key(self.rank, n))
            self.cleaned = n + 1

    def close(self, timeout: float) -> bool:
        """Stop the clean-up thread, waiting up to `timeout` s for it; True when none is running."""
        return self.cleaner is None or self.cleaner.stop(timeout)


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
        self.reader = copies.CopyReader()
        self._calls = 0

    def _next_key(self, rank: int) -> str:
        return f"{rank}/{self.cursor[rank]}"  # `key`, inline: once per waited-for rank and call

    def wait(self, ranks: list[int], seconds: float) -> bool:
        """Wait up to `seconds` until every rank in `ranks` has a next record; False on timeout."""
        try:
            self.store.wait([self._next_key(r) for r in ranks], datetime.timedelta(seconds=seconds))
        except RuntimeError:  # DistStoreError on timeout (a RuntimeError subclass)
            return False
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
        deletes it, so no slot outgrows one round of records). A record whose copy cannot give it
        (a store without `append`, a slot already read, a damaged copy) comes from its own key.
        """
        for copy in self._read_slots(ranks):
            self._keep(copy)
        items: list[Optional[Taken]] = [self._from_kept(rank) for rank in ranks]
        missing = [i for i, item in enumerate(items) if item is None]
        if missing:
            names = [self._next_key(ranks[i]) for i in missing]
            payloads = self.store.multi_get(names) if self.batched else [self.store.get(name) for name in names]
            for i, payload in zip(missing, payloads):
                items[i] = records.decode(payload, ranks[i])
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
        """Keep a copy of a record not taken yet (the first of each), if it is among its rank's next few."""
        rank = copy[RANK]
        place = copy[PLACE]
        if 0 <= place - self.cursor[rank] < SLOTS:
            self.kept.setdefault((rank, place), copy)

    def _read_slots(self, ranks: Union[list[int], set[int]]) -> list[CopyLine]:
        """Read and delete the slot of every place `ranks` are at (usually one); the copies in them."""
        found: list[CopyLine] = []
        for n in {self.cursor[r] for r in ranks} if self.slotted else ():
            name = slot_key(n)
            blob = peek(self.store, name)  # never waits
            if blob is not None:
                # Copies appended after this recreate the slot: read next time, or not needed.
                self.store.delete_key(name)
                found.extend(copies.parse_slot(blob, len(self.cursor)))
        return found

    def end_call(self) -> None:
        """After a call's block: every `publish_every` calls, tell the ranks how far each queue was read."""
        self._calls += 1
        if self._calls % self.publish_every == 0:
            self.publish()

    def publish(self) -> None:
        self.store.set(READ_KEY, b"".join(_MARK.pack(n) for n in self.cursor))

    def seal(self, rank: int) -> list[Taken]:
        """At exit: close `rank`'s queue for good; what it posted meanwhile, in order (decoded)."""
        found: list[Taken] = []
        while True:
            name = self._next_key(rank)
            payload = bytes(self.store.compare_set(name, "", TOMBSTONE))
            if payload == TOMBSTONE:
                return found
            found.append(records.decode(payload, rank))
            self.store.delete_key(name)
            self.cursor[rank] += 1
