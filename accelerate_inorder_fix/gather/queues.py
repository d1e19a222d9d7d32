"""Gather mode's queues in the job's c10d store: each rank writes its own keys, the main process reads them.

Rank r's n-th record lives in `q/r/n` (its first `CHUNK` bytes) and `q/r/n/1`, `q/r/n/2`, ... (the
rest); the main process acknowledges what it read of r in `a/r/1`, `a/r/2`, ...; no key is written by
two ranks. Every value is at most `CHUNK` bytes and every request carries at most `PER_REQUEST` of
them, so no request nears the store's payload limit, whatever the record sizes and rank count. The
protocol, step by step: docs/gather-mode.md.
"""

from __future__ import annotations

import time
from typing import Optional, Union

from .. import bounds
from ..store.connection import Store, wait_until


STORE_LIMIT = 8 * 1024 * 1024  # torch's TCPStore resets a connection whose request holds a longer value
CHUNK = 16 * 1024  # the most bytes of a record in one key
MOST_PARTS = 256  # keys of the largest record a rank posts (`records.MAX_RECORD` / `CHUNK`; a unit test checks it)
PER_REQUEST = (STORE_LIMIT // 2) // (CHUNK + 256)  # keys a multi_get or multi_set carries: under half the limit
QUEUE = int(bounds.GATHER_QUEUE.value)  # a rank's records in the store, read or not
ACK_EVERY = 16  # records read of a rank between two of its acks
ACK_KEYS = QUEUE // ACK_EVERY + 2  # more acks than a rank can leave unread
SEALED = b"\x00sealed"  # written by the main process at its exit where a rank's next record would go
CLOSED = b"\x00closed"  # written by a rank at its exit where its next record would go


class Refused(str):
    """Why what the main process read in place of a rank's record is none: a head no post writes, or pieces
    missing or of the wrong size. It costs that rank's record; the read moves past it."""


Taken = list[tuple[int, Union[bytes, Refused]]]  # (rank, its record's bytes), a queue that closed none


def record_key(rank: int, n: int, part: int = 0) -> str:
    return f"q/{rank}/{n}/{part}" if part else f"q/{rank}/{n}"


def ack_key(rank: int, j: int) -> str:
    return f"a/{rank}/{j}"


def get_many(store: Store, keys: list[str]) -> list[bytes]:
    """The values of `keys` (all there), `PER_REQUEST` a request (one `get` each where the store has no `multi_get`)."""
    if not hasattr(store, "multi_get"):  # torch before 2.1
        return [bytes(store.get(key)) for key in keys]
    values: list[bytes] = []
    for start in range(0, len(keys), PER_REQUEST):
        values += store.multi_get(keys[start : start + PER_REQUEST])  # bytes already (torch's and the fakes')
    return values


def set_many(store: Store, items: list[tuple[str, bytes]], size: int = PER_REQUEST) -> None:
    """Set each `(key, value)`, `size` a request (one `set` each where the store has no `multi_set`)."""
    for start in range(0, len(items), size):
        batch = items[start : start + size]
        if hasattr(store, "multi_set"):
            store.multi_set([k for k, _ in batch], [v for _, v in batch])
        else:  # torch before 2.1
            for key, value in batch:
                store.set(key, value)


def delete(store: Store, keys: list[str]) -> None:
    """Delete `keys` (missing ones too: no store's answer to that is relied on)."""
    for key in keys:
        store.delete_key(key)


class Outbox:
    """A rank's queue: post its records, delete them once the main process has acknowledged reading them.

    Args:
        store: this rank's connection (prefixed). rank: this rank. bound: records held before a post waits.
    """

    def __init__(self, store: Store, rank: int, bound: int = QUEUE) -> None:
        self.store, self.rank, self.bound = store, rank, bound
        self.sent = self.cleaned = self.acks = 0
        self.parts: dict[int, int] = {}  # n -> keys of each record still in the store

    @property
    def full(self) -> bool:
        return self.sent - self.cleaned >= self.bound

    def post(self, payload: bytes) -> bool:
        """Write `payload` as this rank's next record; False when the main process has sealed the queue."""
        if self.sent % ACK_EVERY == 0 and self.sent > self.cleaned:
            self.learn(0.0)
        n = self.sent
        chunks = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)] or [b""]
        rest = [(record_key(self.rank, n, i), chunks[i]) for i in range(1, len(chunks))]
        set_many(self.store, rest)
        head = b"%d\n" % len(chunks) + chunks[0]
        if bytes(self.store.compare_set(record_key(self.rank, n), "", head)) == SEALED:
            delete(self.store, [k for k, _ in rest])
            return False
        self.parts[n] = len(chunks)
        self.sent += 1
        return True

    def learn(self, seconds: float) -> bool:
        """Take the main process's acks (waiting up to `seconds`, T, for the next, in slices no signal stretches:
        `wait_until`) and delete what they cover.

        True when an ack came.
        """
        if not wait_until(self.store, [ack_key(self.rank, self.acks + 1)], time.monotonic() + seconds, seconds):
            return False
        mark = self.cleaned
        while True:
            key = ack_key(self.rank, self.acks + 1)
            mark = max(mark, int(bytes(self.store.get(key))))
            self.acks += 1  # before the delete: a post asked again after a failure never waits for a deleted ack
            self.store.delete_key(key)
            if not self.store.check([ack_key(self.rank, self.acks + 1)]):
                break
        self._clean(min(mark, self.sent))
        return True

    def _clean(self, below: int) -> None:
        for n in range(self.cleaned, below):
            delete(self.store, [record_key(self.rank, n, part) for part in range(self.parts.pop(n, 1))])
            self.cleaned = n + 1

    def close(self) -> None:
        """At exit: mark the queue closed, or, if the main process sealed it first, delete what is left."""
        self.learn(0.0)
        end = record_key(self.rank, self.sent)
        if bytes(self.store.compare_set(end, "", CLOSED)) == SEALED:
            self._clean(self.sent)
            delete(self.store, [end, *(ack_key(self.rank, self.acks + j) for j in range(1, ACK_KEYS + 1))])


