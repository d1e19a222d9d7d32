"""Barrier mode's check-in: before any turn, every rank agrees through the job's store whether the turns run.

Barrier mode is N turns, one rank's record in each, in rank order. A rank that does not make the call
(`if accelerator.is_main_process:`, a skipped iteration) would leave the others waiting for its turn,
or, where the turns are upstream's barriers, in a barrier that its own next collective pairs with: the
job hangs, or desynchronises. So each rank first checks the call in, and one verdict per call decides
for every rank: `go` (every rank is here: the turns run, handed over through the store, `handoff`)
or `skip` (nobody waits for anyone in this call; each rank emits at once).

Two rules make it safe, whatever the schedule:

1. **The verdict is the first value of the call's verdict key**, written with `compare_set`, so every
   rank reads the same bytes: a rank that gives up and the last rank to arrive race, and one of them
   wins for everybody. Anything but `go` there (a `skip`, or junk) is a skip, on every rank.
2. **Only a rank that counted all N arrivals writes `go`.** Then every rank is in the call and will
   read the verdict; a rank that was not here cannot be waited for.

Any rank may give up at any time (rule 1 keeps that safe), so every wait is bounded: at its deadline
a rank writes `skip` and reads what won. Keys, under `accelerate_inorder_fix/b/` (N ranks, timeout T,
call k of a site, counted by each rank for itself)::

    rank r, call k at site S                    store
    set  w/<r>       "S/k"                      where r is (before it counts itself: see `_missing`)
    add  s/S/n       1          -> a            every arrival ever at S: call k's last sees a == k*N
    a == k*N:  compare_set s/S/k "" "go"        the verdict; then delete s/S/<k-1> (everyone left it)
    otherwise: wait at its wake key until T/2, look for a wait-for cycle (`_halfway`), wait until T,
               then compare_set s/S/k "" "skip ..."; follow whatever s/S/k holds

Only rank 1 waits at the verdict key itself; rank r > 1 waits at rank r-1's handoff key, rank 0 at the
last rank's (`_wake_key`): a `go` reaches them as the write they wait for next (their turn, or the
call's end), and a skip is written into every handoff key too. On that write the check-in returns
(`arrive`: an `Arrival` that is `woken`); rank r >= 1 takes its turn then, in its call's own step
(`side.BarrierSide`), hands over (`hand_over`) and then reads the verdict (`settle`). A TCPStore wakes a key's waiters on
any `compare_set` of it, there or not; so a waited-for key is `peek`ed only once it is known to be
there, and a wait that returns is a write (`wait_for`).

**A site that diverged stays unordered.** A `skip` retires its site on every rank that reads it: later
calls there are logged at once, without the store. A rank that missed call k comes to the site next
with its own count k (every earlier call there went, so it made those), finds the `skip`, and retires
the site too: call numbers never drift apart, and the divergence costs one wait, once.

Four shortcuts keep that one wait short:
- a rank arriving after the `skip` reads it at once (the retired call's key is never deleted);
- ranks a timed-out call named missing are *absent* until they check in somewhere again: calls
  that find one still absent wait for it half a timeout in all, then give up at once (`_absent`):
  a rank that skipped a whole step, or died, costs 1.5 T, and one a little late is still waited for;
- a rank that counts all N arrivals at its deadline and finds no verdict writes the `go` itself: the
  last arrival stopped between its count and its `go`, so every other rank is absent until it checks in
  again (`_suspect`), and the stopped one costs 1.5 T in all, as one a timeout named;
- halfway through a wait, a rank looks where the missing ranks wait (`w/<q>`): if they wait at
  another call that is waiting for us (a wait-for cycle: rank 0 at a main-only call, the others at
  the next call), one of the two is given up, the call the others skipped (`_first`).

The store holds per site its counter and its last verdict (a retired site: its last `go`'s too, since
a skip is no proof that every rank has read the verdict before), and one marker per rank: bounded.
The deadline is on the monotonic clock; waits name it (`Store.wait(keys, timeout)`), so the
connection's own timeout is never changed, and the check-in runs on whatever store it is handed.
"""

