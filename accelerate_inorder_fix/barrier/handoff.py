"""Barrier mode's turns after a `go`: rank r waits for rank r-1's handoff key, emits, sets its own.

Each wait ends at the call's deadline, or T/4 after it began when later; past it, the rank names the first rank
whose handoff is missing, emits and hands over; one that finds the break further up gives the rank before it T/4
more. A rank that dies in its turn costs each other rank at most 1.75 T in all, the absent rule's wait included.
"""

from __future__ import annotations

from typing import Callable, Optional

from .._diagnostics import CallWarning, site_text, warn_once
from ..config import TIMEOUT_ENV
from .checkin import Call, CheckIn


HANDED = b"ok"
LATE_WAIT = 0.25  # of T: what the turns have at least, after a `go` read late in the call


class Turns:
    """One rank's turns of `go` calls, over its check-in's (`checkin`) store, clock and absent ranks."""

    def __init__(self, checkin: CheckIn) -> None:
        self.checkin = checkin
        self.rank, self.last = checkin.rank, checkin.world_size - 1

    def take(self, call: Call, deadline: float, timeout: float, emit: Callable[[], None]) -> Optional[int]:
        """Wait for the rank before, emit, hand over; wait for the last rank; forget the call before. Returns the
        first rank named for breaking the chain (None: it held); raises what the store raises.

        Args:
            call, deadline: the `go` call and its own deadline (T from its start); timeout: T, in seconds.
            emit: puts this rank's record out.
        """
        store = self.checkin.store
        named = self._wait(call, range(self.rank), deadline, timeout, False) if self.rank > 0 else None
        emit()
        store.set(call.handoff(self.rank), HANDED)
        after = None  # a break after this rank's turn: named too (a second death is said, not hidden by the first)
        if self.rank < self.last:
            after = self._wait(call, range(self.rank + 1, self.last + 1), deadline, timeout, True)
        previous = self.checkin.previous(call)
        if previous > 0:
            store.delete_key(Call(call.site, previous).handoff(self.rank))
        for q in (named, after):
            if q is not None:
                self._say_broken(call, q, timeout)
                self.checkin.absence.name({q: call.marker}, timeout)
        return named if named is not None else after

    def _wait(self, call: Call, ranks: range, deadline: float, timeout: float, keep: bool) -> Optional[int]:
        """Wait for the handoff of the last of `ranks`; past it, the first of them missing. When that is not the last,
        the last (right after the break) hands over about now: T/4 more, and a break it then named is not (`keep`)."""
        clock, key = self.checkin.clock, call.handoff(ranks[-1])
        if self.checkin.wait_for(key, max(deadline, clock() + timeout * LATE_WAIT)):
            return None
        named = self._first_missing(call, ranks)
        if named is not None and named < ranks[-1] and self.checkin.wait_for(key, clock() + timeout * LATE_WAIT):
            return named if keep else None
        return named

    def _first_missing(self, call: Call, ranks: range) -> Optional[int]:
        """The first of `ranks` whose handoff is not in the store (None: all came, just now)."""
        return next((q for q in ranks if not self.checkin.store.check([call.handoff(q)])), None)

    def _say_broken(self, call: Call, named: int, timeout: float) -> None:
        then = "took its turn and handed over" if self.rank > named else "returned"
        warn_once(
            CallWarning(
                f"{site_text(call.site)} (call {call.k} from there)",
                (named,),
                f"did not hand over its turn within {TIMEOUT_ENV} (it died, or its log handlers hang)",
                timeout,
                f"rank {self.rank} {then} without it; the records of ranks after rank {named} may be out of order",
            ),
            key=("handoff", call.site, named),
        )