class Inbox:
    """The main process's reading of every rank's queue, in order, and its acks.

    Args:
        store: the main process's connection (prefixed). world_size: ranks in the job.
    """

    def __init__(self, store: Store, world_size: int) -> None:
        self.store = store
        self.next = [0] * world_size  # the next record to read, per rank
        self.acked = [0] * world_size  # the mark of the last ack written, per rank
        self.acks = [0] * world_size  # acks written, per rank
        self.big: list[dict[int, int]] = [{} for _ in range(world_size)]  # keys of records over CHUNK read lately
        self.ended: set[int] = set()  # ranks whose queue is closed or sealed

    def heads(self, ranks: list[int]) -> list[str]:
        return list(map(record_key, ranks, map(self.next.__getitem__, ranks)))

    def present(self, ranks: list[int]) -> list[int]:
        """Those of `ranks` with a next record now (one check each: only when a wait ran out)."""
        return [r for r in ranks if r not in self.ended and self.store.check([record_key(r, self.next[r])])]

    def take(self, ranks: list[int], heads: Optional[list[str]] = None) -> Taken:
        """The next record of each rank in `ranks` (each there; `heads`: their keys), in order; none of a queue that
        closed. A rank's head is checked before anything it claims is read, and its pieces before they are read
        (`check`: no wait): what one rank wrote costs its record alone (`Refused`), in no more reads than an honest one."""
        taken: Taken = []
        rest: list[tuple[int, list[str]]] = []  # (place in `taken`, keys of the rest of a record over CHUNK)
        for rank, head in zip(ranks, get_many(self.store, self.heads(ranks) if heads is None else heads)):
            n = self.next[rank]
            if head == CLOSED:
                self._end(rank)
                continue
            self.next[rank] = n + 1
            if head[:2] == b"1\n" and len(head) <= CHUNK + 2:  # one piece: most records
                taken.append((rank, head[2:]))
                continue
            parts, first = split_head(head)
            if parts > 1:
                big = self.big[rank] = {k: v for k, v in self.big[rank].items() if k > n - QUEUE}
                big[n] = parts
                keys = [record_key(rank, n, i) for i in range(1, parts)]
                if not self.store.check(keys):
                    first = Refused(f"its record's head claims {parts} pieces and they are not all there")
                else:
                    rest.append((len(taken), keys))
            taken.append((rank, first))
        for place, pieces in self._rest(rest):
            rank, start = taken[place]
            taken[place] = (rank, join(start, pieces))  # type: ignore[arg-type]
        return taken

    def _rest(self, rest: list[tuple[int, list[str]]]) -> list[tuple[int, Union[list[bytes], Refused]]]:
        """The pieces of each record in `rest`, in batches; a request that fails is asked again record by record."""
        try:
            chunks = iter(get_many(self.store, [key for _, keys in rest for key in keys]))
            return [(place, [next(chunks) for _ in keys]) for place, keys in rest]
        except Exception:  # one rank's keys went between the check and the read: the others' are read alone
            found: list[tuple[int, Union[list[bytes], Refused]]] = []
            for place, keys in rest:
                try:
                    found.append((place, get_many(self.store, keys)))
                except Exception as exc:
                    found.append((place, Refused(f"its record's pieces could not be read ({exc!r})")))
            return found

    def ack(self) -> None:
        """Acknowledge, in one request, each rank read `ACK_EVERY` records further since its last ack."""
        due = [
            r for r in range(1, len(self.next)) if r not in self.ended and self.next[r] - self.acked[r] >= ACK_EVERY
        ]
        for r in due:
            self.acks[r] += 1
            self.acked[r] = self.next[r]
        set_many(self.store, [(ack_key(r, self.acks[r]), str(self.next[r]).encode()) for r in due], 4096)

    def seal(self, rank: int) -> Taken:
        """At exit: end `rank`'s queue; what it posted before the seal, in order."""
        taken: Taken = []
        while rank not in self.ended:
            answer = bytes(self.store.compare_set(record_key(rank, self.next[rank]), "", SEALED))
            if answer == SEALED:
                self.ended.add(rank)
                self._delete_read(rank)
            else:
                taken += self.take([rank])
        return taken

    def _end(self, rank: int) -> None:
        """`rank` closed its queue: delete its closing marker and whatever of it the main process read."""
        self.ended.add(rank)
        self.store.delete_key(record_key(rank, self.next[rank]))
        self._delete_read(rank)

    def _delete_read(self, rank: int) -> None:
        read = range(max(0, self.next[rank] - QUEUE), self.next[rank])  # the last QUEUE records read
        keys = [record_key(rank, n, part) for n in read for part in range(self.big[rank].get(n, 1))]
        delete(
            self.store,
            keys + [ack_key(rank, j) for j in range(max(1, self.acks[rank] - ACK_KEYS), self.acks[rank] + 1)],
        )
        self.big[rank].clear()