from __future__ import annotations

import datetime
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .._callsite import Site
from ..store.connection import SHORTEST_WAIT, Store, peek


GO = b"go"
SKIP = b"skip "
HANDED = b"ok"  # a handoff key: its rank's record is out (`handoff`)
SKIPPED = b"skip"  # every handoff key of a call given up: its waiters wake and read the verdict
MARK = "b/w/"  # + rank: the call the rank checked in at last ("<site>/<k>")


def site_name(site: Site) -> str:
    """A call site's name in the store: its whole text, so two sites never share keys."""
    filename, function, line = site
    return f"{filename}:{line}:{function}"


@dataclass(frozen=True)
class Call:
    """One call: its site's name and its number there (1, 2, ...)."""

    site: str
    k: int

    @property
    def marker(self) -> bytes:
        return f"{self.site}/{self.k}".encode()

    @property
    def counter(self) -> str:
        return f"b/s/{self.site}/n"

    @property
    def key(self) -> str:
        """Where its verdict is written."""
        return f"b/s/{self.site}/{self.k}"

    def handoff(self, rank: int) -> str:
        """Where `rank` hands its turn over (`handoff`)."""
        return f"b/h/{self.site}/{self.k}/{rank}"

    @classmethod
    def parse(cls, marker: bytes) -> Optional[Call]:
        site, _, k = marker.decode("utf-8", "replace").rpartition("/")
        return cls(site, int(k)) if site and k.isascii() and k.isdigit() else None  # '²'.isdigit() too


class Why(str, enum.Enum):
    """What gave a call up (a skip's reason); the first three are written to the store, as their values."""

    TIMEOUT = "timeout"  # a rank did not come within the timeout
    ABSENT = "absent"  # a rank named before had not checked in again, within the patience left
    CYCLE = "cycle"  # the missing ranks waited at another call, which waited for this one (`CheckIn._halfway`)
    DAMAGED = "damaged"  # a check-in key held something else
    STORE = "store"  # this rank's store connection failed
    RETIRED = "retired"  # the site diverged before: no store at all
    NONE = ""  # a `go`


@dataclass(frozen=True)
class Verdict:
    """What every rank does with one in_order call.

    Attributes:
        go: True: the turns run. False: nobody waits for anyone in the call; each rank emits at once.
        why (`Why`): for a skip, what decided it.
        decider: the rank that wrote the skip (-1: not known).
        missing: {rank: the call it had last checked in at}, for the ranks not in the call.
        other: for `Why.CYCLE`, the call the missing ranks were waiting at.
    """

    go: bool
    why: Why = Why.NONE
    decider: int = -1
    missing: dict[int, str] = field(default_factory=dict)
    other: str = ""

    def encode(self) -> bytes:
        if self.go:
            return GO
        fields = {"why": self.why.value, "by": self.decider, "missing": self.missing, "other": self.other}
        return SKIP + json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, blob: bytes) -> Verdict:
        """The verdict in `blob`; anything that is not one is a skip that names nobody ("damaged")."""
        if blob == GO:
            return cls(True)
        try:
            fields = json.loads(blob[len(SKIP) :]) if blob.startswith(SKIP) else {}
            missing = {int(q): str(m) for q, m in fields["missing"].items()}
            return cls(False, Why(str(fields["why"])), int(fields["by"]), missing, str(fields["other"]))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):  # a forged deep nesting too
            return cls(False, Why.DAMAGED)


RETIRED = Verdict(False, Why.RETIRED)


