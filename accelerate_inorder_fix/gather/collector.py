"""The main process's side of gather mode: assemble each in_order call's block and emit it.

A call is named by its *identity*: the call site plus how many times this rank has called from that
site. Every rank computes it alone, so records pair up by what the user wrote, not by arrival order:
a rank that skips one call (a user error) shifts nothing but that one call.

For its own call `identity`, the main process takes each other rank's queue in order until it finds
that rank's record of `identity`, or the deadline passes. Records met on the way belong elsewhere:
- to a call already closed (they came late): emitted at once, as a block of their own;
- to a call the main process has not made (yet): kept, used when it makes it, flushed at exit.
Then the block goes out in rank order, followed, if ranks are missing, by one warning naming them.

Only the main process waits, and only for a bounded time. A rank that missed a deadline is "absent":
the next calls do not wait for it (a crashed rank costs one timeout, not one per call) but still take
whatever it sent; it is waited for again as soon as one of its records arrives in time.
"""

import logging
import time

from . import records as _records


def describe(identity):
    (filename, function, line), count = identity
    return f"{filename}:{line} in {function} (call {count} from there)"


class Collector:
    def __init__(self, inbox, world_size, timeout, warn):
        self.inbox, self.world_size, self.timeout, self.warn = inbox, world_size, timeout, warn
        self.pending = {}  # identity -> {rank: record or None}, in first-seen order
        self.closed = set()  # identities whose block is out (kept only for incomplete blocks)
        self.absent = set()

    # -- reading the queues -----------------------------------------------------------------

    def _route(self, rank, payload, current):
        try:
            identity, record = _records.from_bytes(payload)
        except _records.MalformedRecord as exc:  # foreign bytes where this rank's next record should be
            text = f"rank {rank} sent something that is not an in_order record ({exc}); it was ignored"
            if current is None:
                self.warn(text)
                return
            self.warn(f"{text} and counted as rank {rank}'s empty record of the call at {describe(current)}")
            identity, record = current, None
        if identity in self.closed:
            if record is not None:
                _records.emit(record)  # late: its block is out, so it goes alone, not into another
            return
        self.pending.setdefault(identity, {})[rank] = record
        return identity == current

    def _drain(self, rank, current, block):
        """Take what `rank` has sent, without waiting, until its record of `current` is found."""
        while rank not in block and self.inbox.ready(rank):
            if self._route(rank, self.inbox.take(rank), current):
                block[rank] = self.pending[current].pop(rank)

    def _collect(self, identity, block):
        deadline = time.monotonic() + self.timeout
        while True:
            need = [r for r in range(self.world_size) if r not in block]
            waitable = [r for r in need if r not in self.absent]
            remaining = deadline - time.monotonic()
            if not waitable or remaining <= 0 or not self.inbox.wait(waitable, remaining):
                break
            for rank in waitable:  # each has a next record now: take one, it may be for another call
                if self._route(rank, self.inbox.take(rank), identity):
                    block[rank] = self.pending[identity].pop(rank)
        # Deadline passed (or only absent ranks are left): whatever has arrived, without waiting.
        for rank in [r for r in range(self.world_size) if r not in block]:
            self._drain(rank, identity, block)

    # -- one call ---------------------------------------------------------------------------

    def block(self, identity, own):
        """The main process's own call `identity`; `own` is its record (or None)."""
        block = {0: own}
        block.update(self.pending.pop(identity, {}))
        self.pending[identity] = {}
        try:
            self._collect(identity, block)
        except Exception as exc:  # the store went away: what was collected still goes out
            self.warn(f"in_order call at {describe(identity)}: could not read the other ranks' records ({exc!r})")
        self.pending.pop(identity, None)
        self._emit_block(block)
        missing = [r for r in range(self.world_size) if r not in block]
        self.absent.difference_update(block)
        if missing:
            self.closed.add(identity)
            if not self.absent.issuperset(missing):
                self.warn(
                    f"in_order call at {describe(identity)}: no record from rank(s) "
                    f"{', '.join(map(str, missing))} within {self.timeout:g} s (ACCELERATE_INORDER_TIMEOUT); "
                    "the other ranks' records are above, in rank order. A record that arrives later is "
                    "emitted on its own."
                )
            self.absent.update(missing)

    def _emit_block(self, block):
        for rank in sorted(block):
            if block[rank] is not None:
                _records.emit(block[rank])

    # -- exit -------------------------------------------------------------------------------

    def flush(self):
        """At exit: emit every record delivered but not yet emitted (calls this process never made)."""
        for rank in range(1, self.world_size):
            self._drain(rank, None, {})
        leftovers = [(identity, block) for identity, block in self.pending.items() if block]
        self.pending.clear()
        if not leftovers:
            return
        for _, block in leftovers:
            self._emit_block(block)
        self.warn(
            "records of in_order calls the main process never made were emitted at exit: "
            + "; ".join(
                f"{describe(identity)} from rank(s) {', '.join(map(str, sorted(block)))}"
                for identity, block in leftovers
            )
        )


def warning_record(name, text):
    """A WARNING record for the main process's handlers, from this package."""
    return logging.makeLogRecord(
        {
            "name": name,
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": f"accelerate-inorder-fix: {text}",
            "args": None,
            "funcName": "accelerate_inorder_fix",
        }
    )
