"""This process's barrier-mode side: its check-in, the turns after a `go`, and the warnings a call given up leaves behind."""

from __future__ import annotations

from typing import Callable, Optional, Union

from .._callsite import Site
from .._diagnostics import COLLECTIVE, TIMEOUT_ENV, CallWarning, site_text, warn_once
from ..store.connection import Store
from .checkin import CheckIn, Verdict
from .handoff import Handoff, after_check_in, turn_on_wake


class BarrierSide:
    """Checks each barrier-mode call in through the job's store (`checkin`), and says why one was given up.

    Args:
        store: this process's connection to the job's store (prefixed).
        rank, world_size: this process's place in the job.
        reconnect (`Callable[[], Store]`, *optional*): a fresh connection, for a check-in whose own failed.
    """

    def __init__(
        self, store: Store, rank: int, world_size: int, reconnect: Optional[Callable[[], Store]] = None
    ) -> None:
        self.checkin = CheckIn(store, rank, world_size, reconnect=reconnect)

    def check_in(
        self, site: Site, timeout: float, record: Callable[[], None], deadline: Optional[float] = None
    ) -> Union[str, Handoff]:
        """Every rank checked in: the turns, handed over through the store; `"skip"`: some rank did not.
        `record` puts this rank's record out (once), if its turn comes in the check-in (`turn_on_wake`).
        `deadline` (`CheckIn.verdict`): the call's, when it began before the check-in."""
        verdict = self.checkin.verdict(site, timeout, turn_on_wake(self.checkin, record), deadline)
        if not verdict.go:
            say_skipped(self.checkin, site, verdict, timeout)
        return after_check_in(self.checkin, site, verdict, timeout)


def say_skipped(side: CheckIn, site: Site, verdict: Verdict, timeout: float) -> None:
    """One line per diverged site and rank that has something to say; a retired site says nothing more."""
    where = site_text(site)
    rank = side.rank
    tail = "this call's records are printed unordered on each rank, and so are those of every later in_order call from this line"
    named = tuple(sorted(verdict.missing))
    callers = [q for q in range(side.world_size) if q not in verdict.missing]
    speaker = verdict.decider if verdict.decider in callers else (callers[:1] or [rank])[0]
    if verdict.why == "damaged":
        text = CallWarning(where, (rank,), "found something else in the job's store at its check-in", None, tail)
    elif verdict.why == "store":
        text = CallWarning(where, (verdict.decider,), "lost its store connection during the check-in", None, tail)
    elif rank in verdict.missing:
        text = CallWarning(where, (rank,), "came after the call had been given up", 0, tail, COLLECTIVE)
    elif rank != speaker or verdict.why == "retired":
        return
    elif verdict.why == "cycle":
        text = CallWarning(
            where,
            named,
            f"had not made it, waiting at another in_order call ({verdict.other}) for the ranks here",
            timeout / 2,
            f"the call was given up halfway through the wait so that the other could go on; {tail}",
            COLLECTIVE,
        )
    elif verdict.why == "timeout" and not verdict.missing:
        text = CallWarning(
            where,
            (),
            f"every rank came to it, but one stopped in its check-in (it died, or hangs) and the call was not "
            f"decided within {timeout:g} s ({TIMEOUT_ENV})",
            timeout,
            tail,
        )
    elif verdict.why == "absent":
        text = CallWarning(
            where,
            named,
            f"had not made it, missing since an earlier in_order call and not back within half of {TIMEOUT_ENV} in all",
            timeout / 2,
            tail,
            COLLECTIVE,
        )
    else:
        text = CallWarning(
            where, named, f"did not make it within {timeout:g} s ({TIMEOUT_ENV})", timeout, tail, COLLECTIVE
        )
    warn_once(text, key=("checkin", site))