@dataclass
class Arrival:
    """One rank's check-in at one call, from its arrival to its verdict (`CheckIn.arrive`, `CheckIn.settle`).

    Attributes:
        site, call: the call checked in at: its site, and its name and number in the store.
        timeout: the timeout T it was made with.
        deadline: on the check-in's clock, when its waits end; its turns end by then too (`handoff`).
        verdict: the verdict, once read; None while the rank's turn comes first (`woken`).
        woken: the wait ended on a write to this rank's wake key (`CheckIn._wake_key`): rank r >= 1 takes
            its turn, then the verdict is read (`CheckIn.settle`).
        failed: the store failed under the call after the wake (the turn's handoff): `settle` gives it up.
        untidy: this rank wrote the `go`, and deletes after its turn (`CheckIn.tidy_up`).
        stalled: every arrival was counted at the deadline, but no verdict was there (`CheckIn._suspect`).
    """

    site: Site
    call: Call
    timeout: float
    deadline: float
    verdict: Optional[Verdict] = None
    woken: bool = False
    failed: bool = False
    untidy: bool = False
    stalled: bool = False


@dataclass
class _SiteState:
    """What one rank remembers of a call site: its calls there, when it last made one, whether it diverged."""

    name: str
    count: int = 0
    last: int = 0  # this rank's check-in number at its last call here (the order of its sites)
    before: int = 0  # the same, at the call before that
    retired: bool = False


