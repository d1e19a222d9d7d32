"""Barrier mode's check-in: before any barrier, every rank agrees through the job's store whether they run.

Barrier mode is N turns of `wait_for_everyone()`: a collective. A rank that does not make the call
(`if accelerator.is_main_process:`, a skipped iteration) leaves the others in a barrier that its own
next collective pairs with: the job hangs, or desynchronises. So each rank first checks in under the
call's identity (its call site and the per-site count, as gather mode pairs records), and one verdict
per call decides for every rank:

- `go`: every rank checked in, so every rank will enter each barrier of the call (and the check-in
  itself stands for the barrier after rank 0's turn: rank 0 emits before it checks in);
- `skip`: `ACCELERATE_INORDER_TIMEOUT` passed first. Nobody enters a barrier of this call; each rank
  that made it emits its record at once. The verdict names the ranks that had not checked in.

The protocol, keys under `accelerate_inorder_fix/b/<site>/<count>/` (N ranks, deadline T)::

    rank r                                          store
    ------                                          -----
    append who "r,"         (no reply)              who: the ranks that checked in
    add n 1                 -> a                    n counts arrivals; GIVE_UP is added to give up
    a == N:          set v "go r"   (no reply)      the verdict: every rank is here
    a >  GIVE_UP:    get v          (at once)       the call was given up before r came
    otherwise:       get v          (blocks until T; r's wait is published in busy/<r>)
      T passed:      add n GIVE_UP  -> g
                     g % GIVE_UP >= N: go           (the last arrival came first: its `go` is on its way)
                     else: read who, set v "skip r <missing>"
    follow v; then, off the call path, the writer of `go` deletes n, who and v

The verdict is decided by the order of the `add`s on one key, which the store serialises: `go` when the
N-th arrival comes before any give-up, `skip` otherwise. Whoever writes `v`, every rank reads the same
kind of verdict, so ranks never split; only the first to give up (its `add` returned the first
GIVE_UP) warns. A rank that arrives after a `skip` reads it at once.

Suspects. A call site that some ranks never reach (a main-only call in a loop) would cost a timeout
per call. So the ranks a `skip` named are suspects at that site: a later call there looks, without
waiting, whether they have checked in, and gives up at once if not. A suspect that checks in there,
even late, ends it (`back/<rank>` at the site): the next call there waits for it again. One timeout
and one warning per site, not per call.

Clean-up. A `go`'s keys are deleted after its barriers, when every rank has read the verdict; a `skip`'s
when the same rank follows the next verdict at that site (late ranks find it until then). Deletes run
in a thread of their own (`Janitor`), on the process group's own store connection, so that no call
waits for them. The store holds a few keys per call site and one `busy` key per rank.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional


Site = tuple[str, str, int]  # (file name, function, line) of the user's call: the same on every rank

GO = b"go"
SKIP = b"skip"
GIVE_UP = 1 << 32  # added to a call's arrival count by a rank that gives up on it
BUSY = "b/busy/"  # + rank: "<call's key prefix> <deadline, epoch s> wait|done|gaveup": the rank's last wait
_UNSET = b"accelerate_inorder_fix:unset"  # compare_set with this as both values reads a key, never waits


@dataclass(frozen=True)
class Verdict:
    """What every rank does with one in_order call.

    Attributes:
        go: True: the barriers run. False: nobody enters them; each rank emits at once.
        decider: the rank whose check-in wrote the verdict.
        missing: the ranks that had not checked in when a `skip` was decided (empty for `go`).
    """

    go: bool
    decider: int
    missing: tuple[int, ...] = ()

    def encode(self) -> bytes:
        """`go <decider>` or `skip <decider> <missing, comma-separated>`: plain ASCII, never code."""
        missing = ",".join(map(str, self.missing)).encode()
        return b"%s %d %s" % (GO if self.go else SKIP, self.decider, missing)

    @classmethod
    def decode(cls, blob: bytes) -> Verdict:
        """The verdict in `blob`. Anything else (a foreign or damaged value) reads as a `skip` by
        nobody (-1): unordered output, never a barrier some rank might not enter."""
        word, _, rest = blob.partition(b" ")
        decider, _, missing = rest.partition(b" ")
        try:
            verdict = cls(word == GO, int(decider), tuple(int(q) for q in missing.split(b",") if q))
        except ValueError:
            return cls(False, -1)
        return verdict if word in (GO, SKIP) else cls(False, -1)


def site_key(site: Site) -> str:
    """A short name for a call site, the same on every rank."""
    return f"{zlib.crc32(repr(site).encode()):08x}"


def _site_prefix(site: Site) -> str:
    return f"b/{site_key(site)}/"


class Janitor:
    """Deletes keys off the call path: one daemon thread, on the process group's store connection."""

    def __init__(self, store: Any, warn: Callable[[str], None]) -> None:
        self._store = store
        self._warn = warn
        self._keys: collections.deque[str] = collections.deque()
        self._changed = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def discard(self, *keys: str) -> None:
        with self._changed:
            self._keys.extend(keys)
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
                name = self._keys[0]
            try:
                self._store.delete_key(name)
            except (RuntimeError, OSError):  # the store is gone: nothing left to keep small
                pass
            except Exception as exc:  # not expected; the thread must outlive it, or the store would grow
                self._warn(f"the in_order check-in could not delete a store key: {exc!r}")
            with self._changed:
                self._keys.popleft()
                self._changed.notify_all()


