"""Barrier mode's check-in: every rank agrees through the job's store whether one call's turns run.

Each rank marks where it is (`w/<r>`), counts itself in at the call's site (`add`), and reads one verdict,
written with `compare_set(key, "", verdict)` so the first value wins: `go` (written by the rank that counted all
N arrivals) or a skip naming the missing ranks (any rank at its deadline, or a wait-for cycle's rule). A skip
costs its call, two in a row the site; a call some rank skips costs each rank at most 2 T in all. The rules:
docs/barrier-mode.md.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .._callsite import Site
from ..store.connection import SHORTEST_WAIT, Store, peek, read_until, wait_until


GO = b"go"
SKIP = b"skip "
MARK = "w/"  # + rank: the call the rank is at ("<site>/<k>")
ABSENCE_BUDGET = 0.5  # of T: what the calls may wait, in all, for ranks already named missing
LAST_WAIT = 0.25  # of T: what a call whose every rank is marked here waits past its deadline for the `go`


def site_name(site: Site) -> str:
    """A call site's name in the store: its whole text, so two sites never share keys."""
    filename, function, line = site
    return f"{filename}:{line}:{function}"


@dataclass(frozen=True)
class Call:
    """One call in the store: its site's name and its number there (1, 2, ...)."""

    site: str
    k: int

    @property
    def marker(self) -> str:
        return f"{self.site}/{self.k}"

    @property
    def counter(self) -> str:
        return f"c/{self.site}"

    @property
    def key(self) -> str:
        """Where its verdict is written."""
        return f"v/{self.site}/{self.k}"

    def handoff(self, rank: int) -> str:
        """Where `rank` hands its turn over (`handoff.Turns`)."""
        return f"h/{self.site}/{self.k}/{rank}"

    @classmethod
    def parse(cls, marker: str) -> Optional[Call]:
        site, _, k = marker.rpartition("/")
        return cls(site, int(k)) if site and k.isascii() and k.isdigit() else None


class Why(str, enum.Enum):
    """What gave a call up; written to the store as its value."""

    TIMEOUT = "timeout"  # a rank did not come within T
    ABSENT = "absent"  # a rank named before had not checked in again within the absence budget
    CYCLE = "cycle"  # the missing ranks waited at another call that waited for this one
    DAMAGED = "damaged"  # a check-in key held something else
    STORE = "store"  # this rank's store connection failed
    RETIRED = "retired"  # the site was given up before: no store at all
    WORD = "word"  # the other ranks logged it at once, before the main process's word came
    NONE = ""  # a `go`


@dataclass(frozen=True)
class Verdict:
    """What every rank does with one call: `go` (the turns run) or a skip (each rank emits at once), `why`, by whom
    (`decider`, -1: not known), the `missing` ranks {rank: the call it was at}, and the `other` call of a cycle."""

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


class Absence:
    """The ranks named missing (each with the marker it had then), and the one budget of seconds the
    calls may still wait for them in all, from one `go` to the next; a rank whose marker changed is back."""

    def __init__(self) -> None:
        self.named: dict[int, str] = {}
        self.budget = 0.0
        self.fresh = True  # no rank named since the last `go`: the next naming sets the budget
        self._lock = threading.Lock()

    def name(self, ranks: dict[int, str], timeout: float) -> None:
        with self._lock:
            if self.fresh:
                self.budget, self.fresh = timeout * ABSENCE_BUDGET, False
            self.named.update(ranks)

    def clear(self) -> None:
        with self._lock:
            self.named.clear()
            self.fresh = True

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.budget = self.budget - seconds if self.budget - seconds >= SHORTEST_WAIT else 0.0

    def still(self, markers: dict[int, str], here: str) -> dict[int, str]:
        """The named ranks still where they were named (and not at `here`); the others are back."""
        with self._lock:
            for q, named in list(self.named.items()):
                if markers.get(q) != named or named == here:
                    del self.named[q]
            return dict(self.named)


def gives_up(ours: Call, other: Call, history: dict[str, tuple[int, int, int]], rank0_here: bool) -> bool:
    """Of two calls waiting for each other, whether `ours` gives up; every rank at either decides alike.

    The ranks at `other` passed `ours` by: so when `other` is this rank's next call at its site and, in this
    rank's last round, `ours`'s site came before `other`'s (a site not made before counts as earliest),
    `ours` is the call they skipped. Without that history (the first round): the call rank 0 waits at.

    Args:
        history: {site: (this rank's calls there, its check-in number at the last, at the one before)}.
        rank0_here: whether rank 0 waits at `ours`.
    """
    before = history.get(ours.site, (0, 0, 0))[2]
    count, last, _ = history.get(other.site, (0, 0, 0))
    return before < last if count == other.k - 1 and (before or last) else rank0_here