class CheckIn:
    """One process's side of the check-in: its store connection, and what it remembers of each site.

    Args:
        store: a connection to the job's store (prefixed), used for every operation.
        rank, world_size: this process's place in the job.
        clock: monotonic seconds (the explorer passes its own).
        reconnect: a fresh connection, for a rank whose connection failed mid-call (None: no retry).
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        clock: Callable[[], float] = time.monotonic,
        reconnect: Optional[Callable[[], Store]] = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.clock = clock
        self.reconnect = reconnect
        self.sites: dict[Site, _SiteState] = {}
        self.absent: dict[int, str] = {}  # rank -> its marker when a timed-out call named it missing
        self.patience = 0.0  # seconds the calls may still wait for absent ranks, in all
        self.calls = 0  # check-ins made by this process
        # Rank 1's call whose turn runs before its verdict is read (`settle`): a log handler's in_order call
        # in that turn reads it first (`_read_outer_first`).
        self.unread: Optional[Call] = None

    def arrive(self, site: Site, k: int, timeout: float, deadline: Optional[float] = None) -> Arrival:
        """Check this process's call `k` at `site` in: its verdict, or (`Arrival.woken`, rank r >= 1 in a `go`)
        the write that is this rank's turn, taken before the verdict is read (`settle`).

        Args:
            k: the call's number at the site (1, 2, ...), as every rank counts it.
            deadline (`float`, *optional*): on `clock`, when the call's waits end: an earlier one when the
                call began before its check-in (the session's mode agreement); `timeout` from now if None.
        """
        state = self.sites.get(site) or self.sites.setdefault(site, _SiteState(site_name(site)))
        call = Call(state.name, k)
        when = self.clock() + timeout if deadline is None else deadline
        arrival = Arrival(site, call, timeout, when)
        if state.retired:
            arrival.verdict = RETIRED
            return arrival
        state.count = k
        self.calls += 1
        state.before, state.last = state.last, self.calls
        try:
            blob = self._check_in(arrival)
            arrival.verdict = None if blob is None else Verdict.decode(blob)
        except Exception:  # noqa: BLE001 -- the store failed under us: one more try, on a new connection
            arrival.verdict = self._after_failure(call)
        if arrival.woken and self.rank == 1:
            self.unread = call  # its wake key is the verdict key: the verdict is there
        return arrival

    def hand_over(self, arrival: Arrival) -> None:
        """After this rank's turn taken on the wake: its handoff key, before it reads the verdict."""
        try:
            self.store.set(arrival.call.handoff(self.rank), HANDED)
        except Exception:  # noqa: BLE001 -- read by `settle`, which gives the call up on a new connection
            arrival.failed = True

    def settle(self, arrival: Arrival) -> Verdict:
        """The verdict every rank follows (read now if the rank was woken), and what this rank learns from it."""
        call = arrival.call
        if self.unread == call:
            self.unread = None
        verdict = arrival.verdict
        if verdict is None:
            verdict = arrival.verdict = self._read_after_turn(arrival)
        if verdict is RETIRED:
            return verdict
        if verdict.go:
            self.absent.clear()  # every rank was here
        else:
            self.sites[arrival.site].retired = True
            if verdict.why is Why.TIMEOUT:
                self.patience = arrival.timeout / 2
            if verdict.why in (Why.TIMEOUT, Why.ABSENT):
                self.absent.update((q, m) for q, m in verdict.missing.items() if q != self.rank)
        if arrival.stalled:
            self._suspect(call, arrival.timeout)
        return verdict

    def _read_after_turn(self, arrival: Arrival) -> Verdict:
        """The verdict of a call whose wake came first; if the store failed, in the turn's handoff or now,
        one more try on a new connection (`_after_failure`)."""
        if not arrival.failed:
            try:
                return Verdict.decode(self._read_after_wake(arrival.call))
            except Exception:  # noqa: BLE001 -- the store failed under us
                arrival.failed = True
        return self._after_failure(arrival.call)

    def named(self, rank: int, deadline: float) -> None:
        """`rank` did not hand over its turn (`handoff`): absent, like a rank a timed-out call named, until
        it checks in somewhere again. Its wait was the call's whole timeout: no patience is added, and
        what this call waited past its `deadline` comes off what is left (a death costs 1.5 T in all)."""
        if rank not in self.absent:
            self.absent[rank] = self._peek(MARK + str(rank)).decode("utf-8", "replace")
        self.patience = max(0.0, self.patience - max(0.0, self.clock() - deadline))

    def _suspect(self, call: Call, timeout: float) -> None:
        """At this rank's deadline every rank had come to `call` but one stopped (died) between two of its
        writes: its count and its `go` (the `go` is written for it), or its marker and its count (the call
        is given up, naming nobody). Which one is not known: every other rank is absent until it checks in
        again, with half a timeout of patience, so the one that stopped costs 1.5 T in all."""
        self.absent.update((q, call.marker.decode()) for q in range(self.world_size) if q != self.rank)
        self.patience = timeout / 2

    # -- one call ---------------------------------------------------------------------------------

    def _check_in(self, arrival: Arrival) -> Optional[bytes]:
        """The verdict of `arrival`'s call; None when a write to the wake key ended the wait (`_await`)."""
        call = arrival.call
        self._read_outer_first()
        self.store.set(MARK + str(self.rank), call.marker)
        arrived = int(self.store.add(call.counter, 1))
        last = call.k * self.world_size
        if arrived == last:  # its turn may come next (rank 1's is the chain's first): deletions after it
            blob = self._decide(call, GO, later=arrival)
            if blob != GO:  # given up before this rank came: no turns, so no `tidy_up`
                self._forget_handoff(call)
            return blob
        if not last - self.world_size < arrived < last:  # a counter someone else wrote to
            return self._give_up(call, Why.DAMAGED, {})
        self._forget_handoff(call)
        return self._await(arrival)

    def tidy_up(self, arrival: Arrival) -> None:
        """What the writer of a `go` deletes after its turn, not before: the verdict of the call before at
        the site (`_decide`), and its own handoff key of two calls back (`_forget_handoff`)."""
        call = arrival.call
        if not arrival.untidy:
            return
        arrival.untidy = False
        if call.k > 1:
            self.store.delete_key(Call(call.site, call.k - 1).key)
        self._forget_handoff(call)

    def _forget_handoff(self, call: Call) -> None:
        """Delete this rank's handoff key of two calls back at the site. The call before this one went (a
        skip retires the site), so every rank has left the one before that, and read the key. Here, not
        when it hands over, the delete costs no rank its turn, nor the last rank the next call."""
        if self.rank > 0 and call.k > 2:
            self.store.delete_key(Call(call.site, call.k - 2).handoff(self.rank))

    def _await(self, arrival: Arrival) -> Optional[bytes]:
        """Wait for the verdict until T (halfway, look for a wait-for cycle); for absent ranks, less.
        None: a write to this rank's wake key ended the wait (`Arrival.woken`; the verdict is read in `settle`)."""
        call, deadline, timeout = arrival.call, arrival.deadline, arrival.timeout
        if self._absent(call):
            start = self.clock()
            arrival.woken = self._wakes(call, min(deadline, start + self.patience))
            self.patience = max(0.0, self.patience - (self.clock() - start))
            absent = self._absent(call)
            if arrival.woken:
                return None
            return self._await(arrival) if not absent else self._give_up(call, Why.ABSENT, absent)
        arrival.woken = self._wakes(call, deadline - timeout / 2)
        if arrival.woken:
            return None
        blob = self._halfway(call)
        if blob is not None:
            return blob
        arrival.woken = self._wakes(call, deadline)
        if arrival.woken:
            return None
        if self._count(call) == call.k * self.world_size:  # all came: the `go` is ours to write if it is not there
            arrival.stalled = not self.store.check([call.key])  # its last arrival stopped before it (`_suspect`)
            return self._decide(call, GO)
        missing = self._missing(call)
        arrival.stalled = not missing  # every rank's marker is here, not every count: one stopped between them
        return self._give_up(call, Why.TIMEOUT, missing)

    def _give_up(self, call: Call, why: Why, missing: dict[int, str], other: Optional[Call] = None) -> bytes:
        """Write a skip for `call` unless a verdict is there already; the verdict that stands."""
        skip = Verdict(False, why, self.rank, missing, other.marker.decode() if other else "")
        return self._decide(call, skip.encode())

    def _decide(self, call: Call, verdict: bytes, later: Optional[Arrival] = None) -> bytes:
        """Write `verdict` for `call` unless one is there; the one that stands. The writer of a `go`
        deletes the verdict of the call before at the site (now, or with `later` in its `tidy_up`):
        every rank has left that call, so has read it. A skip proves no such thing (a rank may still be
        reading it): it stays, with the retired site."""
        blob = bytes(self.store.compare_set(call.key, "", verdict))
        if blob != verdict:
            return self._junk_wakes(call, blob)
        if verdict != GO:
            self._wake_all(call)
        elif later is not None:
            later.untidy = True
        elif call.k > 1:
            self.store.delete_key(Call(call.site, call.k - 1).key)
        return blob

    def _wake_all(self, call: Call) -> None:
        """A skip: wake the ranks that wait at a handoff key, not at the verdict key (`_wake_key`)."""
        for q in range(1, self.world_size):
            self.store.set(call.handoff(q), SKIPPED)

    def _junk_wakes(self, call: Call, blob: bytes) -> bytes:
        """`blob`, the verdict read; junk there (a skip no rank wrote, so none woke the others) wakes them:
        a decided call costs nobody a wait."""
        if blob != GO and Verdict.decode(blob).why is Why.DAMAGED:
            self._wake_all(call)
        return blob

    def _after_failure(self, call: Call) -> Verdict:
        """The store failed mid-call: on a fresh connection, give the call up (or read the verdict that
        stands). Without one, this rank cannot learn the verdict: it logs unordered."""
        try:
            if self.reconnect is None:
                raise RuntimeError("no other connection")
            self.store = self.reconnect()
            blob = self._give_up(call, Why.STORE, {})
        except Exception:  # noqa: BLE001 -- the store is gone for this rank
            return Verdict(False, Why.STORE, self.rank)
        return Verdict.decode(blob)

    # -- what the other ranks are doing -----------------------------------------------------------

    def _wake_key(self, call: Call) -> str:
        """Where this rank waits for the verdict. Rank 1 at the verdict key; rank r > 1 at rank r-1's
        handoff, rank 0 at the last rank's: there a `go` comes with what the rank waits for next, its
        turn (or, for rank 0, the whole call's end). A skip is written to every handoff key too."""
        if self.rank == 1:
            return call.key
        return call.handoff(self.rank - 1 if self.rank > 1 else self.world_size - 1)

    def _wakes(self, call: Call, deadline: float) -> bool:
        """Whether a write to this rank's wake key ends its wait before `deadline`.

        The write is the verdict itself (rank 1), rank r-1's handoff (rank r > 1: a `go`, and its turn),
        the last rank's (rank 0: the call's end), or a skip. Rank r >= 1 takes its turn then, before it
        reads the verdict (`settle`), so a turn costs no round trip before the next. In a skip that only
        puts its record out early; the verdict is read after, and decides.
        """
        return self.wait_for(self._wake_key(call), deadline)

    def _read_after_wake(self, call: Call) -> bytes:
        """The verdict, after a write to this rank's wake key: there, since every such write follows it."""
        blob = peek(self.store, call.key)
        if blob is None:  # junk woke us, before any verdict
            return self._give_up(call, Why.DAMAGED, {})
        return self._junk_wakes(call, blob)

    def _read_outer_first(self) -> None:
        """A log handler's in_order call in a turn taken on the wake (`_wakes`): the outer call's verdict
        is read after the turn, and junk there woke nobody, so the others wait for that read while this call
        waits for them. Read it now: a decided call costs nobody a wait (`_junk_wakes`). Only rank 1's: its
        wake key is the verdict key, there once it woke (a `peek` of a missing key would wake its waiters)."""
        outer, self.unread = self.unread, None
        blob = peek(self.store, outer.key) if outer is not None else None
        if outer is not None and blob is not None:
            self._junk_wakes(outer, blob)

    def wait_for(self, key: str, deadline: float) -> bool:
        """Whether a write to `key` ends this rank's wait before `deadline`.

        A TCPStore wakes a key's waiters whenever anyone `compare_set`s it, there or not (`peek` is one).
        This package peeks a waited-for key only once it is known to be there (after a wake), so a wait
        that returns is a write. One that reaches its deadline asks `check`, which wakes nobody.
        """
        remaining = deadline - self.clock()
        if remaining >= SHORTEST_WAIT:  # c10d reads a wait under 1 ms as 0: no timeout at all
            try:
                self.store.wait([key], datetime.timedelta(seconds=remaining))
                return True
            except Exception as exc:  # noqa: BLE001 -- DistStoreError at the deadline; anything else is real
                if not is_timeout(exc):
                    raise
        return bool(self.store.check([key]))

    def _peek(self, key: str) -> bytes:
        """The value of `key`, or b"" when it has none: never waits, never creates it (but wakes its
        waiters: only for keys nobody waits on, the counters and markers)."""
        return peek(self.store, key) or b""

    def _count(self, call: Call) -> int:
        blob = self._peek(call.counter)
        return int(blob) if blob.isdigit() else -1

    def _markers(self) -> dict[int, bytes]:
        return {q: self._peek(MARK + str(q)) for q in range(self.world_size) if q != self.rank}

    def _missing(self, call: Call) -> dict[int, str]:
        """The ranks not in `call`, each with its marker. A rank writes its marker before it counts
        itself, and stays in an undecided call: so these are exactly the ranks that have not come."""
        return {q: m.decode("utf-8", "replace") for q, m in self._markers().items() if m != call.marker}

    def _absent(self, call: Call) -> dict[int, str]:
        """Absent ranks that have not checked in anywhere since they were named (a changed marker ends it;
        a rank named while it waited here, at a call that then reached us, is here)."""
        if not self.absent:
            return {}
        still = {}
        for q, named in list(self.absent.items()):
            now = self._peek(MARK + str(q)).decode("utf-8", "replace")
            if now == named and now != call.marker.decode():
                still[q] = named
            else:
                del self.absent[q]
        return still

    def _live(self, call: Call) -> bool:
        """Whether `call` is undecided: no verdict, and not all its arrivals counted."""
        count = self._count(call)
        return 0 <= count < call.k * self.world_size and not self.store.check([call.key])

    def _halfway(self, call: Call) -> Optional[bytes]:
        """Halfway: a missing rank waiting at another undecided call waits for us. Give up the call the
        others skipped (`_first`): ours (its verdict returned) or theirs (None: we wait on)."""
        markers = self._markers()
        if self.store.check([call.key]):  # decided meanwhile: read it, give nothing else up
            return self._junk_wakes(call, bytes(self.store.get(call.key)))
        here = {self.rank} | {q for q, m in markers.items() if m == call.marker}
        elsewhere: dict[bytes, set[int]] = {}
        for q, m in markers.items():
            if q not in here:
                elsewhere.setdefault(m, set()).add(q)
        for marker, there in sorted(elsewhere.items()):
            other = Call.parse(marker)
            if other is None or other.site == call.site or not self._live(other):
                continue
            missing = {q: m.decode("utf-8", "replace") for q, m in markers.items() if q not in here}
            if self._first(call, here, other, there) == call:
                return self._give_up(call, Why.CYCLE, missing, other)
            theirs = {q: call.marker.decode() for q in here}
            theirs.update({q: m.decode("utf-8", "replace") for q, m in markers.items() if q not in here | there})
            self._give_up(other, Why.CYCLE, theirs, call)
        return None

    def _first(self, ours: Call, here: set[int], other: Call, there: set[int]) -> Call:
        """Of two calls waiting for each other, the one to give up.

        The ranks at `other` passed `ours` by, or `ours` is a call they never make: so if, in this
        rank's last round, `ours`'s site came before `other`'s (a site never made before counts as
        earliest), and `other` is this rank's next call there, `ours` is the one they skipped. Without
        any history (neither site made before: the first round), the call at the earlier line when
        both sites are in one file (one step's code runs down the file); else the call fewer ranks
        made, and on a tie the one the lowest rank waits at (main-process-only calls are the usual
        mistake). Ranks at `other` decide the same from their own history.
        """
        mine, theirs = self._state(ours.site), self._state(other.site)
        before = mine.before if mine is not None else 0
        count, last = (theirs.count, theirs.last) if theirs is not None else (0, 0)
        if count == other.k - 1 and (before or last):
            return ours if before < last else other
        earlier = _earlier_line(ours.site, other.site)
        if earlier is not None:
            return ours if earlier == ours.site else other
        if (len(here), min(here)) <= (len(there), min(there)):
            return ours
        return other

    def _state(self, name: str) -> Optional[_SiteState]:
        return next((s for s in self.sites.values() if s.name == name), None)


def _earlier_line(a: str, b: str) -> Optional[str]:
    """Of two site names (`site_name`) in one file, the one at the earlier line; None otherwise."""
    ours, theirs = a.rsplit(":", 2), b.rsplit(":", 2)
    if len(ours) != 3 or len(theirs) != 3 or ours[0] != theirs[0]:
        return None
    lines = [int(p[1]) if p[1].isascii() and p[1].isdigit() else -1 for p in (ours, theirs)]
    if min(lines) < 0 or lines[0] == lines[1]:
        return None
    return a if lines[0] < lines[1] else b


def is_timeout(exc: Exception) -> bool:
    """A store wait that reached its deadline (torch's DistStoreError; older torch: a RuntimeError saying so)."""
    name = type(exc).__name__
    if name in ("DistNetworkError", "ConnectionError", "BrokenPipeError"):
        return False
    return name in ("DistStoreError", "StoreTimeout") or "timeout" in str(exc).lower()
