"""Barrier mode's turns after a `go`: rank r waits for rank r-1's handoff key, emits, sets its own.

The handoff owns its keys (`h/<site>/<k>/<r>`): each rank sets its own, and deletes its own of the site's last `go`
call (`CheckIn.previous`) once it read this call's `go` (every rank had left that call). Ranks before the last wait for
the last rank's key, so a call returns when every record is out, as upstream's. Each wait ends at the call's deadline,
or a quarter of T after it began when that is later; past it, the rank names the first rank whose handoff is missing,
emits and hands over; past a break before the rank it waits for, it gives that rank a quarter of T more, so the
survivors' records stay in rank order and no rank returns (and exits) while a later one still takes its turn: a rank
that dies in its turn costs each other rank at most 1.75 T in all, the absent rule's wait included.
"""

from __future__ import annotations

from typing import Callable, Optional

from .._diagnostics import CallWarning, site_text, warn_once
from ..config import TIMEOUT_ENV
from .checkin import Call, CheckIn


HANDED = b"ok"
LATE_WAIT = 0.25  # of T: what the turns have at least, after a `go` read late in the call


class Turns:
    """One rank's turns of `go` calls, over its check-in's store and clock.

    Args:
        checkin: this rank's check-in (its store connection, clock, and absent ranks).
    """

    def __init__(self, checkin: CheckIn) -> None:
        self.checkin = checkin
        self.rank, self.last = checkin.rank, checkin.world_size - 1

    def take(self, call: Call, deadline: float, timeout: float, emit: Callable[[], None]) -> Optional[int]:
        """Wait for the rank before, emit, hand over; wait for the last rank; forget the call before.

        Args:
            call: the call whose verdict was `go`.
            deadline: the call's own (T from its start).
            timeout: T, in seconds.
            emit: puts this rank's record out.

        Returns the first rank named for breaking the chain (None: it held); a break after this rank's
            turn is named (said) too. Raises what the store raises.
        """
        store, clock = self.checkin.store, self.checkin.clock
        named = None
        before = call.handoff(self.rank - 1)
        if self.rank > 0 and not self.checkin.wait_for(before, max(deadline, clock() + timeout * LATE_WAIT)):
            named = self._first_missing(call, range(self.rank))
            if (
                named is not None
                and named < self.rank - 1
                and self.checkin.wait_for(before, clock() + timeout * LATE_WAIT)
            ):
                named = None  # the rank right after the break named it, and handed over: the order holds
        emit()
        store.set(call.handoff(self.rank), HANDED)
        after = None  # a break after this rank's turn: named too (a second death is said, not hidden by the first)
        if self.rank < self.last and not self.checkin.wait_for(
            call.handoff(self.last), max(deadline, clock() + timeout * LATE_WAIT)
        ):
            after = self._first_missing(call, range(self.rank + 1, self.last + 1))
            if after is not None and after < self.last:  # the rank right after the break hands over about now
                self.checkin.wait_for(call.handoff(self.last), clock() + timeout * LATE_WAIT)
        previous = self.checkin.previous(call)
        if previous > 0:
            store.delete_key(Call(call.site, previous).handoff(self.rank))
        for q in (named, after):
            if q is not None:
                self._say_broken(call, q, timeout)
                self.checkin.absence.name({q: call.marker}, timeout)
        return named if named is not None else after

    def _first_missing(self, call: Call, ranks: range) -> Optional[int]:
        """The first of `ranks` whose handoff is not in the store (None: all came, just now)."""
        store = self.checkin.store
        return next((q for q in ranks if not store.check([call.handoff(q)])), None)

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
