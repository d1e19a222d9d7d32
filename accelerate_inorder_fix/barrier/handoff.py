"""Barrier mode's turns after a `go`, passed point to point through the job's store: no collective.

A `go` says every rank is in the call, and that rank 0's record is out (rank 0 emits before it checks
in). So the turns need no barrier: rank r waits for rank r-1's handoff and nobody else's. One key per
rank 1..N-1 and call, `b/h/<site>/<k>/<r>` (`checkin.Call.handoff`)::

    rank 0        its record went out before the check-in; its check-in waits at h/<N-1>: the call's end
    rank 1        its check-in waits at the verdict key; on the write: emit; set h/1 "ok"; read the verdict
    rank r > 1    its check-in waits at h/<r-1>; on the write: emit; set h/<r> "ok"; read the verdict
    rank 0<r<N-1  then wait h/<N-1>: the call returns once every rank's record is out

**The turn comes with the wake** (`checkin.Arrival.woken`). The write that ends a rank's check-in wait at its wake key (`CheckIn._wake_key`) is the verdict (rank 1), rank r-1's handoff, or a
skip (written into every handoff key of a call given up). In a `go` it is this rank's turn, so the rank
emits and hands over before it reads the verdict (`side.BarrierSide`, between `CheckIn.arrive` and
`CheckIn.settle`): a handoff costs the next rank no round trip. In a
skip the records go out at once anyway, so a turn taken early changes nothing: every rank decides by
the verdict key, never by a handoff's value. Every write to a wake key follows the call's verdict, so
the verdict is there to read. A rank whose `go` did not come that way (it wrote the `go` itself, or
read it after a timeout) takes its turn here (`Handoff.take_turns`): it waits for rank r-1's key.

**The store stays bounded.** A rank deletes its handoff key of call k-2 when it checks in at call k
(`CheckIn._forget_handoff`): call k-1 went (a skip retires the site), so every rank has left call k-2.
At rest a site holds 2(N-1) handoff keys, and a retired site those of its last `go` and of its skip.

**A rank that does not hand over** (it died, or its handlers hang) costs each other rank at most 1.5 T in all
(`bounds.DEATH`), with the check-in's absent rule.
Every wait of a call, check-in and turns, ends at the check-in's deadline, T after it began; a rank
that comes to a wait in its last quarter (its `go` came late, or its own handlers were slow) waits a
quarter of T from then, so that a healthy chain is not cut short. A rank whose wait runs out looks for
the first rank whose handoff is missing (`check`, which wakes nobody). If that is the rank it waits
for, it names it, takes its turn and hands over, so the ranks after it go on at once. If the break is
further up, the rank right after the break is doing just that: it waits a quarter of T more for it, so
the survivors' records stay in rank order and one rank names the one that broke the chain (every rank
waiting for the last one, when that was the last). A break before a rank's own turn is one it has
stepped over: its wait for the last rank looks only past itself (`_first_missing`). So a call waits T at
most, 1.25 T past a break, 1.5 T when it also came late. The named rank is *absent* for the check-in (`CheckIn.named`): until it
checks in again, the next call gives up at once instead of waiting for it again.

**Junk in a handoff key** wakes its waiter, which takes its turn: that call's order may not hold (a
rank that waited for its turn after its check-in says so once); no record is lost or repeated, no
wait grows. Junk there before any verdict gives the call up ("damaged").

**A log handler may log in_order** in its rank's turn: that call's check-in runs inside this one, with an
`Arrival` of its own; what this call's turns need (its deadline, its wake, its tidy-up) is this call's
`Arrival`, which the inner call never touches.
"""

from __future__ import annotations

from typing import Callable, Optional

from .._diagnostics import CallWarning, site_text, warn_once
from ..config import TIMEOUT_ENV
from ..store.connection import peek
from .checkin import HANDED, Arrival, CheckIn


LATE_WAIT = 0.25  # of the timeout: what a wait has at least when a rank comes to it late, and past a break


