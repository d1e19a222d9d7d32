"""Barrier mode's check-in: before any barrier, every rank agrees through the job's store whether they run.

Barrier mode is N turns of `wait_for_everyone()`: a collective. A rank that does not make the call
(`if accelerator.is_main_process:`, a skipped iteration) leaves the others in a barrier that its own
next collective pairs with: the job hangs, or desynchronises. So each rank first checks in under the
call's identity (its call site and the per-site count, as gather mode pairs records), and one verdict
per call decides for every rank:

- `go`: every rank checked in, so every rank will enter each barrier of the call (and the check-in
  itself stands for the barrier after rank 0's turn: rank 0 emits before it checks in);
- `skip`: `ACCELERATE_INORDER_TIMEOUT` passed first. Nobody enters a barrier of this call; each rank
  that made it emits its record at once. One warning names the ranks that had not checked in.

The protocol, keys under `accelerate_inorder_fix/b/<site>/<count>/` (N ranks, deadline T)::

    rank r                                          store
    ------                                          -----
    add n 1                 -> a                    n counts arrivals; a give-up adds GIVE_UP
    a == N:         set v "go"  (no reply)          the verdict: every rank is here
    a >  GIVE_UP:   get v       (at once)           the call was given up before r came
    otherwise:      set busy/<r> "<call> <deadline>"  (in the background: where r waits, until when)
                    get v       (until T/2, then, unless a wait-for cycle ends it, until T)
      T passed:     add n GIVE_UP  -> g
                    g % GIVE_UP == N: go            the N-th arrival came first: its `go` stands
                    first to give up (g < 2 GIVE_UP): set v "skip r <missing>" (wakes the waiters)
                    else: get v
    follow the verdict; then, off the call path, the writer of `go` deletes n and v

A rank's check-in costs one round trip (`add`) and, unless it is the last to arrive, one `get`. The
store serialises the `add`s on `n`: the call goes exactly when the N-th arrival comes before the first
give-up, and exactly one of the two writes `v`, so every rank reads the same verdict: ranks never split.

Wait-for cycles. Rank 0 waits at a main-only call while the others wait for it at the next call:
halfway through its wait, a rank looks where the missing ranks wait, and the smaller of two calls that
wait for each other is given up at once (`CheckIn._give_way`), so the other goes, and no wait outlives
its timeout.

Suspects. A call site that some ranks never reach (a main-only call in a loop) would cost a timeout
per call. So the ranks a `skip` named are suspects at that site: a later call there that finds, on
arrival, that not every rank is in gives up at once, and its `skip` wakes whoever waits. A suspect that comes to the site late appends
to the site's `back` key; seeing it grow, the others wait there again. One timeout and one warning
per site, not per call.

Clean-up. A `go`'s keys are deleted after its barriers, when every rank has read `v`; a `skip`'s when
the ranks follow the next verdict at that site (late ranks read them until then).
Deletes run in a thread of their own (`Janitor`), on the process group's own store connection, so that
no call waits for them. The store holds a few keys per call site and one `busy` key per rank.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .records import Site


GO = b"go"
SKIP = b"skip"
GIVE_UP = 1 << 32  # added to a call's arrival count by a rank that gives up on it
# + rank: "<call's key prefix> <deadline, epoch seconds>": where the rank last waited, until when. Only a
# rank whose own wait is half over reads it (`CheckIn._give_way`).
BUSY = "b/busy/"
_UNSET = b"accelerate_inorder_fix:unset"  # compare_set with this as both values reads a key, never waits


@dataclass(frozen=True)
class Verdict:
    """What every rank does with one in_order call.

    Attributes:
        go: True: the barriers run. False: nobody enters them; each rank emits at once.
        decider: the rank that wrote the verdict (-1: another rank, or not known here).
        missing: the ranks that had not checked in when a `skip` was decided (empty for `go`).
    """

    go: bool
    decider: int = -1
    missing: tuple[int, ...] = ()

    def encode(self) -> bytes:
        """`v`'s value: `go`, or `skip <decider> <missing, comma-separated>`; plain ASCII, never code."""
        if self.go:
            return GO
        return b"%s %d %s" % (SKIP, self.decider, ",".join(map(str, self.missing)).encode())

    @classmethod
    def decode(cls, blob: bytes) -> Verdict:
        """The verdict in `blob`. Anything else (a foreign or damaged value) is a `skip` naming nobody:
        unordered output, never a barrier some rank might not enter."""
        if blob == GO:
            return cls(True)
        word, _, rest = blob.partition(b" ")
        decider, _, missing = rest.partition(b" ")
        try:
            skip = cls(False, int(decider), tuple(int(q) for q in missing.split(b",") if q))
        except ValueError:
            return cls(False)
        return skip if word == SKIP else cls(False)