class CheckIn:
    """One process's side of the check-in: its connection, its suspects, and what it must delete.

    Args:
        store: this process's own connection to the job's store (prefixed); its timeout is ours.
        rank, world_size: this process's place in the job.
        janitor: where keys to delete go (`Janitor` on the process group's connection).
    """

    def __init__(self, store: Any, rank: int, world_size: int, janitor: Janitor) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.janitor = janitor
        self.suspects: dict[Site, tuple[tuple[int, ...], int]] = {}  # site -> (ranks, since which call)
        self._stale: dict[Site, list[str]] = {}  # keys of a site's last `skip`, deleted at its next verdict

    def verdict(self, site: Site, count: int, timeout: float) -> tuple[Verdict, Callable[[], None]]:
        """Check in for call `count` at `site`; the verdict, and what to call once it has been followed."""
        base = _site_prefix(site) + f"{count}/"
        store = self.store
        store.append(base + "who", b"%d," % self.rank)
        arrived = store.add(base + "n", 1)
        if arrived == self.world_size:
            verdict = Verdict(True, self.rank)
            store.set(base + "v", verdict.encode())
        elif arrived > GIVE_UP or not self._suspects_away(site, base):
            verdict = self._await(base, timeout)
        else:
            verdict = self._give_up(base, self.suspects[site][0])
        return verdict, lambda: self._settle(site, count, verdict)

    def _suspects_away(self, site: Site, base: str) -> bool:
        """Whether this call should not wait: the site's suspects have not checked in, here or since.

        A suspect that checks in late (after a `skip`) writes `back/<rank>` at the site, the count it
        came to: from then on the site waits for it again.
        """
        suspects, since = self.suspects.get(site, ((), 0))
        if not suspects:
            return False
        back = [_site_prefix(site) + f"back/{q}" for q in suspects]
        if set(suspects) <= self._checked_in(base) or (
            self.store.check(back) and min(int(self._peek(name) or b"0") for name in back) >= since
        ):
            del self.suspects[site]
            return False
        return True

    def _give_up(self, base: str, missing: Optional[tuple[int, ...]] = None) -> Verdict:
        """Add GIVE_UP to the arrivals; `go` if every rank had arrived first, else write and return `skip`."""
        total = self.store.add(base + "n", GIVE_UP)
        if total % GIVE_UP >= self.world_size:  # the last arrival came first: its `go` stands
            return Verdict(True, -1)
        if missing is None:
            missing = tuple(sorted(set(range(self.world_size)) - self._checked_in(base)))
        first = total // GIVE_UP == 1  # only the first to give up writes the verdict and speaks for it
        verdict = Verdict(False, self.rank if first else -1, missing)
        if first:
            self.store.set(base + "v", verdict.encode())
        return verdict

    def _checked_in(self, base: str) -> set[int]:
        return {int(q) for q in self._peek(base + "who").split(b",") if q.isdigit()}

    def _await(self, base: str, timeout: float) -> Verdict:
        """Wait for the verdict; past the deadline give up -- after one more timeout at most when a
        missing rank is held up by a check-in elsewhere that should give way (`_outlast`)."""
        start = time.time()
        deadline = start + timeout
        self._publish_wait(base, deadline, b"wait")
        verdict = self._get(base + "v", deadline)
        if verdict is None and self._outlast(base, start, deadline):
            verdict = self._get(base + "v", deadline + timeout)
        if verdict is None:
            self._publish_wait(base, deadline, b"gaveup")
            return self._give_up(base)
        self._publish_wait(base, deadline, b"done")
        return verdict

    def _publish_wait(self, base: str, deadline: float, state: bytes) -> None:
        self.store.set(BUSY + str(self.rank), b"%s %.3f %s" % (base.encode(), deadline, state))

    def _get(self, name: str, deadline: float) -> Optional[Verdict]:
        """The verdict in `name`, waiting until `deadline` (epoch seconds); None if none came."""
        self.store.set_timeout(datetime.timedelta(seconds=max(deadline - time.time(), 0.001)))
        try:
            return Verdict.decode(bytes(self.store.get(name)))
        except RuntimeError:  # DistStoreError: the deadline passed with no verdict
            return None

    def _peek(self, name: str) -> bytes:
        """The value of `name`, or b"" when it has none: never waits, never creates it."""
        blob = bytes(self.store.compare_set(name, _UNSET, _UNSET))
        return b"" if blob == _UNSET else blob

    def _outlast(self, base: str, start: float, deadline: float) -> bool:
        """Whether to wait once more: a missing rank is held up at another check-in, and will come.

        The hard case is a wait-for cycle: rank 0 waits at a main-only call for ranks that never make
        it, while they wait for rank 0 at the next call. One side must give up so that the other can
        go on, and both ask the same question: the call with more ranks checked in is the one the job
        means (the tie goes to the call whose wait began later). A rank that gave up elsewhere while
        we waited is on its way too. Each rank publishes its wait (`BUSY`) for this.
        """
        missing = set(range(self.world_size)) - self._checked_in(base)
        for q in missing:
            where, _, rest = self._peek(BUSY + str(q)).partition(b" ")
            when, _, state = rest.partition(b" ")
            try:
                their_deadline = float(when)
            except ValueError:
                continue
            if where == base.encode():
                continue
            if state == b"gaveup" and their_deadline >= start:
                return True
            if state == b"wait" and self._means_more(base, where.decode(), deadline, their_deadline):
                return True
        return False

    def _means_more(self, base: str, theirs: str, deadline: float, their_deadline: float) -> bool:
        ours_n, theirs_n = (int(self._peek(name + "n") or b"0") % GIVE_UP for name in (base, theirs))
        return ours_n > theirs_n or (ours_n == theirs_n and their_deadline < deadline)

    def _settle(self, site: Site, count: int, verdict: Verdict) -> None:
        """After the call: suspects, and this call's keys (and a stale verdict) to the janitor."""
        base = _site_prefix(site) + f"{count}/"
        done = self._stale.pop(site, [])
        if verdict.go:
            self.suspects.pop(site, None)
            if verdict.decider == self.rank:  # the last to arrive: every rank has read `v` by now
                done += [base + "n", base + "who", base + "v"]
        else:
            done += [base + "n", base + "who"]  # a late rank recreates them, and deletes them again
            self._stale[site] = [base + "v"]
            if self.rank in verdict.missing:  # we came late: the others' suspicion of us ends here
                self.store.set(_site_prefix(site) + f"back/{self.rank}", str(count).encode())
            elif site not in self.suspects:
                self.suspects[site] = (verdict.missing, count)
        self.janitor.discard(*done)