class Handoff:
    """One rank's turns of one `go` call, after its check-in (`CheckIn.settle` read the `go`).

    Args:
        side: this rank's check-in.
        arrival: its arrival at the call: the call, its deadline, whether its turn came with the wake.

    Attributes:
        named: the first rank this one named for not handing over (None: the chain held).
    """

    def __init__(self, side: CheckIn, arrival: Arrival) -> None:
        self.side, self.arrival, self.call = side, arrival, arrival.call
        self.rank, self.last = side.rank, side.world_size - 1
        self.deadline, self.woken, self.grace = arrival.deadline, arrival.woken, arrival.timeout * LATE_WAIT
        self.named: Optional[int] = None

    def take_turns(self, emit: Callable[[], None]) -> None:
        """This rank's turn, unless it came with the check-in's wake (rank r > 1 waits for the rank before,
        emits, hands over); the go's tidy-up (`CheckIn.tidy_up`); then the wait for the last rank's handoff.
        `emit` puts this rank's record out, once however often called."""
        try:
            if self.rank > 0 and not self.woken:
                if self.rank > 1:
                    self._receive(self.rank - 1)
                emit()
                self.side.store.set(self.call.handoff(self.rank), HANDED)
            self.side.tidy_up(self.arrival)
            if self.rank < self.last and not (self.rank == 0 and self.woken):
                self._receive(self.last)
        except Exception as exc:  # noqa: BLE001 -- the store failed under us: the record goes out all the same
            warn_once(
                CallWarning(
                    site_text(self.call.site),
                    (self.rank,),
                    f"lost its turn's handoff to the store ({exc!r})",
                    None,
                    "this rank's record is printed at once, unordered",
                ),
                key=("handoff", type(exc)),
            )
            emit()

    def _receive(self, m: int) -> None:
        """Wait for rank `m`'s handoff until the call's deadline (or a quarter timeout, if this rank comes
        to the wait late); past it, name the rank that broke the chain. When that is a rank before `m`,
        the rank right after it is giving up about now: a quarter timeout more keeps the order."""
        if self._arrived(m, max(self.deadline, self.side.clock() + self.grace)):
            return
        first = self._first_missing(m)
        if first is not None and first < m:
            first = None if self._arrived(m, self.side.clock() + self.grace) else self._first_missing(m)
        if first is not None:
            self._give_up(first)

    def _arrived(self, m: int, deadline: float) -> bool:
        """Whether rank `m`'s handoff is there by the deadline; its only waiter, rank m+1, reads it for junk."""
        key = self.call.handoff(m)
        if not self.side.wait_for(key, deadline):
            return False
        if m == self.rank - 1 and peek(self.side.store, key) not in (HANDED, None):
            self._say_damaged(m)
        return True

    def _first_missing(self, m: int) -> Optional[int]:
        """The first rank, up to `m`, whose handoff is not in the store; None when all are (rank m's came just now).
        Past this rank's own turn: a break before it is one this rank has stepped over (it named it, or
        the rank after it did), and is waited for no more."""
        store = self.side.store
        first = self.rank + 1 if m > self.rank else 1
        return next((q for q in range(first, m + 1) if not store.check([self.call.handoff(q)])), None)

    def _give_up(self, missing: int) -> None:
        if self.named is None:
            self.named = missing
        self.side.named(missing, self.deadline)
        then = "takes its turn and hands over" if self.rank > missing else "returns"
        warn_once(
            CallWarning(
                f"{site_text(self.call.site)} (call {self.call.k} from there)",
                (missing,),
                f"did not hand over its turn within {TIMEOUT_ENV} (it died, or its log handlers hang)",
                self.grace / LATE_WAIT,
                f"rank {self.rank} {then} without it; the records of ranks after rank {missing} may be out of order",
            ),
            key=("handoff", self.call.site, missing),
        )

    def _say_damaged(self, m: int) -> None:
        warn_once(
            CallWarning(
                site_text(self.call.site),
                (m,),
                "left a handoff in the job's store that holds something else",
                0,
                "this call's records may be out of rank order",
            ),
            key=("handoff-damaged", self.call.site),
        )