def site_key(site: Site) -> str:
    """A short name for a call site, the same on every rank."""
    return f"{zlib.crc32(repr(site).encode()):08x}"


class Janitor:
    """Store writes off the call path, in order: one daemon thread, on the process group's connection.

    It deletes what decided calls leave, and publishes each wait (`busy/<rank>`), which only a rank
    that has waited a whole timeout reads: no call waits for either.
    """

    def __init__(self, store: Any, warn: Callable[[str], None]) -> None:
        self._store = store
        self._warn = warn
        self._keys: collections.deque[tuple[str, Optional[bytes]]] = collections.deque()  # (key, value or delete)
        self._changed = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def discard(self, *keys: str) -> None:
        self._queue([(key, None) for key in keys])

    def publish(self, key: str, value: bytes) -> None:
        self._queue([(key, value)])

    def _queue(self, writes: list[tuple[str, Optional[bytes]]]) -> None:
        with self._changed:
            self._keys.extend(writes)
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="accelerate-inorder-fix-checkin", daemon=True)
                self._thread.start()

    def idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every key handed over is deleted (tests, exit)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._keys, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._keys))
                name, value = self._keys[0]
            try:
                if value is None:
                    self._store.delete_key(name)
                else:
                    self._store.set(name, value)
            except (RuntimeError, OSError):  # the store is gone: there is nothing left to keep small
                pass
            except Exception as exc:  # not expected; the thread must outlive it, or the store would grow
                self._warn(f"the in_order check-in could not write to the store: {exc!r}")
            with self._changed:
                self._keys.popleft()
                self._changed.notify_all()


@dataclass
class _SiteState:
    """What one rank remembers of a call site between its calls there."""

    prefix: str
    suspects: tuple[int, ...] = ()
    back_seen: int = 0  # length of the site's `back` key when the suspicion began
    stale: tuple[str, ...] = ()  # keys of the site's last `skip`, deleted at its next verdict


