"""This process's barrier-mode side: one call, top to bottom, and the warnings a call given up leaves behind.

`BarrierSide.call` reads in the order it runs: rank 0's turn (its record out before it checks in, so
that a `go` also says rank 0's is out); the check-in (`checkin.CheckIn.arrive`), which for rank r >= 1
in a `go` ends on the write that is its turn, taken then, before the verdict is read
(`checkin.CheckIn.settle`); on a skip, the record at once; on a `go`, the other turns, handed over
through the store, and the go's tidy-up (`handoff.Handoff`). No collective runs.
"""

from __future__ import annotations

from typing import Callable, Optional

from .._call import InOrderCall
from .._callsite import Site
from .._diagnostics import COLLECTIVE, CallWarning, site_text, warn_once
from ..config import TIMEOUT_ENV
from ..store.connection import Store
from .checkin import Arrival, CheckIn, Verdict, Why
from .handoff import Handoff
from .turns import EmitOnce


class BarrierSide:
    """Barrier mode's calls through the job's store: each checked in (`checkin`), then its turns (`handoff`).

    Args:
        store: this process's connection to the job's store (prefixed).
        rank, world_size: this process's place in the job.
        reconnect (`Callable[[], Store]`, *optional*): a fresh connection, for a check-in whose own failed.
    """

    def __init__(
        self, store: Store, rank: int, world_size: int, reconnect: Optional[Callable[[], Store]] = None
    ) -> None:
        self.checkin = CheckIn(store, rank, world_size, reconnect=reconnect)

    def call(self, call: InOrderCall) -> None:
        """One in_order call of this rank: rank 0's turn, the check-in, then a skip's emit or the go's turns."""
        record = EmitOnce(call.log, call.origin)
        if self.checkin.rank == 0:
            record.emit()
        arrival, verdict = self._check_in(call, record)
        if not verdict.go:  # some rank will not come: nobody waits for anyone in this call
            say_skipped(self.checkin, call.site, verdict, call.timeout)
            record.emit()
            return
        self._take_turns(arrival, record)

    def _check_in(self, call: InOrderCall, record: EmitOnce) -> tuple[Arrival, Verdict]:
        """The call's check-in, and the verdict every rank follows. Rank r >= 1 whose wait ended on its wake
        key takes its turn in between: it emits and hands over, then reads the verdict (in a skip that only
        puts its record out early)."""
        arrival = self.checkin.arrive(call.site, call.count, call.timeout)
        if arrival.woken and self.checkin.rank > 0:
            record.emit()
            self.checkin.hand_over(arrival)
        return arrival, self.checkin.settle(arrival)

    def _take_turns(self, arrival: Arrival, record: EmitOnce) -> None:
        """A `go`: this rank's turn unless it came with the wake, the go's tidy-up, the wait for the call's end."""
        Handoff(self.checkin, arrival).take_turns(record.emit)


# What the deciding rank says of the ranks that did not make a call, by why it was given up: what
# happened, its cost as a share of the timeout, and what came first in what happens next.
_GIVEN_UP = {
    Why.CYCLE: (
        "had not made it, waiting at another in_order call ({other}) for the ranks here",
        0.5,
        "the call was given up halfway through the wait so that the other could go on; ",
    ),
    Why.ABSENT: (
        "had not made it, missing since an earlier in_order call and not back within half of {env} in all",
        0.5,
        "",
    ),
}
_NOT_MADE = ("did not make it within {timeout:g} s ({env})", 1.0, "")


def say_skipped(side: CheckIn, site: Site, verdict: Verdict, timeout: float) -> None:
    """One line per diverged site and rank that has something to say; a retired site says nothing more."""
    where = site_text(site)
    rank = side.rank
    tail = "this call's records are printed unordered on each rank, and so are those of every later in_order call from this line"
    named = tuple(sorted(verdict.missing))
    callers = [q for q in range(side.world_size) if q not in verdict.missing]
    speaker = verdict.decider if verdict.decider in callers else (callers[:1] or [rank])[0]
    if verdict.why is Why.DAMAGED:
        text = CallWarning(where, (rank,), "found something else in the job's store at its check-in", None, tail)
    elif verdict.why is Why.STORE:
        text = CallWarning(where, (verdict.decider,), "lost its store connection during the check-in", None, tail)
    elif rank in verdict.missing:
        text = CallWarning(where, (rank,), "came after the call had been given up", 0, tail, COLLECTIVE)
    elif rank != speaker or verdict.why is Why.RETIRED:
        return
    elif verdict.why is Why.TIMEOUT and not verdict.missing:
        text = CallWarning(
            where,
            (),
            f"every rank came to it, but one stopped in its check-in (it died, or hangs) and the call was not "
            f"decided within {timeout:g} s ({TIMEOUT_ENV})",
            timeout,
            tail,
        )
    else:
        what, share, before_tail = _GIVEN_UP.get(verdict.why, _NOT_MADE)
        text = CallWarning(
            where,
            named,
            what.format(other=verdict.other, timeout=timeout, env=TIMEOUT_ENV),
            timeout * share,
            before_tail + tail,
            COLLECTIVE,
        )
    warn_once(text, key=("checkin", site))