class CheckIn:
    """One process's side of the check-in: its store connection, its retired sites, its absent ranks.

    Args:
        store: a connection to the job's store (prefixed for the session).
        rank, world_size: this process's place in the job.
        clock: monotonic seconds (the explorer passes its own).
    """

    def __init__(self, store: Store, rank: int, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.world_size, self.clock = store, rank, world_size, clock
        self.retired: set[str] = set()
        self.skipped: dict[str, int] = {}  # site -> its last call given up (a second in a row retires the site)
        self.missed: dict[str, set[int]] = {}  # site -> the ranks its last call given up named missing
        self.history: dict[str, tuple[int, int, int]] = {}  # `gives_up`'s
        self.passed: dict[str, int] = {}  # site -> its calls given up in a cycle while this rank waited at another
        self.calls = 0
        self.timeout = 0.0  # T, as the last call gave it: what `wait_for` slices
        self._lock = threading.Lock()
        self.absence = Absence()

    def verdict(self, call: Call, deadline: float, timeout: float) -> tuple[Call, Verdict]:
        """Check this rank in at `call` (the session's number); the call it made and the verdict all follow (never
        raises). A call given up in a cycle naming this rank at the other call was passed by: it takes the next.

        Args:
            deadline: on `clock`, when the call's wait ends (T from the call's start).
            timeout: T, in seconds.
        """
        call = Call(call.site, call.k + self.passed.get(call.site, 0))
        if call.site in self.retired:
            return call, RETIRED
        self.timeout = timeout
        with self._lock:
            self.calls += 1
            self.history[call.site] = (call.k, self.calls, self.history.get(call.site, (0, 0, 0))[1])
        while True:
            try:
                verdict = Verdict.decode(self._check_in(call, deadline, timeout))
            except Exception:  # noqa: BLE001 -- the store failed under us: this rank cannot learn the verdict
                verdict = Verdict(False, Why.STORE, self.rank)
            if verdict.go or verdict.why is Why.WORD:  # a `go`: every rank was here; before the word: none was
                self.absence.clear()
                return call, verdict
            cycle, missing, second = verdict.why is Why.CYCLE, set(verdict.missing), self.previous(call) < call.k - 1
            alone = missing == set(range(1, self.world_size))  # rank 0 alone at a call given up in a cycle: main-only
            if verdict.why is Why.STORE or (alone if cycle else verdict.other) or second:
                self.retire(call)  # `other` of a timeout: its ranks passed it by (in another call's turns, or won)
            self.skipped[call.site], self.missed[call.site] = call.k, set() if cycle else missing - {self.rank}
            if verdict.why in (Why.TIMEOUT, Why.ABSENT):  # naming nobody: every rank was here, one stopped in it
                named = verdict.missing or dict.fromkeys(range(self.world_size), call.marker)
                self.absence.name({q: m for q, m in named.items() if q != self.rank}, timeout)
            if not cycle or self.rank not in missing or call.site in self.retired or self._behind(verdict):
                return call, verdict
            self.passed[call.site] = self.passed.get(call.site, 0) + 1
            call = Call(call.site, call.k + 1)
            self.history[call.site] = (call.k, *self.history[call.site][1:])

    def _behind(self, verdict: Verdict) -> bool:
        """Whether the other call of a cycle this rank won was given up with none of the ranks here come to it:
        then no rank is known to be ahead, and this rank is late to this call, not past it."""
        other = Call.parse(verdict.other)
        here = set(range(self.world_size)) - set(verdict.missing)
        return (
            other is not None
            and self.skipped.get(other.site) == other.k
            and here <= self.missed.get(other.site, set())
        )

    def retire(self, call: Call) -> None:
        """Give `call`'s site up on this rank: its later calls are logged at once. After two calls in a row given up,
        it deletes the verdict of the site's last `go` (every rank left it; its rank 0 may be the one that skipped)."""
        self.retired.add(call.site)
        if self.previous(call) < call.k - 1 and call.k > 2:
            try:
                self.store.delete_key(Call(call.site, call.k - 2).key)
            except Exception:  # noqa: BLE001 -- a store failed under us: the key stays (said at its next call)
                return

    def previous(self, call: Call) -> int:
        """The site's last `go` before `call`, a `go` (0: none): one call given up between them at most."""
        return call.k - (2 if self.skipped.get(call.site) == call.k - 1 else 1)

    def forget(self, call: Call) -> None:
        """After a `go` call's turns, the last rank deletes the verdicts since the site's last `go` (all left them)."""
        if self.rank == self.world_size - 1:
            for k in range(max(self.previous(call), 1), call.k):
                self.store.delete_key(Call(call.site, k).key)

    def _check_in(self, call: Call, deadline: float, timeout: float) -> bytes:
        self.store.set(MARK + str(self.rank), call.marker)  # before the count: a counted rank is marked here
        arrived = int(self.store.add(call.counter, 1))
        last = call.k * self.world_size
        if arrived == last:
            return self._decide(call, GO)
        if not last - 2 * self.world_size < arrived < last:  # someone else wrote to it (not: a rank late to k-1)
            return self._give_up(call, Why.DAMAGED, {})
        return self._await(call, deadline, timeout)

    def _await(self, call: Call, deadline: float, timeout: float) -> bytes:
        """Wait for the verdict until the deadline (absent ranks: from the budget only); then give the
        call up, or, when it won a wait-for cycle, the other call, and wait on one more T."""
        end, won = deadline, None  # won: the other call of a wait-for cycle this one won
        while True:
            absent = self._absent(call)
            until = min(end, self.clock() + self.absence.budget) if absent else end
            began = self.clock()
            if blob := read_until(self.store, call.key, until, timeout, self.clock):  # in one request, sliced
                return blob  # (nothing here peeks a verdict key that may be missing)
            if absent:
                self.absence.spend(self.clock() - began)
                absent = self._absent(call)
                if absent and self.absence.budget <= 0.0:
                    return self._give_up(call, Why.ABSENT, absent)
                if self.clock() < end:
                    continue
            markers = self._markers()
            missing = {q: m for q, m in markers.items() if m != call.marker}
            if self.store.check([call.key]):  # decided meanwhile (a rank marked elsewhere may have left it)
                return bytes(self.store.get(call.key))
            if end == deadline and not missing:  # every rank is here: the last one's `go` may be on its way
                end = deadline + timeout * LAST_WAIT
                continue
            if end == deadline and self._won_cycle(call, markers, missing):
                end, won = deadline + timeout, Call.parse(next(iter(missing.values())))
                continue
            return self._give_up(call, Why.TIMEOUT, missing, won or self._held_up(call, missing))

    def _held_up(self, call: Call, missing: dict[int, str]) -> Optional[Call]:
        """The one other call every missing rank is at, when it went and its turns wait for this rank (whose log
        handler made this call in its turn): they passed this line by, as in a wait-for cycle. None otherwise."""
        other = self._other(call, missing)
        if other is None or not self.store.check([other.key]) or peek(self.store, other.key) != GO:
            return None
        return None if self.store.check([other.handoff(self.rank)]) else other

    def _absent(self, call: Call) -> dict[int, str]:
        """The ranks this call waits for from the absence budget only: those named missing and not back, and, at
        the call after one given up at its site, the ranks that call missed, until they come here."""
        missed = self.missed.get(call.site, ()) if self.previous(call) < call.k - 1 else ()
        if not self.absence.named and not missed:
            return {}
        markers = self._markers()
        absent = self.absence.still(markers, call.marker) if self.absence.named else {}
        absent.update({q: markers.get(q, "") for q in missed if markers.get(q) != call.marker})
        return absent

    def _won_cycle(self, call: Call, markers: dict[int, str], missing: dict[int, str]) -> bool:
        """Whether every missing rank waits at one other undecided call (which waits for this one), and
        this call is the one that waits on: the other given up, by a rule every rank computes alike.

        A call given up here is written now (`gives_up`).
        """
        other = self._other(call, missing)
        if other is None:
            return False
        blob = peek(self.store, other.counter) or b""
        if not blob.isdigit() or int(blob) >= other.k * self.world_size or self.store.check([other.key]):
            # decided: given up for this call already, its ranks on their way (a missing key's peek wakes its waiters)
            verdict = Verdict.decode(peek(self.store, other.key) or b"") if self.store.check([other.key]) else RETIRED
            return verdict.why is Why.CYCLE and verdict.other == call.marker
        with self._lock:
            history = dict(self.history)
        if gives_up(call, other, history, 0 not in missing):
            self._give_up(call, Why.CYCLE, missing, other)
            return False
        ours = {q: call.marker for q in range(self.world_size) if q not in missing}
        self._give_up(other, Why.CYCLE, ours, call)
        return True

    @staticmethod
    def _other(call: Call, missing: dict[int, str]) -> Optional[Call]:
        """The one other call (another site's) every missing rank is at; None otherwise."""
        others = set(missing.values())
        other = Call.parse(others.pop()) if len(others) == 1 else None
        return other if other is not None and other.site != call.site else None

    def _give_up(self, call: Call, why: Why, missing: dict[int, str], other: Optional[Call] = None) -> bytes:
        return self._decide(call, Verdict(False, why, self.rank, missing, other.marker if other else "").encode())

    def _decide(self, call: Call, verdict: bytes) -> bytes:
        """Write `verdict` for `call` unless one is there: the one that stands."""
        return bytes(self.store.compare_set(call.key, "", verdict))

    def _markers(self) -> dict[int, str]:
        """Where the other ranks are (peeked: nobody waits on a marker)."""
        return {
            q: (peek(self.store, MARK + str(q)) or b"").decode("utf-8", "replace")
            for q in range(self.world_size)
            if q != self.rank
        }

    def wait_for(self, key: str, deadline: float) -> bool:
        """Whether `key` is in the store by `deadline` (`connection.wait_until`: in slices no signal stretches)."""
        return wait_until(self.store, [key], deadline, self.timeout, self.clock)