class CheckIn:
    """One process's side of the check-in: its connection, and what it remembers of each call site.

    Args:
        store: this process's own connection to the job's store (prefixed).
        rank, world_size: this process's place in the job.
        janitor: where keys to delete go (`Janitor` on the process group's connection).
    """

    def __init__(self, store: Any, rank: int, world_size: int, janitor: Janitor) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.janitor = janitor
        self.sites: dict[Site, _SiteState] = {}

    def verdict(self, site: Site, count: int, timeout: float) -> tuple[Verdict, Callable[[], None]]:
        """Check in for call `count` at `site`; the verdict, and what to call once it has been followed."""
        known = self.sites.get(site) or self.sites.setdefault(site, _SiteState(f"b/{site_key(site)}/"))
        base = f"{known.prefix}{count}/"
        arrived = self.store.add(base + "n", 1)
        if arrived == self.world_size:
            self.store.set(base + "v", GO)
            verdict = Verdict(True, self.rank)
        elif arrived > GIVE_UP:  # given up before we came: the verdict is in `v`, or on its way
            verdict = self._get(base + "v", time.time() + timeout) or Verdict(False)
        elif known.suspects and not self._came_back(known):
            verdict = self._give_up(base, known.suspects, timeout)
        else:
            verdict = self._await(base, timeout)
        return verdict, lambda: self._settle(known, base, verdict)

    def _came_back(self, known: _SiteState) -> bool:
        """Whether a suspect has come to this site since the suspicion began (it appended to `back`)."""
        if len(self._peek(known.prefix + "back")) <= known.back_seen:
            return False
        known.suspects = ()
        return True

    def _await(self, base: str, timeout: float) -> Verdict:
        """Wait for the verdict until the deadline, then give up; halfway, break a wait-for cycle."""
        start = time.time()
        marker = b"%s %.3f" % (base.encode(), start + timeout)
        self.janitor.publish(BUSY + str(self.rank), marker)
        verdict = self._get(base + "v", start + timeout / 2)
        if verdict is not None:
            return verdict
        # Halfway. Our marker goes out now for certain (the janitor's may lag on a loaded machine): of two
        # ranks waiting for each other, the second to get here then sees the first.
        self.store.set(BUSY + str(self.rank), marker)
        if not self._give_way(base, timeout):
            verdict = self._get(base + "v", start + timeout)
        if verdict is not None:
            return verdict
        waits = self._waits()
        return self._give_up(base, tuple(q for q in sorted(waits) if waits[q][0] != base and q != self.rank), timeout)

    def _get(self, name: str, deadline: float) -> Optional[Verdict]:
        """The verdict in `name` once it is there, waiting until `deadline` (epoch seconds); None if not."""
        self.store.set_timeout(datetime.timedelta(seconds=max(deadline - time.time(), 0.001)))
        try:
            return Verdict.decode(bytes(self.store.get(name)))
        except RuntimeError:  # DistStoreError: the deadline passed
            return None

    def _give_up(self, base: str, missing: tuple[int, ...], timeout: float) -> Verdict:
        """Add GIVE_UP to the arrivals: `go` if every rank had arrived first, else `skip`.

        Only the first to give up writes the `skip` (naming the ranks that had not come), and so wakes
        the ranks still waiting; the others read it from `v`.
        """
        total = self.store.add(base + "n", GIVE_UP)
        if total % GIVE_UP == self.world_size:  # the last arrival came first: its `go` stands
            return Verdict(True)
        if total // GIVE_UP > 1:
            return self._get(base + "v", time.time() + timeout) or Verdict(False)
        verdict = Verdict(False, self.rank, missing)
        self.store.set(base + "v", verdict.encode())
        return verdict

    def _waits(self) -> dict[int, tuple[str, float]]:
        """{rank: (the call it last waited at, until when)} for every rank, from `busy/<rank>`."""
        waits = {}
        for q in range(self.world_size):
            where, _, until = self._peek(BUSY + str(q)).partition(b" ")
            try:
                waits[q] = (where.decode(), float(until))
            except ValueError:  # no wait yet, or a foreign value
                waits[q] = ("", 0.0)
        return waits

    def _give_way(self, base: str, timeout: float) -> bool:
        """Halfway through a wait: break a wait-for cycle. True when this call should give up now.

        The hard case: rank 0 waits at a main-only call A for ranks that never make it, while they
        wait for rank 0 at the next call B. Both waits would run their whole timeout, and B's, begun
        a little later, would end just before rank 0, done with A, comes. So halfway through, each
        waiting rank looks where the missing ranks wait (`busy/<q>`): of two calls that wait for each
        other, the one fewer ranks have made (on a tie, the smaller key) is the mistake, and is given
        up at once, by its own waiters or by the other call's. No wait outlasts its timeout.
        """
        ours = self._arrivals(base)
        if ours is None or ours >= self.world_size:  # decided meanwhile (its `v` is on its way): read it
            return True
        waits = self._waits()
        for where, _ in set(waits.values()):
            theirs = self._arrivals(where) if where not in ("", base) else None
            if theirs is None or theirs >= self.world_size:  # not waiting there any more
                continue
            if (theirs, where) > (ours, base):
                return True
            self._give_up_for(where, waits)
        return False

    def _give_up_for(self, where: str, waits: dict[int, tuple[str, float]]) -> None:
        """Give up call `where` for the ranks waiting there (the smaller call of a wait-for cycle)."""
        total = self.store.add(where + "n", GIVE_UP)
        if total % GIVE_UP != self.world_size and total // GIVE_UP == 1:
            missing = tuple(q for q in sorted(waits) if waits[q][0] != where)
            self.store.set(where + "v", Verdict(False, self.rank, missing).encode())

    def _arrivals(self, base: str) -> Optional[int]:
        """A call's arrival count (GIVE_UP added per give-up); None when its keys are gone."""
        blob = self._peek(base + "n")
        return int(blob) if blob.isdigit() else None

    def _peek(self, name: str) -> bytes:
        """The value of `name`, or b"" when it has none: never waits, never creates it."""
        blob = bytes(self.store.compare_set(name, _UNSET, _UNSET))
        return b"" if blob == _UNSET else blob

    def _settle(self, known: _SiteState, base: str, verdict: Verdict) -> None:
        """After the call: the site's suspects, and this call's keys (and stale ones) to the janitor."""
        done = list(known.stale)
        known.stale = ()
        if verdict.go:
            known.suspects = ()
            if verdict.decider == self.rank:  # the last to arrive: every rank has read `v` by now
                done += [base + "n", base + "v"]
        else:
            known.stale = (base + "n", base + "v")
            if self.rank in verdict.missing:  # we came late: the others' suspicion of us ends here
                self.store.append(known.prefix + "back", b".")
            elif not known.suspects and verdict.missing:
                known.suspects = verdict.missing
                known.back_seen = len(self._peek(known.prefix + "back"))
        if done:
            self.janitor.discard(*done)
