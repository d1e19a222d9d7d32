"""This process's barrier-mode side: one call, in the order it runs, and the warning a skip leaves.

`BarrierSide.call` checks the call in (`checkin.CheckIn.verdict`), then follows the verdict: a skip
emits at once (said once per site), a `go` takes the turns (`handoff.Turns`). The record is logged in
one place, `_call.emit_at_once`. No collective runs, and a call waits at most 2.75 T.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Callable

from .._call import InOrderCall, emit_at_once
from .._callsite import Site
from .._diagnostics import COLLECTIVE, CallWarning, site_text, warn_once
from ..config import TIMEOUT_ENV
from ..store.connection import Store, hosted_by_rank0
from .checkin import Call, CheckIn, Verdict, Why, site_name
from .handoff import Turns


class BarrierSide:
    """Barrier mode's calls through the job's store: each checked in, then its turns.

    Thread-safe for concurrent calls at different sites (the session serializes one site).

    Args:
        store: this process's connection to the job's store (prefixed for the session).
        rank, world_size: this process's place in the job.
        clock: monotonic seconds (the explorer passes its own).
    """

    def __init__(self, store: Store, rank: int, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.checkin = CheckIn(store, rank, world_size, clock)
        self.turns = Turns(self.checkin)

    def call(self, call: InOrderCall) -> None:
        """One in_order call of this rank: check in, read the verdict, then the turns or the record at once."""
        start = self.checkin.clock()
        counted = Call(site_name(call.site), call.count)
        where, verdict = self.checkin.verdict(counted, start + call.timeout, call.timeout)
        if not verdict.go:
            say_skipped(self.checkin, where, verdict, call.timeout)
            emit_at_once(call)
            return
        out: list[bool] = []  # whether the turn's emit ran (the store may fail after it)

        def emit() -> None:
            out.append(True)
            emit_at_once(call)

        try:
            self.turns.take(where, start + call.timeout, call.timeout, emit)
            self.checkin.forget(where)
        except Exception as exc:  # noqa: BLE001 -- the store failed mid-turns: the record was out, or goes now
            warn_once(
                f"barrier mode lost its store during a call's turns{host_gone(self.checkin)}: {exc!r}", key="lost"
            )
            if not out:
                emit_at_once(call)

    def logged_before_the_word(self, counts: Mapping[Site, int]) -> None:
        """Give up (`Why.WORD`) and count at their sites the calls this rank logged at once before the main process's
        word came, so that the main process's own calls there pair with them (never raises).

        Args:
            counts: {site: this rank's calls there so far}, each logged at once.
        """
        store = self.checkin.store
        try:
            for site, made in counts.items():
                for k in range(1, made + 1):
                    call = Call(site_name(site), k)
                    store.compare_set(call.key, "", Verdict(False, Why.WORD, self.checkin.rank, {0: ""}).encode())
                    store.add(call.counter, 1)
        except Exception as exc:  # noqa: BLE001 -- the store failed: said at this rank's next check-in too
            warn_once(f"barrier mode lost its store{host_gone(self.checkin)}: {exc!r}", key="lost")


_TAIL = "this call's records are printed unordered on each rank, and so are those of every later in_order call from this line"
_ONCE = (
    "this call's records are printed unordered on each rank; the line stays ordered: its next call waits for every "
    "rank again (two calls in a row given up there give the line up)"
)
_WHAT = {
    Why.CYCLE: ("had not made it, waiting at another in_order call ({other}) for the ranks here", 1.0),
    Why.ABSENT: ("had not made it, missing since an earlier in_order call and not back within half of {env}", 0.5),
    Why.TIMEOUT: ("did not make it within {timeout:g} s ({env})", 1.0),
}


def host_gone(side: CheckIn) -> str:
    """Of a store that failed under a rank other than 0: its host, when rank 0 hosts it."""
    if side.rank == 0 or not hosted_by_rank0(side.store):
        return ""
    return " (rank 0, the host of the job's store, died or left, or its server closed the connection; each rank's records come out at once from now)"


def say_skipped(side: CheckIn, call: Call, verdict: Verdict, timeout: float) -> None:
    """One line per given-up site, and one more when a second call in a row there gives the line up: said by the
    lowest rank there (when every rank came, one stopped in it: by the skip's writer); of a retired line, by late ranks."""
    where, rank = site_text(call.site), side.rank
    present = [q for q in range(side.world_size) if q not in verdict.missing]
    if verdict.why in (Why.RETIRED, Why.WORD):  # nothing to say: no rank waited, and the others said why
        return
    retired = call.site in side.retired
    tail = _TAIL if retired else _ONCE
    if verdict.why is Why.STORE:
        text = CallWarning(where, (rank,), f"lost its store at its check-in{host_gone(side)}", None, tail)
        warn_once(text, key="lost")
        return
    if verdict.why is Why.DAMAGED:
        text = CallWarning(where, (rank,), "found something else in the job's store at its check-in", None, tail)
    elif rank in verdict.missing:
        if not retired:
            return  # a late rank: the ranks that were there say it
        text = CallWarning(where, (rank,), "came after the call had been given up", 0, _TAIL, COLLECTIVE)
    elif rank != (verdict.decider if not verdict.missing and verdict.decider >= 0 else (present or [rank])[0]):
        return  # said once: by the lowest rank there; when every rank came, by the skip's writer (alive)
    elif not verdict.missing:
        event = f"every rank came to it, but one stopped in its check-in (it died, or hangs) within {timeout:g} s ({TIMEOUT_ENV})"
        text = CallWarning(where, (), event, timeout, tail)
    else:
        what, share = _WHAT.get(verdict.why, _WHAT[Why.TIMEOUT])
        event = what.format(other=site_text(verdict.other.rpartition("/")[0]), timeout=timeout, env=TIMEOUT_ENV)
        text = CallWarning(where, tuple(sorted(verdict.missing)), event, timeout * share, tail, COLLECTIVE)
    if retired and warn_once(text, key=("checkin", call.site)) is False:
        event = "missed two calls in a row here (a call skipped, not only late)"
        text = CallWarning(where, tuple(sorted(verdict.missing)), event, text.cost, _TAIL, COLLECTIVE)
        warn_once(text, key=("checkin", call.site, "retired"))
        return
    warn_once(text, key=("checkin", call.site))
