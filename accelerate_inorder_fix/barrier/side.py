"""This process's barrier-mode side: its check-in, the turns after a `go`, and the warnings a call given up leaves behind."""

from __future__ import annotations

from typing import Callable, Optional, Union

from .._callsite import Site
from .._diagnostics import warn_once
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

    def check_in(self, site: Site, timeout: float, record: Callable[[], None]) -> Union[str, Handoff]:
        """Every rank checked in: the turns, handed over through the store; `"skip"`: some rank did not.
        `record` puts this rank's record out (once), if its turn comes in the check-in (`turn_on_wake`)."""
        verdict = self.checkin.verdict(site, timeout, turn_on_wake(self.checkin, record))
        if not verdict.go:
            say_skipped(self.checkin, site, verdict, timeout)
        return after_check_in(self.checkin, site, verdict, timeout)


def say_skipped(side: CheckIn, site: Site, verdict: Verdict, timeout: float) -> None:
    """One line per diverged site and rank that has something to say; a retired site says nothing more."""
    where = f"{site[0]}:{site[2]} ({site[1]})"
    rank = side.rank
    tail = "logged unordered, without barriers, here and at every later in_order call from this line"
    named = ", ".join(map(str, sorted(verdict.missing)))
    callers = [q for q in range(side.world_size) if q not in verdict.missing]
    speaker = verdict.decider if verdict.decider in callers else (callers[:1] or [rank])[0]
    if verdict.why == "damaged":
        text = f"rank {rank}: the in_order check-in at {where} found something else in the job's store; {tail}"
    elif verdict.why == "store":
        text = f"rank {rank}: the in_order check-in at {where} lost rank {verdict.decider}'s store connection; {tail}"
    elif rank in verdict.missing:
        text = f"rank {rank}: the in_order call at {where} had been given up before this rank made it; {tail}"
    elif rank != speaker or verdict.why == "retired":
        return
    elif verdict.why == "cycle":
        text = (
            f"in_order call at {where}: rank(s) {named} had not made it and were waiting at another in_order call "
            f"({verdict.other}) for the ranks here; given up halfway through the wait so that one could go on; {tail}"
        )
    elif verdict.why == "timeout" and not verdict.missing:
        text = (
            f"in_order call at {where}: every rank came to it, but one stopped in its check-in (it died, or hangs) "
            f"and the call was not decided within {timeout:g} s (ACCELERATE_INORDER_TIMEOUT); {tail}."
        )
    elif verdict.why == "absent":
        text = (
            f"in_order call at {where}: rank(s) {named} had not made it, missing since an earlier in_order call "
            f"and not back within half of ACCELERATE_INORDER_TIMEOUT ({timeout:g} s) in all; {tail}."
        )
    else:
        text = (
            f"in_order call at {where}: rank(s) {named} did not make it within {timeout:g} s "
            f"(ACCELERATE_INORDER_TIMEOUT); {tail}. An in_order call is collective: every rank must make it."
        )
    warn_once(("checkin", site), text)
