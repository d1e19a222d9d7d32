"""How gather-mode records travel: the job's c10d store, on a connection of our own.

Every torch.distributed job already has a key-value store (the rendezvous `TCPStore` torchrun and
`accelerate launch` start on the master node, reachable from every node). Records go there, never
through a process group's collectives: nothing is queued behind NCCL work, no CUDA stream is synced,
and a rank that posts never waits for anyone.

Each rank's records form a queue: key `<rank>/<n>` is that rank's n-th in_order record. Only the
main process reads, in order, and deletes what it read, so the store holds at most the records
not yet emitted. The only blocking operation is `wait`, always with an explicit deadline; the
connection's own timeout is bounded too, so a dead store cannot hang a rank for the process
group's 30 minutes.
"""

import datetime


PREFIX = "accelerate_inorder_fix/"


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


class Outbox:
    """A rank's side: append records to its own queue. Never waits for another rank."""

    def __init__(self, store, rank):
        self.store, self.rank, self.sent = store, rank, 0

    def post(self, payload):
        self.store.set(key(self.rank, self.sent), payload)
        self.sent += 1


class Inbox:
    """The main process's side: read each rank's queue in order, with bounded waits."""

    def __init__(self, store, world_size):
        self.store = store
        self.cursor = [0] * world_size

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
        """The next record payload of `rank` (known to be there); removed from the store."""
        name = self._next_key(rank)
        payload = self.store.get(name)
        self.store.delete_key(name)
        self.cursor[rank] += 1
        return payload
