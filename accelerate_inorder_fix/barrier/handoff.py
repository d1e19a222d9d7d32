"""Barrier mode's turns after a `go`: rank r waits for rank r-1's handoff key, emits, sets its own.

Each wait ends at the call's deadline, or T/4 after it began when later; past it, the rank names the break nearest
before it (the first missing rank after the last that handed over), emits and hands over; one that finds that break
further up gives the rank before it T/4 more. Each break is so named by the first survivor after it (or by the
ranks before it, waiting for the last rank). A rank that dies in its turn costs each other rank at most 1.75 T in
all, the absent rule's wait included.
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

    def take(self, call: Call, deadline: float, timeout: float, emit: Callable[[], None]) -> tuple[int, ...]:
        """Wait for the rank before, emit, hand over; wait for the last rank; forget the call before. Returns the
        ranks named for breaking the chain (none: it held); raises what the store raises.

        Args:
            call, deadline: the `go` call and its own deadline (T from its start); timeout: T, in seconds.
            emit: puts this rank's record out.
        """
        store = self.checkin.store
        named = self._wait(call, range(self.rank), deadline, timeout) if self.rank > 0 else None
        emit()
        store.set(call.handoff(self.rank), HANDED)
        after = None  # a break after this rank's turn that no survivor after it names (the last rank dead)
        if self.rank < self.last:
            after = self._wait(call, range(self.rank + 1, self.last + 1), deadline, timeout)
        previous = self.checkin.previous(call)
        if previous > 0:
            store.delete_key(Call(call.site, previous).handoff(self.rank))
        breaks = tuple(q for q in (named, after) if q is not None)
        for q in breaks:
            self._say_broken(call, q, timeout)
            self.checkin.absence.name({q: call.marker}, timeout)
        return breaks

    def _wait(self, call: Call, ranks: range, deadline: float, timeout: float) -> Optional[int]:
        """Wait for the handoff of the last of `ranks`; past it, the break nearest it. When that is not the last, the
        last (behind the break) may hand over about now: T/4 more, then the break nearest it again (None: it came)."""
        clock, key = self.checkin.clock, call.handoff(ranks[-1])
        if self.checkin.wait_for(key, max(deadline, clock() + timeout * LATE_WAIT)):
            return None
        named = self._last_break(call, ranks)
        if named is not None and named < ranks[-1]:
            if self.checkin.wait_for(key, clock() + timeout * LATE_WAIT):
                return None
            named = self._last_break(call, ranks)
        return named

    def _last_break(self, call: Call, ranks: range) -> Optional[int]:
        """The first of `ranks` missing after the last whose handoff is in the store (None: the last came, just now),
        read last, so it was still missing when named. Breaks before it were named by the survivors after them; the
        ranks after it wait behind it. One check per rank it reads back, one more for the break."""
        store = self.checkin.store
        while True:
            last = next((q for q in reversed(ranks) if store.check([call.handoff(q)])), ranks[0] - 1)
            if last == ranks[-1]:
                return None
            if not store.check([call.handoff(last + 1)]):
                return last + 1
            # it handed over while the ones after it were read: read again (each round, a rank handed over)

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
