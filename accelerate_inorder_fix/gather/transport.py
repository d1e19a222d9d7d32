"""How gather-mode records travel: the job's c10d store, on a connection of our own.

Every torch.distributed job already has a key-value store (the rendezvous `TCPStore` torchrun and
`accelerate launch` start on the master node, reachable from every node). Records go there, never
through a process group's collectives: nothing is queued behind NCCL work, no CUDA stream is synced,
and a rank that posts never waits for anyone.

Each rank's records form a queue: key `<rank>/<n>` is that rank's n-th in_order record. Only the
main process reads, in order, and its cost per call must not grow by round trips per rank (a job of
1,024 ranks): for one call it waits on every rank's next key at once and fetches them with one
`multi_get`, where the installed torch has it (older releases: one `get` per key, same behaviour).

The main process deletes nothing. Every `PUBLISH_EVERY` calls it publishes how far it has read each
queue (one key, `read`: a little-endian uint64 per rank), and each rank, every `CLEAN_EVERY` posts,
deletes its own records below that mark. The clean-up cost is spread over the ranks (one delete per
post, amortised), and the store holds, per rank, the records the main process had not read at that
rank's last clean-up plus at most `CLEAN_EVERY + PUBLISH_EVERY`, whatever the number of calls.

The only blocking operation is `wait`, always with an explicit deadline; the connection's own
timeout is bounded too, so a dead store cannot hang a rank for the process group's 30 minutes.

At exit the main process *seals* each queue: it writes a tombstone at the next free key, atomically
(`compare_set`), taking whatever a rank posted there first. A rank posts the same atomic way, so a
record either lands before the seal (the main process emits it) or meets the tombstone (the rank
prints it itself): never both, never neither. The same store carries the main process's mode word,
read once by every rank at its first in_order call.
"""

import datetime
import struct


PREFIX = "accelerate_inorder_fix/"
MODE_KEY = "mode"
TOMBSTONE = b"accelerate_inorder_fix:sealed"
READ_KEY = "read"
PUBLISH_EVERY = 8  # main process: calls between two publications of its read marks
CLEAN_EVERY = 8  # a rank: posts between two clean-ups of what the main process has read
_MARK = struct.Struct("<Q")


def open_store(timeout):
    """`(store, None)` for this job, or `(None, reason)` when it has no c10d store to use."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except ImportError as exc:
        return None, f"torch.distributed is not available ({exc})"
    if not dist.is_available() or not dist.is_initialized():
        return None, "torch.distributed has no default process group"
    try:
        store = distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError) as exc:
        return None, f"the process group has no c10d store ({exc})"
    try:
        # A connection of our own: a bounded wait here never holds the client lock the process
        # group's own store traffic needs, and its timeout can be ours without touching theirs.
        own = store.clone()
    except (RuntimeError, AttributeError):
        own = None
    if own is not None:
        own.set_timeout(datetime.timedelta(seconds=timeout + 5.0))
        store = own
    return dist.PrefixStore(PREFIX, store), None


def key(rank, n):
    return f"{rank}/{n}"


def read_mark(marks, rank):
    """How many of `rank`'s records the main process had read, from a `read` value (0 if not listed)."""
    offset = rank * _MARK.size
    if offset + _MARK.size > len(marks):
        return 0
    return _MARK.unpack_from(marks, offset)[0]


class Outbox:
    """A rank's side: append records to its own queue, and delete those already read. Never waits."""

    def __init__(self, store, rank, clean_every=CLEAN_EVERY):
        self.store, self.rank, self.clean_every = store, rank, clean_every
        self.sent = 0
        self.cleaned = 0  # records below this index are deleted
        self.published = False  # the main process has written READ_KEY (it is never deleted)

    def post(self, payload):
        """Append `payload`; False when the main process has sealed the queue (it has finished)."""
        if bytes(self.store.compare_set(key(self.rank, self.sent), "", payload)) == TOMBSTONE:
            return False
        self.sent += 1
        if self.sent % self.clean_every == 0:
            try:
                self.clean()
            except (RuntimeError, OSError):  # the record is delivered; what was not deleted goes next time
                pass
        return True

    def clean(self):
        """Delete this rank's records the main process has read (`check` until it has published: `get` waits)."""
        self.published = self.published or self.store.check([READ_KEY])
        if not self.published:
            return
        read = min(read_mark(self.store.get(READ_KEY), self.rank), self.sent)
        for n in range(self.cleaned, read):
            self.store.delete_key(key(self.rank, n))
        self.cleaned = max(self.cleaned, read)


class Inbox:
    """The main process's side: read each rank's queue in order, with bounded waits, in batches."""

    def __init__(self, store, world_size, publish_every=PUBLISH_EVERY):
        self.store = store
        self.cursor = [0] * world_size
        self.publish_every = publish_every
        self.batched = callable(getattr(store, "multi_get", None))
        self._settled = 0

    def _next_key(self, rank):
        return key(rank, self.cursor[rank])

    def wait(self, ranks, seconds):
        """Wait up to `seconds` until every rank in `ranks` has a next record; False on timeout."""
        try:
            self.store.wait([self._next_key(r) for r in ranks], datetime.timedelta(seconds=seconds))
        except RuntimeError:  # DistStoreError on timeout (a RuntimeError subclass)
            return False
        return True

    def ready(self, rank):
        """Non-blocking: has `rank` a next record?"""
        return self.store.check([self._next_key(rank)])

    def take(self, rank):
        """The next record payload of `rank` (known to be there)."""
        return self.take_many([rank])[0]

    def take_many(self, ranks):
        """The next record payload of each rank in `ranks` (each known to be there), in one round trip."""
        names = [self._next_key(r) for r in ranks]
        payloads = self.store.multi_get(names) if self.batched else [self.store.get(name) for name in names]
        for rank in ranks:
            self.cursor[rank] += 1
        return payloads

    def settle(self):
        """After a call's block: every `publish_every` calls, tell the ranks how far each queue was read."""
        self._settled += 1
        if self._settled % self.publish_every == 0:
            self.publish()

    def publish(self):
        self.store.set(READ_KEY, b"".join(_MARK.pack(n) for n in self.cursor))

    def seal(self, rank):
        """At exit: close `rank`'s queue for good; the payloads it posted meanwhile, in order."""
        found = []
        while True:
            name = self._next_key(rank)
            payload = bytes(self.store.compare_set(name, "", TOMBSTONE))
            if payload == TOMBSTONE:
                return found
            found.append(payload)
            self.store.delete_key(name)
            self.cursor[rank] += 1


def publish_mode(store, mode):
    """The main process's mode word, for every rank's first in_order call."""
    store.set(MODE_KEY, mode)


def read_mode(store, seconds):
    """The main process's mode word, waiting up to `seconds`; None when it did not come in time."""
    try:
        store.wait([MODE_KEY], datetime.timedelta(seconds=seconds))
    except RuntimeError:  # DistStoreError on timeout
        return None
    return bytes(store.get(MODE_KEY)).decode()