def split_head(head: bytes) -> tuple[int, Union[bytes, Refused]]:
    """`(keys, first piece)` of a record's head `b"<keys>\\n<first piece>"`, checked before anything is read on
    its word: `keys` in 1..MOST_PARTS, written as a post writes it, and the first piece `CHUNK` bytes when
    more follow, at most that otherwise. Anything else is `(1, Refused)`: the read moves past this one key."""
    end = head.find(b"\n", 0, len(str(MOST_PARTS)) + 1)
    count = head[:end] if end > 0 else b""
    parts = int(count) if count.isdigit() and count[:1] != b"0" else 0
    first = head[end + 1 :]
    if not 1 <= parts <= MOST_PARTS:
        shown = repr(head[:24]) + (f" and {len(head) - 24} bytes more" if len(head) > 24 else "")
        return 1, Refused(f"its record's head does not say how many keys it takes ({shown})")
    if len(first) > CHUNK or (parts > 1 and len(first) != CHUNK):
        return 1, Refused(f"its record's head claims {parts} pieces with a first piece of {len(first)} bytes")
    return parts, first


def join(first: bytes, pieces: Union[list[bytes], Refused]) -> Union[bytes, Refused]:
    """A record from its first piece and the rest, each `CHUNK` bytes but the last (1 to `CHUNK`), or `Refused`."""
    if isinstance(pieces, Refused):
        return pieces
    sizes = [len(piece) for piece in pieces]
    if any(size != CHUNK for size in sizes[:-1]) or not 0 < sizes[-1] <= CHUNK:
        return Refused(f"its record's pieces are not of the sizes a post writes ({max(sizes)} bytes at most)")
    return b"".join([first, *pieces])
