"""A seeded schedule explorer for barrier mode: the real code, every interleaving a seed picks.

Each rank is a thread running the product's own barrier-mode call (`barrier.side.BarrierSide.call`, which
checks in through `checkin.CheckIn` and then takes its turns by `handoff.Handoff`) over an in-memory store. Only one rank
runs at a time: every store operation, delay and collective stops the rank and hands control to the
scheduler, which picks the next operation to run at random (from the seed) among those that can run.
Time is virtual: it moves only when nothing can run, to the next deadline or wake-up. So a schedule
is a pure function of its seed, and a failing seed replays exactly:

    python tests/unit/explorer.py --seed 1234 -v         # one schedule, its script and events
    python tests/unit/explorer.py --schedules 200000 --jobs 2   # the long run (docs/barrier-mode.md)

The seed draws a script per rank (2-4 ranks, 1-2 sites, steps with a user collective or not; in half the
schedules each rank's first call agrees on the mode first, through `store.mode`) and the faults of a
TCPStore job: a rank that skips a call or a step, comes late, makes a main-only call, dies before an
operation reaches the server or after it was applied, or inside its turn (in its log handler), or whose
handler is slow; junk written to a check-in or handoff key; a connection that fails (before or after
the server applied the operation; it stays failed) and whose reconnect may fail too; the wall clock
stepped (the check-in must not read it); a handler that logs in_order itself while it emits (site H); a rank
late past T at two calls in a row of one line, one that skips the first line's first call (the other line after
it), and a signal in a store wait (torch's client restarts it with its whole timeout). `get`
of a missing key waits until the connection's timeout
and raises; a waiter whose key is set and deleted before it runs is woken. After each schedule `check`
holds the invariants, at the numbers of `accelerate_inorder_fix.bounds`, per call, rank and divergence:

- one verdict per call, of every kind, on every rank that could read one; the collectives paired (no
  rank in a barrier while another is in another collective); a `go` call's turns enter no collective;
- no check-in longer than T; no call (mode agreement, check-in and turns) longer than 1.5 T, beyond the
  rank's own handler's time;
- each rank's waiting in calls at most 1.5 T per divergence (a death is one), beyond the other ranks'
  delays and slow handlers;
- a rank that comes to a call whose verdict is written already does not wait; once a skip stands, no
  rank waits in that call any more;
- every enabled record emitted exactly once, and a `go` call's records in rank order, no record of
  another `go` call between them, no rank returning before all are out, for every call no fault touched;
- a skip names only ranks that had not checked in at that call when it was written; a rank named for not
  handing over had not when it was named, and the rank before it had (or junk, a failed connection); where
  the faults are deaths in turns only, each rank dead in its turn is named (but right after another's death);
- the store holds at most 2N + 1 keys per site used and one per rank (and what a fault left, bounded);
- nothing hangs: every rank ends (or died), unless a user collective waits for a dead rank, and nothing runs
  on: a schedule stops, failed, past `MAX_OPS` store operations (a loop the virtual clock does not move).

`--jobs N` shards the seeds over N processes; every run ends with a coverage table (schedules per fault
kind and per outcome).
"""

from __future__ import annotations

import argparse
import datetime
import math
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate_inorder_fix import bounds  # noqa: E402
from accelerate_inorder_fix._call import InOrderCall, LogArgs  # noqa: E402
from accelerate_inorder_fix._origin import Origin  # noqa: E402
from accelerate_inorder_fix.barrier import (
    checkin,  # noqa: E402
    handoff,  # noqa: E402
    side,  # noqa: E402
    turns,  # noqa: E402
)
from accelerate_inorder_fix.store.connection import SLICE  # noqa: E402
from accelerate_inorder_fix.testing import StoreTimeout  # noqa: E402  (what a wait raises at its deadline)


T = 10.0  # the timeout, in virtual seconds
UNDONE_BY_FAILURE, UNDONE_BY_DEATH = 3, 2  # store keys a failed connection, a death, may leave undeleted
MAX_OPS = 2000  # store operations in one schedule: over four times the most a drawn one makes; past it, one runs on
CONNECTION_TIMEOUT = T + 5.0  # a connection's own timeout (`store.connection.open_store`): where `get` gives up
SITES = {name: (f"train_{name}.py", "step", 10 + i) for i, name in enumerate("ABMH")}


class Killed(BaseException):
    """A rank's process dies (not an Exception: nothing in the product may catch it)."""


@dataclass
class Request:
    rank: int
    kind: str  # "op", "delay", "collective", "resume"
    name: str = ""
    args: tuple[Any, ...] = ()
    until: float = 0.0
    done: bool = False
    woken: bool = False  # a wait woken by a compare_set on a key that is not there (TCPStore does that)
    written: set[str] = field(default_factory=set)  # keys written while it waited (set then deleted: still woken)
    result: Any = None
    error: Optional[BaseException] = None
    conn: Any = None  # the connection it came on (a failure breaks it for good)


@dataclass
class Script:
    """What each rank does, and the faults of the schedule."""

    n: int
    actions: dict[int, list[tuple[Any, ...]]]
    divergences: int = 0
    disabled: set[tuple[int, int]] = field(default_factory=set)  # (rank, call number): records not enabled
    die_at: dict[int, int] = field(default_factory=dict)  # rank -> the store op it dies at
    fail_at: dict[int, int] = field(default_factory=dict)  # rank -> the store op whose connection fails
    # ranks whose failure or death at its op strikes after the server applied the op (the reply is lost)
    applied: set[int] = field(default_factory=set)
    reconnect_fails: set[int] = field(default_factory=set)  # ranks whose reconnect fails too (the store gone for them)
    junk_after: Optional[int] = None  # junk goes into a check-in key after this many store operations
    junk_handoff: bool = False  # ... into a handoff key being waited for, only
    die_in_turn: dict[int, int] = field(default_factory=dict)  # rank -> the call whose emit it dies in
    slow: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (call, seconds its emit takes)
    wall_jump: float = 0.0
    agree: bool = False  # each rank's first call agrees on the mode first, through the store (`store.mode`)
    # (rank, step, site) -> the ordinary delay (no divergence) the rank makes before that call; a drawn script's
    # only: others' delays are what a rank may wait for besides the divergences (`_ordinary_wait`)
    ordinary: dict[tuple[int, int, str], float] = field(default_factory=dict)
    signal: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (its n-th wait, fraction): a signal
    # that far into that wait, which torch's client then restarts with its whole timeout (EINTR)
    nested_at: int = 0  # every rank's handler, emitting its record of its call k at site A, makes an in_order call (H)
    notes: list[str] = field(default_factory=list)


def _signal() -> Any:
    """A signal one thread gives and another waits for (`release`, `acquire`): a held plain lock."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class Sim:
    """The scheduler, the virtual clock and the store of one schedule."""

    def __init__(self, seed: int, script: Script, wall_clock: bool = False) -> None:
        self.rng = random.Random(seed * 7919 + 1)
        self.script = script
        self.now = 0.0
        self.data: dict[str, bytes] = {}
        # Plain locks as binary semaphores (held: not signalled), strictly alternating: the scheduler lets rank r
        # run (`go[r]`), the rank says it stopped (`back`: it blocked, or ended)
        self.go = {r: _signal() for r in range(script.n)}
        self.back = _signal()
        self.pending: dict[int, Request] = {}
        self.ended: set[int] = set()
        self.dead: set[int] = set()
        self.ops = dict.fromkeys(range(script.n), 0)
        self.events: list[tuple[Any, ...]] = []
        self.violations: list[str] = []
        self.wall_clock = wall_clock  # mutation: the check-in reads a wall clock that can step
        self.over = False  # the schedule was stopped: every blocked rank unwinds
        self.tick = 0  # store operations run so far
        self.marked: dict[tuple[int, bytes], int] = {}  # (rank, marker) -> tick it was set
        self.looking: dict[int, int] = {}  # rank -> tick of its first marker read in a row of them
        self.junked: set[int] = set()  # ranks whose marker was overwritten with junk
        self.junked_handoff: set[int] = set()  # ranks whose handoff key junk was written into
        self.decided: dict[str, float] = {}  # verdict key -> when a verdict was first written there
        self.handed: dict[str, int] = {}  # handoff key -> the store operation by which its rank handed over
        self.failed: set[int] = set()  # ranks whose connection failed (what they were doing may be left undone)
        self.gone: set[int] = set()  # ranks whose reconnect failed too: they cannot read a verdict
        self.touched: set[str] = set()  # calls ("<site>/<k>") a failure or death struck in
        self.current: dict[int, str] = {}  # rank -> the call it is making
        self.made: dict[tuple[int, str], int] = {}  # (rank, site) -> calls it made there
        self.made_calls: dict[int, int] = {}  # rank -> in_order calls it made (nested ones included)
        self.writer: dict[str, Optional[int]] = {}  # verdict key -> the rank whose write stands (None: junk)
        self.first: dict[str, bytes] = {}  # verdict key -> the value that stands
        self.handling: dict[tuple[int, int], float] = {}  # (rank, its call) -> its handler's own time (slow, nested)
        self.calling: dict[int, int] = {}  # rank -> the number of the call it is making
        self.stretched: dict[int, float] = {}  # rank -> how far a signal stretched one of its waits

    # -- what a rank thread calls -----------------------------------------------------------------

    def clock(self) -> float:
        if self.wall_clock and self.now >= 0.5 * T:
            return self.now + self.script.wall_jump
        return self.now

    def block(self, request: Request) -> Any:
        """Stop this rank until the scheduler has run `request` and lets it go on (one rank runs at a time)."""
        if self.over:
            raise Killed()
        self.pending[request.rank] = request
        self.back.release()
        self.go[request.rank].acquire()
        if request.error is not None:
            raise request.error
        return request.result

    def finish(self, rank: int, died: bool, calls: int) -> None:
        self.ended.add(rank)
        self.made_calls[rank] = calls
        if died:
            self.dead.add(rank)
            self.touched.add(self.current.get(rank, ""))
        self.back.release()

    # -- the scheduler ----------------------------------------------------------------------------

    def run(self, targets: dict[int, Any], limit: float = 40 * T) -> None:
        threads = [threading.Thread(target=targets[r], daemon=True) for r in targets]
        for t in threads:  # each runs to its first stop, one at a time
            t.start()
            self.back.acquire()
        while len(self.ended) < self.script.n:
            if self.tick > MAX_OPS:  # a rank that loops on the store while the virtual clock stands still
                self._stuck(f"ran on: {self.tick} store operations by t={self.now:g}")
                break
            if not self._step():
                if not self._advance(limit):
                    self._stuck()
                    break
        for t in threads:
            t.join(0.5)

    def _resume(self, rank: int) -> None:
        """Let `rank` run until it stops again."""
        self.go[rank].release()
        self.back.acquire()

    def _stuck(self, why: str = "") -> None:
        """Stop the schedule: a hang (nothing can run), or `why` (a rank that runs on); every blocked rank unwinds."""
        waiting = {r: (q.kind, q.name) for r, q in self.pending.items()}
        if why:
            self.violations.append(f"{why}: {waiting}")
        elif self.dead and all(q.kind == "collective" for q in self.pending.values()):
            self.events.append(("killed by the launcher", waiting))  # a collective waits for a dead rank
        else:
            self.violations.append(f"hang at t={self.now:g}: {waiting}")
        self.over = True
        for r, q in sorted(self.pending.items()):
            q.error, q.done = Killed(), True
            del self.pending[r]
            self._resume(r)

    def _runnable(self, q: Request) -> bool:
        if q.kind == "op" and q.name in ("wait", "get"):
            keys = q.args[0] if q.name == "wait" else [q.args[0]]
            return q.woken or all(k in self.data or k in q.written for k in keys) or self.now >= q.until
        if q.kind == "delay":
            return self.now >= q.until
        if q.kind == "collective":
            return all(r in self.pending and self.pending[r].kind == "collective" for r in self._alive())
        return True

    def _alive(self) -> list[int]:
        return [r for r in range(self.script.n) if r not in self.ended]

    def _step(self) -> bool:
        self._maybe_junk()
        ready = [q for q in self.pending.values() if self._runnable(q)]
        if not ready:
            return False
        q = self.rng.choice(sorted(ready, key=lambda q: q.rank))
        if q.kind == "collective":
            self._pair([self.pending[r] for r in self._alive()])
            return True
        del self.pending[q.rank]
        if q.kind == "op":
            self._operate(q)
        q.done = True
        self._resume(q.rank)
        return True

    def _pair(self, group: list[Request]) -> None:
        tags = {q.name for q in group}
        if len(tags) > 1:
            self.violations.append(f"collectives paired across calls at t={self.now:g}: {sorted(tags)}")
        for q in group:
            q.kind = "resume"  # each resumes in its own turn, one at a time

    def _advance(self, limit: float) -> bool:
        times = [q.until for q in self.pending.values() if q.kind == "delay" or q.name in ("wait", "get")]
        future = [t for t in times if t > self.now]
        if not future or min(future) > limit:
            return False
        self.now = min(future)
        return True

    def _maybe_junk(self) -> None:
        if self.script.junk_after is None or self.tick < self.script.junk_after:
            return
        # A counter, a marker, or the verdict key of a call being waited at, before its verdict: a verdict
        # that stands was read by some ranks already, and bytes changed under them cannot be taken back.
        keys = sorted(k for k in self.data if k.startswith(checkin.MARK) or k.startswith("c/"))
        keys += sorted({k for q in self.pending.values() if q.name == "wait" for k in q.args[0] if k not in self.data})
        if self.script.junk_handoff:
            keys = [k for k in keys if k.startswith("h/")]
        if keys:
            key = self.rng.choice(keys)
            self._write(key, b"\x00junk", None)
            if key.startswith(checkin.MARK):
                self.junked.add(int(key[len(checkin.MARK) :]))
            if key.startswith("h/"):
                self.junked_handoff.add(int(key.rpartition("/")[2]))
            self.events.append(("junk", key, self.now))
            self.script.junk_after = None

    # -- the store --------------------------------------------------------------------------------

    def _operate(self, q: Request) -> None:
        """Run one store operation: before it, the rank may die or its connection fail (the server never sees
        the operation); with `Script.applied`, the server applies it and the reply is lost."""
        r = q.rank
        self.ops[r] += 1
        strikes = self.ops[r] in (self.script.die_at.get(r), self.script.fail_at.get(r))
        if strikes and r not in self.script.applied:
            self._strike(q)
            return
        self.tick += 1
        self._note_markers(q)
        try:
            q.result = (
                getattr(self, "_" + q.name)(q) if q.name in ("wait", "get") else getattr(self, "_" + q.name)(*q.args)
            )
        except StoreTimeout as exc:
            q.error = exc
        except ConnectionError as exc:  # the server closed the connection (an `add` on junk): it stays closed
            q.error, q.conn.broken = exc, True
            self.failed.add(r)
            self.touched.add(self.current.get(r, ""))
        self._note_writes(q)
        if strikes:
            self._strike(q)

    def _strike(self, q: Request) -> None:
        """The rank dies at `q` (`Script.die_at`), or its connection fails there for good (`Script.fail_at`)."""
        r = q.rank
        self.touched.add(self.current.get(r, ""))
        if self.script.die_at.get(r) == self.ops[r]:
            q.error = Killed()
            return
        q.error = ConnectionError("connection closed")
        q.conn.broken = True
        self.failed.add(r)

    def _note_writes(self, q: Request) -> None:
        """Who handed over when, which verdict stands and who wrote it; what a skip names."""
        if q.error is not None:
            return
        if q.name == "set" and q.args[0].startswith("h/") and q.args[1] == handoff.HANDED:
            self.handed.setdefault(q.args[0], self.tick)
        key = q.args[0] if q.args and isinstance(q.args[0], str) else ""
        verdict_key = key.startswith("v/")
        if q.name == "compare_set" and verdict_key and q.args[0] in self.data:  # not a peek's miss
            if q.args[0] not in self.decided and q.result == q.args[2]:
                self.writer[q.args[0]] = q.rank
            self.decided.setdefault(q.args[0], self.now)
            self.first.setdefault(q.args[0], self.data[q.args[0]])
        if q.name == "compare_set" and q.args[0].startswith("v/") and q.args[2].startswith(checkin.SKIP):
            if q.result == q.args[2]:  # a skip written: who was counted at that call then
                self._written_skip(q.args[0], q.result)

    def _note_markers(self, q: Request) -> None:
        """Who set which marker when, and when each rank began reading the others' (its snapshot)."""
        key = q.args[0] if q.args and isinstance(q.args[0], str) else ""
        if q.name == "set" and key.startswith(checkin.MARK):
            self.marked.setdefault((q.rank, q.args[1]), self.tick)
        # A give-up reads markers, counters, keys; then writes: one look, from its first marker read.
        if q.name not in ("compare_set", "check"):
            self.looking.pop(q.rank, None)
        elif key.startswith(checkin.MARK) and q.rank not in self.looking:
            self.looking[q.rank] = self.tick

    def _written_skip(self, key: str, blob: bytes) -> None:
        """A skip may name only ranks that had not checked in at its call when its writer began to look."""
        marker = key[len("v/") :].encode()
        verdict = checkin.Verdict.decode(blob)
        began = self.looking.get(verdict.decider, self.tick)
        wrong = {q for q in verdict.missing if self.marked.get((q, marker), self.tick + 1) < began}
        # A damaged marker says nothing of where its rank is; the dead did miss the call; a rank whose
        # connection failed may have gone on without its count, and been missed; junk in a rank's wake key
        # gives it its turn early, where its handler's nested in_order call moves its marker on.
        woken = {(m + 1) % self.script.n for m in self.junked_handoff} if self.script.nested_at else set()
        wrong -= self.junked | self.dead | self.failed | woken
        if wrong:
            self.violations.append(f"skip at {key} names rank(s) {sorted(wrong)}, which had checked in there")

    def _write(self, key: str, value: bytes, writer: Optional[int]) -> None:
        """Store `value`, and wake every waiter of `key`: one whose key is deleted before it runs was woken all
        the same (the server answers its waiters when the write lands). A foreign write (`writer` None) into a
        verdict key is the value that stands there."""
        self.data[key] = value
        for q in self.pending.values():
            if q.name == "wait" and key in q.args[0] or q.name == "get" and key == q.args[0]:
                q.written.add(key)
        if writer is None and key.startswith("v/") and key not in self.decided:
            self.decided[key], self.writer[key], self.first[key] = self.now, None, value

    def _set(self, key: str, value: bytes) -> None:
        self._write(key, value, 0)

    def _add(self, key: str, amount: int) -> int:
        old = self.data.get(key, b"0")
        if not old.isdigit():
            raise ConnectionError("the store closed the connection (add on a value that is no number)")
        self._write(key, str(int(old) + amount).encode(), 0)
        return int(self.data[key])

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """torch's semantics, down to its quirk: on a key that is not there, with `expected` not empty, it
        sets nothing, answers `expected`, and wakes every wait on that key all the same."""
        current = self.data.get(key)
        if current is None and expected:
            for q in self.pending.values():
                if q.name == "wait" and key in q.args[0]:
                    q.woken = True
        if current == expected or (current is None and expected == b""):
            self._write(key, desired, 0)
            return desired
        return expected if current is None else current

    def _wait(self, q: Request) -> None:
        if not (q.woken or all(k in self.data or k in q.written for k in q.args[0])):
            raise StoreTimeout("wait timeout")

    def _get(self, q: Request) -> bytes:
        """TCPStore's `get`: a wait for the key (until the connection's timeout: then it raises), then its value
        (b"" when it was deleted after the write that woke the wait)."""
        key = q.args[0]
        if key not in self.data and key not in q.written and not q.woken:
            raise StoreTimeout(f"get timeout: {key}")
        return self.data.get(key, b"")

    def _check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def _delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


class Connection:
    """One rank's store connection: each call stops the rank until the scheduler runs it."""

    def __init__(self, sim: Sim, rank: int) -> None:
        self.sim, self.rank = sim, rank
        self.broken = False  # a failed connection stays failed, as a TCPStore client's does
        self.waits = 0

    def _op(self, name: str, *args: Any, until: float = 0.0) -> Any:
        if self.broken:
            raise ConnectionError("connection closed")
        return self.sim.block(Request(self.rank, "op", name, args, until=until, conn=self))

    def set(self, key: str, value: Any) -> None:
        self._op("set", key, _b(value))

    def add(self, key: str, amount: int) -> int:
        return int(self._op("add", key, amount))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return bytes(self._op("compare_set", key, _b(expected), _b(desired)))

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        self._op("wait", list(keys), until=self.sim.now + self._signalled(timeout.total_seconds()))

    def _signalled(self, seconds: float) -> float:
        """How long a wait of `seconds` lasts: with a signal (`Script.signal`) at a fraction of it, torch's client
        restarts it with the whole timeout; the stretch is checked on its own, not as waiting."""
        which, fraction = self.sim.script.signal.get(self.rank, (0, 0.0))
        self.waits += 1
        if which == self.waits:
            self.sim.stretched[self.rank] = fraction * seconds
            key = (self.rank, self.sim.calling.get(self.rank, 0))
            self.sim.handling[key] = self.sim.handling.get(key, 0.0) + fraction * seconds
        return seconds * (1 + fraction) if which == self.waits else seconds

    def get(self, key: str) -> bytes:
        return bytes(self._op("get", key, until=self.sim.now + CONNECTION_TIMEOUT))

    def get_within(self, key: str, seconds: float) -> bytes:
        """`get` on a client whose timeout is `seconds` (`store.connection.Connection.get_within`): one request."""
        return bytes(self._op("get", key, until=self.sim.now + self._signalled(seconds)))

    def delete_key(self, key: str) -> bool:
        return bool(self._op("delete_key", key))

    def check(self, keys: list[str]) -> bool:
        return bool(self._op("check", list(keys)))


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


# -- one rank's program ------------------------------------------------------------------------------


class Rank:
    """A rank: the product's barrier-mode call, with fakes for accelerate's state and the logger."""

    def __init__(self, sim: Sim, rank: int) -> None:
        self.sim, self.rank, self.n = sim, rank, sim.script.n
        # The product's own side (its check-in, turns and warnings), on the virtual clock
        self.barrier = WatchedSide(self, Connection(sim, rank), rank, self.n, clock=sim.clock)
        self.side = self.barrier.checkin
        self.verdicts: list[checkin.Verdict] = []
        self.process_index, self.num_processes = rank, self.n
        self.logger = self
        self.calls = 0
        self.at_site: dict[str, int] = {}  # site -> calls this rank made there (retired ones too)
        self.number: dict[str, int] = {}  # call tag ("<site>/<k>") -> this rank's call number
        self.call_tag = ""
        self.in_turns = False  # inside a `go` call's handoff turns
        self.nested = False  # its handler made its in_order call already (`Script.nested_at`)

    # accelerate's PartialState, the adapter and its logger -- as `BarrierSide.call` uses them
    def wait_for_everyone(self) -> None:
        if self.in_turns:
            self.sim.violations.append(f"rank {self.rank} entered a collective in the turns of {self.call_tag}")
        self.sim.block(Request(self.rank, "collective", "turn " + self.call_tag))

    def isEnabledFor(self, level: int) -> bool:
        return (self.rank, self.calls) not in self.sim.script.disabled

    def process(self, msg: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return msg, kwargs

    def addFilter(self, f: Any) -> None:  # the record's `rank` and `hostname`: not looked at here
        pass

    def removeFilter(self, f: Any) -> None:
        pass

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """The rank's log handler: it may die, be slow, or (`Script.nested_at`) log in_order itself, once."""
        if self.sim.script.die_in_turn.get(self.rank) == msg[1]:
            raise Killed()
        call, seconds = self.sim.script.slow.get(self.rank, (0, 0.0))
        if call == msg[1]:
            self.sim.handling[(self.rank, call)] = self.sim.handling.get((self.rank, call), 0.0) + seconds
            self.sim.block(Request(self.rank, "delay", until=self.sim.now + seconds))
        at = self.at_site.get(checkin.site_name(SITES["A"]), 0)
        if msg[2] == "A" and at == self.sim.script.nested_at and not self.nested:
            self.nested = True  # an in_order call from inside this rank's turn; its own record then comes first
            outer, began = (self.call_tag, self.sim.current[self.rank]), self.sim.now
            self.call("H")
            self.call_tag, self.sim.current[self.rank] = outer
            if self.rank in self.sim.failed:  # a failed connection stays failed: the outer call's turns too
                self.sim.touched.add(outer[0])
            key = (self.rank, msg[1])  # the nested call is the outer call's handler time, checked on its own
            self.sim.handling[key] = self.sim.handling.get(key, 0.0) + self.sim.now - began
        self.sim.events.append(("emit", self.rank, msg, self.sim.now))

    def call(self, letter: str, step: Optional[int] = None) -> None:
        """One in_order call at site `letter` (in the script's `step`, when it says): `BarrierSide.call`, timed from
        its start to its return."""
        self.calls += 1
        site = SITES[letter]
        name = checkin.site_name(site)
        self.at_site[name] = self.at_site.get(name, 0) + 1
        self.call_tag = self.sim.current[self.rank] = f"{name}/{self.at_site[name]}"
        self.number[self.call_tag] = self.calls
        self.sim.calling[self.rank] = self.calls
        self.sim.made[(self.rank, name)] = self.at_site[name]
        start, call, tag = self.sim.now, self.calls, self.call_tag
        log = LogArgs(self, 20, (self.rank, call, letter, step), (), {})
        number = self.at_site[name]  # as the session numbers it: every call at the site is a barrier-mode one
        self.barrier.call(InOrderCall(site, log, Origin(self.rank, "host", False), T, number))
        self.sim.events.append(("call", self.rank, tag, start, self.sim.now, call))

    def main(self) -> None:
        died = False
        try:
            self.sim.block(Request(self.rank, "resume"))
            for action in self.sim.script.actions[self.rank]:
                if action[0] == "call":
                    self.call(*action[1:])
                elif action[0] == "delay":
                    self.sim.block(Request(self.rank, "delay", until=self.sim.now + action[1]))
                else:
                    self.sim.block(Request(self.rank, "collective", f"user {action[1]}"))
        except Killed:
            died = True
        except Exception as exc:  # noqa: BLE001 -- an exception into user code is itself a violation
            self.sim.violations.append(f"rank {self.rank} raised {exc!r}")
        finally:
            self.sim.finish(self.rank, died, self.calls)


class WatchedSide(side.BarrierSide):
    """The product's `BarrierSide`, watched: each check-in's verdict and time, each `go` call's turns."""

    def __init__(self, rank: Rank, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rank = rank
        verdict, take, last_break = self.checkin.verdict, self.turns.take, self.turns._last_break
        named_at: dict[tuple[str, int], int] = {}  # (call, rank named): the tick this rank first found it missing

        def watched_verdict(
            call: checkin.Call, deadline: float, timeout: float
        ) -> tuple[checkin.Call, checkin.Verdict]:
            start = rank.sim.now
            made, result = verdict(call, deadline, timeout)
            tag = made.marker  # the call it made in the store (renumbered after a call it passed by)
            if tag != call.marker:
                rank.number[tag] = rank.number.pop(call.marker)
                rank.call_tag = rank.sim.current[rank.rank] = tag
            rank.verdicts.append(result)
            gone = result.why is checkin.Why.STORE  # it could not read the verdict: what it followed is its own
            rank.sim.events.append(("verdict", rank.rank, tag, result, start, rank.sim.now, rank.number[tag], gone))
            return made, result

        def watched_last_break(call: checkin.Call, ranks: range) -> Optional[int]:
            missing = last_break(call, ranks)
            if missing is not None:  # the store operations run before this rank named it (a later naming of
                named_at.setdefault((call.marker, missing), rank.sim.tick)  # another, or in a nested call: not)
            return missing

        def watched_take(call: checkin.Call, deadline: float, timeout: float, emit: Any) -> tuple[int, ...]:
            begin, tag, named = rank.sim.now, call.marker, ()
            rank.in_turns = True
            try:
                named = take(call, deadline, timeout, emit)
            finally:
                rank.in_turns = False
                event = (
                    "turns",
                    rank.rank,
                    tag,
                    begin,
                    rank.sim.now,
                    named,
                    deadline,
                    rank.number[tag],
                    tuple(named_at.get((tag, q), 0) for q in named),
                )
                rank.sim.events.append(event)
            return named

        self.checkin.verdict = watched_verdict  # type: ignore[method-assign]
        self.turns.take = watched_take  # type: ignore[method-assign]
        self.turns._last_break = watched_last_break  # type: ignore[method-assign]


# -- schedules ---------------------------------------------------------------------------------------


def draw(seed: int, extras: bool = True) -> Script:
    """The script of schedule `seed`: ranks, sites, steps, and at most two divergences (three with `extras`).

    Args:
        extras: also draw, from a second generator, the faults added after the first long runs (a failure or
            death after the server applied the op, a reconnect that fails). Without it a seed draws the
            script it drew before them, so seeds recorded then still replay (`draw(seed, extras=False)`).
    """
    rng = random.Random(seed)
    n = rng.choice([2, 2, 3, 4])
    sites = ["A", "B"][: rng.choice([1, 2])]
    steps = rng.randint(2, 5)
    collectives = rng.random() < 0.6
    script = Script(n, {r: [] for r in range(n)})
    main_only = rng.random() < 0.15
    for step in range(steps):
        for r in range(n):
            if main_only and r == 0:
                script.actions[r].append(("call", "M"))
            for name in sites:
                if rng.random() < 0.3:
                    script.actions[r].append(("delay", round(rng.uniform(0, 0.2 * T), 3)))
                    script.ordinary[(r, step, name)] = script.actions[r][-1][1]
                script.actions[r].append(("call", name, step))
            if collectives:
                script.actions[r].append(("collective", step))
    if main_only:
        script.divergences += 1
        script.notes.append("rank 0 makes a main-only call M each step")
    for _ in range(rng.choice([0, 1, 1, 1, 2])):
        _diverge(rng, script, collectives)
    for r in range(n):
        for call in range(1, 1 + sum(a[0] == "call" for a in script.actions[r])):
            if rng.random() < 0.1:
                script.disabled.add((r, call))
    if extras:
        nesting = random.Random(seed * 13 + 5)
        if nesting.random() < 0.15:  # a handler that logs in_order, on every rank, at one call
            script.nested_at = nesting.randint(
                1, min(sum(a[0] == "call" for a in acts) for acts in script.actions.values()) or 1
            )
            script.divergences += 1
            script.notes.append(f"nested: every rank's handler logs in_order at its call {script.nested_at} at A")
        _extra_fault(seed, script)
        _late_fault(seed, script)
    return script


def _diverge(rng: random.Random, script: Script, collectives: bool) -> None:
    kinds = ["skip", "skip-step", "late", "junk", "junk-handoff", "fail", "wall", "slow"]
    kinds += [] if collectives else ["die", "die", "die-in-turn", "die-in-turn"]
    kind = rng.choice(kinds)
    r = rng.randrange(script.n)
    calls = [i for i, a in enumerate(script.actions[r]) if a[0] == "call"]
    if not calls:
        return
    at = rng.choice(calls)
    script.divergences += 1
    if kind == "skip":
        del script.actions[r][at]
    elif kind == "skip-step":  # every call of one step (up to its collective, or the end)
        end = next((i for i in range(at, len(script.actions[r])) if script.actions[r][i][0] == "collective"), None)
        start = max((i + 1 for i in range(at) if script.actions[r][i][0] == "collective"), default=0)
        script.actions[r][start:end] = [a for a in script.actions[r][start:end] if a[0] != "call"]
    elif kind == "late":
        script.actions[r].insert(at, ("delay", round(rng.uniform(0.3, 2.0) * T, 3)))
    elif kind in ("junk", "junk-handoff"):
        script.junk_after = rng.randint(1, 80)
        script.junk_handoff = kind == "junk-handoff"
    elif kind == "die-in-turn":
        script.die_in_turn[r] = rng.randint(1, len(calls))
    elif kind == "slow":
        script.slow[r] = (rng.randint(1, len(calls)), round(rng.uniform(0.05, 1.2) * T, 3))
    elif kind == "fail":
        script.fail_at[r] = rng.randint(1, 12)
    elif kind == "wall":
        script.wall_jump = rng.choice([-5, 5]) * T
        script.divergences -= 1  # not a divergence: the check-in must not notice
    else:
        script.die_at[r] = rng.randint(1, 12)
    script.notes.append(f"{kind}: rank {r}, action {at}")


def _late_fault(seed: int, script: Script) -> None:
    """A late-but-present schedule in about a third of them, drawn apart from `draw`'s generator: a rank late past T
    at two calls in a row of one line (on time at the next, and at the other line), a rank that skips its first call
    of the first line in the first round (the other line after it), or a signal in one of a rank's store waits."""
    rng = random.Random(seed * 7907 + 29)
    if rng.random() >= 0.35:
        return
    kind, r = rng.choice(["late-twice", "skip-first", "signal"]), rng.randrange(script.n)
    actions = script.actions[r]
    calls = [i for i, a in enumerate(actions) if a[0] == "call" and a[1] == "A"]
    if kind == "signal":
        script.signal[r] = (rng.randint(1, 8), round(rng.uniform(0.1, 0.99), 3))
    elif kind == "skip-first" and calls and any(a[1:2] == ("B",) for a in actions):
        del actions[calls[0]]
    elif kind == "late-twice" and len(calls) >= 2:
        first = rng.randrange(len(calls) - 1)
        for i in sorted(calls[first : first + 2], reverse=True):
            actions.insert(i, ("delay", round(rng.uniform(1.05, 1.5) * T, 3)))
    else:
        return
    script.divergences += {"late-twice": 2, "skip-first": 1}.get(kind, 0)  # each late call is one; a signal none
    script.notes.append(f"{kind}: rank {r}")


def _extra_fault(seed: int, script: Script) -> None:
    """One more fault in about a third of the schedules, drawn apart from `draw`'s generator: a connection that
    fails after the server applied the op (the reply lost), one whose reconnect fails too, or (with no user
    collective to wait for it) a rank stopped between two store operations, after the first was applied."""
    rng = random.Random(seed * 104729 + 17)
    if rng.random() >= 0.35:
        return
    collectives = any(a[0] == "collective" for actions in script.actions.values() for a in actions)
    kind = rng.choice(["fail-applied", "fail"] + ([] if collectives else ["die-applied"]))
    r = rng.randrange(script.n)
    if r in script.die_at or r in script.fail_at:
        return
    script.divergences += 1
    if kind == "die-applied":
        script.die_at[r] = rng.randint(1, 16)
        script.applied.add(r)
    else:
        script.fail_at[r] = rng.randint(1, 16)
        if kind == "fail-applied":
            script.applied.add(r)
    script.notes.append(f"{kind}: rank {r}")


# -- the invariants ----------------------------------------------------------------------------------


def check(sim: Sim) -> list[str]:
    """Every invariant of the module docstring, on one finished schedule; the violations found. The numbers
    are the documented ones (`accelerate_inorder_fix.bounds`), per call, per rank and per divergence."""
    problems = list(sim.violations)
    problems += _verdicts(sim)
    problems += _waits(sim)
    problems += _naming(sim)
    problems += _deaths_named(sim)
    problems += _records(sim)
    if sim.script.notes == ["rank 0 makes a main-only call M each step"]:
        problems += [
            f"every rank made {e[2]}, yet it was skipped"
            for e in sim.events
            if e[0] == "verdict" and "M.py" not in e[2] and not e[3].go
        ]
    problems += _late_only(sim)
    problems += [
        f"a signal stretched rank {r}'s wait by {seconds:g} > one slice"
        for r, seconds in sim.stretched.items()
        if seconds > SLICE * T + 1e-9
    ]
    problems += _store(sim)
    return problems


def _late_only(sim: Sim) -> list[str]:
    """Late is not skipped: when the one fault is a rank late by at most 1.2 T once, no line is given up for good."""
    script = sim.script
    if len(script.notes) != 1 or not script.notes[0].startswith("late:"):
        return []
    late = max((a[1] for acts in script.actions.values() for a in acts if a[0] == "delay"), default=0.0)
    if late > 1.2 * T:
        return []
    return [
        f"{e[2]} was retired, though a rank was only late"
        for e in sim.events
        if e[0] == "verdict" and e[3].why == "retired"
    ]


def _verdicts(sim: Sim) -> list[str]:
    """One verdict per call, of every kind (a retired site's and a failed connection's too), read by every rank
    but one whose store is gone; no rank waits in a call past its skip; a check-in ends within T."""
    problems: list[str] = []
    seen: dict[str, bool] = {}
    for _, rank, tag, verdict, start, end, call, gone in (e for e in sim.events if e[0] == "verdict"):
        end -= sim.handling.get((rank, call), 0.0)  # a rank may take its turn in its check-in: not waiting
        if end - start > bounds.CHECK_IN.value * T + 1e-9:
            problems.append(f"rank {rank} waited {end - start:g} > T at {tag}")
        key = "v/" + tag
        decided = sim.decided.get(key, math.inf)
        # its writer stopped before it woke the others; or junk stood there, and a failure or death in the call
        # took the rank that would have read it and woken them
        excused = sim.writer.get(key, -1) in sim.dead | sim.failed or (
            sim.writer.get(key, -1) is None and tag in sim.touched
        )
        if start > decided and not excused and end > start + bounds.LATE_AFTER_VERDICT.value * T + 1e-9:
            problems.append(f"rank {rank} came to {tag} after its verdict was written, and waited {end - start:g}")
        skipped = sim.first.get(key, checkin.GO) != checkin.GO
        if skipped and not excused and end > max(start, decided) + bounds.DECIDED.value * T + 1e-9:
            problems.append(f"rank {rank} waited {end - max(start, decided):g} at {tag} after its skip stood")
        if not gone and seen.setdefault(tag, verdict.go) != verdict.go:
            problems.append(f"ranks read different verdicts at {tag}")
    return problems


def _waits(sim: Sim) -> list[str]:
    """A call <= 1.5 T on every rank (beyond its own handler's time); a rank's calls <= 1.5 T per divergence in
    all (a death is one), beyond what the other ranks' delays and slow handlers made it wait."""
    script, problems = sim.script, []
    verdicts = [e for e in sim.events if e[0] == "verdict"]
    turns = [e for e in sim.events if e[0] == "turns"]
    for _, rank, tag, start, end, call in (e for e in sim.events if e[0] == "call"):
        own = sim.handling.get((rank, call), 0.0)  # its own handler's time is not waiting
        if end - start - own > bounds.CALL.value * T + 1e-9:
            problems.append(f"rank {rank}'s call {tag} took {end - start - own:g} > {bounds.CALL.value:g} T")
    for r in range(script.n):
        slow = sum(seconds for (q, _), seconds in sim.handling.items() if q != r)  # others' handlers' own time
        per = bounds.DEATH.value if _deaths_only(script) else bounds.DIVERGENCE.value
        budget = per * T * script.divergences + _ordinary_wait(script, r) + slow
        waited = sum(e[5] - e[4] for e in verdicts if e[1] == r) + sum(e[4] - e[3] for e in turns if e[1] == r)
        waited -= sum(seconds for (q, _), seconds in sim.handling.items() if q == r)
        if waited > budget + 1e-9:
            problems.append(
                f"rank {r} waited {waited:g} in calls, over {budget:g} for {script.divergences} divergence(s)"
            )
    return problems


def _deaths_only(script: Script) -> bool:
    """Whether every divergence of the script is a death (each then costs at most `bounds.DEATH`)."""
    kinds = {note.partition(":")[0] for note in script.notes}
    return bool(kinds) and kinds <= {"die", "die-applied", "die-in-turn"}


def _ordinary_wait(script: Script, r: int) -> float:
    """What rank `r` may wait for besides the divergences: at each call, the longest ordinary delay another rank
    made before it (every call that goes is a meeting point, so delays of different calls add, those of
    one call do not). A hand-made script (no `ordinary`): every delay of the other ranks."""
    if not script.ordinary:
        return sum(a[1] for q in range(script.n) if q != r for a in script.actions[q] if a[0] == "delay")
    longest: dict[tuple[int, str], float] = {}
    for (q, step, name), seconds in script.ordinary.items():
        if q != r:
            longest[(step, name)] = max(longest.get((step, name), 0.0), seconds)
    return sum(longest.values())


def _naming(sim: Sim) -> list[str]:
    """A rank named for not handing over had not when it was named (it died, was slow or behind a slow one), or
    it lost its connection, or junk stood in its key; and the rank before it had (a break, not a rank behind one)."""
    problems: list[str] = []
    excused = sim.dead | {q for q, _ in sim.handling} | sim.failed | sim.junked_handoff  # slow handlers, nested calls
    for e in (e for e in sim.events if e[0] == "turns"):
        for named, at in zip(e[5], e[8]):
            handed = sim.handed.get(f"h/{e[2]}/{named}", math.inf)
            if named not in excused and handed <= at:
                problems.append(f"rank {e[1]} named rank {named} at {e[2]}, which had handed over before")
            first = e[1] + 1 if named > e[1] else 0  # past its own turn: the ranks after it only
            # a break: the rank before it had handed over (one behind a break, waiting, is not named)
            before = [p for p in range(max(first, named - 1), named) if sim.handed.get(f"h/{e[2]}/{p}", math.inf) > at]
            if set(before) - sim.junked_handoff - sim.failed:
                problems.append(
                    f"rank {e[1]} named rank {named} at {e[2]}, but rank {before} had not handed over either"
                )
    return problems


def _deaths_named(sim: Sim) -> list[str]:
    """Where the only faults are deaths in turns: each rank dead in its turn of a `go` call is named there by some
    survivor (if one made it), unless the rank before it died in that call too (then, to the store, it waits behind
    that break)."""
    if {note.partition(":")[0] for note in sim.script.notes} != {"die-in-turn"}:
        return []
    problems, dead_at = [], {}
    for r, number in sim.script.die_in_turn.items():
        if r not in sim.dead:  # its record there not enabled: its handler never ran
            continue
        gone = [e[2] for e in sim.events if e[0] == "verdict" and e[1] == r and e[6] == number and e[3].go]
        dead_at.update({r: gone[0]} if gone else {})
    for r, tag in dead_at.items():
        named = any(r in e[5] for e in sim.events if e[0] == "turns" and e[2] == tag)
        lived = any(e[2] == tag and e[1] not in sim.dead for e in sim.events if e[0] == "verdict")
        if not named and lived and dead_at.get(r - 1) != tag:
            problems.append(f"rank {r} died in its turn of {tag}, and no survivor named it")
    return problems


def _store(sim: Sim) -> list[str]:
    """At most 2N + 1 keys per site the schedule used and one marker per rank; + a junk key; + the deletions a
    failed connection or a death left undone; + a key per rank that never came back to a retired site."""
    script = sim.script
    used = {name for _, name in sim.made}  # the sites some rank called at (a handler's nested calls included)
    junk = any(e[0] == "junk" for e in sim.events)
    # a failure strikes before deletions of its call (the verdict before, its key of call k-2) and the next call
    # there gives up at its first operation, before its own (its key of call k-1); a death stops the first two
    undone = UNDONE_BY_FAILURE * len(sim.failed) + UNDONE_BY_DEATH * len(sim.dead - sim.failed)
    bound = bounds.store_keys(script.n, len(used)) + junk + undone
    if len(sim.data) > bound:
        return [f"{len(sim.data)} keys left in the store (bound {bound}, {len(used)} site(s)): {sorted(sim.data)}"]
    return []


def _records(sim: Sim) -> list[str]:
    """Exactly once per enabled record of every rank that lived; a `go` call's records in rank order, whole."""
    script, problems = sim.script, []
    emitted = [e[2] for e in sim.events if e[0] == "emit"]
    for r in range(script.n):
        if r in sim.dead or any(e[0] == "killed by the launcher" for e in sim.events):
            continue
        made = sim.made_calls.get(r, 0)
        for call in range(1, made + 1):
            count = sum(1 for m in emitted if m[:2] == (r, call))
            want = 0 if (r, call) in script.disabled else 1
            if count != want:
                problems.append(f"rank {r}'s record of its call {call} emitted {count} times")
    gone = {e[2] for e in sim.events if e[0] == "verdict" and e[3].go}
    broken = {e[2] for e in sim.events if e[0] == "turns" and e[5]}  # a rank named: order as it can
    broken |= {e[1][len("h/") :].rpartition("/")[0] for e in sim.events if e[0] == "junk" and e[1].startswith("h/")}
    calls = {tag: {(e[1], e[6]) for e in sim.events if e[0] == "verdict" and e[2] == tag} for tag in gone}
    # records of go calls that held (a skipped call's come out at once; a broken one's as they can; one a failure
    # or death struck lets its rank leave before the others' records, which then come out after its next ones)
    held = gone - broken - sim.touched
    ordered = set().union(*(calls[tag] for tag in held))
    for tag in held:
        members = calls[tag]
        order = [m[0] for m in emitted if (m[0], m[1]) in members]
        if order != sorted(order):
            problems.append(f"call {tag} went, but its records came out in the order {order}")
        at = [i for i, m in enumerate(emitted) if (m[0], m[1]) in members] or [0]
        between = [m for m in emitted[at[0] : at[-1]] if m[:2] in ordered and m[:2] not in members]
        if between:
            problems.append(f"call {tag} went, but other records came out between its own: {between}")
        steps = {m[3] for m in emitted if (m[0], m[1]) in members and m[3] is not None}
        if len(steps) > 1 and _aligned(sim):
            problems.append(f"call {tag} went, but its records are of steps {sorted(steps)}: the line shifted")
        out = max((i for i, e in enumerate(sim.events) if e[0] == "emit" and e[2][:2] in members), default=0)
        early = [e[1] for e in sim.events[:out] if e[0] == "turns" and e[2] == tag]
        if early:
            problems.append(f"call {tag} went, but rank(s) {early} returned before every record of it was out")
    return problems


def _aligned(sim: Sim) -> bool:
    """Whether every `go` call's records must be of one step: each step ends in a user collective, and the one
    ambiguous case (docs/barrier-mode.md, rule 4) is not the schedule's: a first-round wait-for cycle with rank 0
    alone at one call, where it may be rank 0 that skipped the other."""
    collectives = all(any(a[0] == "collective" for a in acts) for acts in sim.script.actions.values())
    alone = any(
        e[0] == "verdict" and e[3].why == "cycle" and set(range(sim.script.n)) - set(e[3].missing) == {0}
        for e in sim.events
    )
    return collectives and not alone


# -- mutations: the protocol broken on purpose; each must be caught by some invariant ------------------


def _set_not_compare_set(self: checkin.CheckIn, call: checkin.Call, verdict: bytes) -> bytes:
    self.store.set(call.key, verdict)  # the last writer wins: ranks that read before it may disagree
    return verdict


def _no_cycle(self: checkin.CheckIn, call: checkin.Call, markers: Any, missing: Any) -> bool:
    return False  # both calls of a wait-for cycle time out: the every-rank one is given up too


def _rank_0_waits_on(ours: Any, other: Any, history: Any, rank0_here: bool) -> bool:
    return not rank0_here  # the call rank 0 waits at wins every cycle: no history, and the other way round


def _no_absent(self: checkin.Absence, markers: Any, here: str) -> dict[int, str]:
    return {}


class _Forgetful(set):  # type: ignore[type-arg]
    def add(self, item: Any) -> None:
        pass


_INIT = checkin.CheckIn.__init__


def _no_retire(self: checkin.CheckIn, *args: Any, **kwargs: Any) -> None:
    _INIT(self, *args, **kwargs)
    self.retired = _Forgetful()


class _Unkept(dict):  # type: ignore[type-arg]
    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _no_pass_by(self: checkin.CheckIn, *args: Any, **kwargs: Any) -> None:
    _INIT(self, *args, **kwargs)
    self.passed = _Unkept()  # a rank forgets the calls it passed by: its later calls there pair one call early


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


class _EverySkipInARow(dict):  # type: ignore[type-arg]
    def get(self, key: Any, default: Any = None) -> Any:
        return _Any()


def _retire_at_once(self: checkin.CheckIn, *args: Any, **kwargs: Any) -> None:
    _INIT(self, *args, **kwargs)
    self.skipped = _EverySkipInARow()  # every skip reads as the second in a row: a late rank costs its line


def _keep_old_verdicts(self: checkin.CheckIn, call: checkin.Call) -> None:
    pass


_TAKE = handoff.Turns.take


def _turns(wait_before: bool = True, wait_last: bool = True, forget: int = 1) -> Any:
    """`handoff.Turns.take` with one of its steps taken out or moved."""

    def take(self: handoff.Turns, call: checkin.Call, deadline: float, timeout: float, emit: Any) -> tuple[int, ...]:
        store, until = self.checkin.store, max(deadline, self.checkin.clock() + timeout * handoff.LATE_WAIT)
        if wait_before and self.rank > 0:
            self.checkin.wait_for(call.handoff(self.rank - 1), until)
        emit()
        store.set(call.handoff(self.rank), handoff.HANDED)
        if forget == 0:
            store.delete_key(call.handoff(self.rank))
        if wait_last and self.rank < self.last:
            self.checkin.wait_for(call.handoff(self.last), until)
        if call.k > forget:
            store.delete_key(checkin.Call(call.site, call.k - forget).handoff(self.rank))
        return ()

    return take


def _name_the_one_before(self: handoff.Turns, call: checkin.Call, ranks: range) -> Optional[int]:
    return ranks[-1]


def _emit_twice(call: InOrderCall) -> None:
    turns.emit_at_once(call)
    turns.emit_at_once(call)


def _wait_without_deadline(self: checkin.CheckIn, key: str, deadline: float) -> bool:
    self.store.wait([key], datetime.timedelta(seconds=CONNECTION_TIMEOUT * 4))
    return True


def _read_without_deadline(store: Any, key: str, deadline: float, timeout: float, clock: Any) -> Optional[bytes]:
    store.wait([key], datetime.timedelta(seconds=CONNECTION_TIMEOUT * 4))
    return bytes(store.get(key))


def _peek_after_read_timeout(store: Any, key: str, deadline: float, timeout: float, clock: Any) -> Optional[bytes]:
    remaining = deadline - clock()
    if remaining >= checkin.SHORTEST_WAIT:
        try:
            store.wait([key], datetime.timedelta(seconds=remaining))
            return bytes(store.get(key))
        except StoreTimeout:
            pass
    return checkin.peek(store, key)  # wakes the key's other waiters, though it is not there


def _peek_after_timeout(self: checkin.CheckIn, key: str, deadline: float) -> bool:
    remaining = deadline - self.clock()
    if remaining >= checkin.SHORTEST_WAIT:
        try:
            self.store.wait([key], datetime.timedelta(seconds=remaining))
            return True
        except StoreTimeout:
            pass
    return checkin.peek(self.store, key) is not None  # wakes the key's other waiters, though it is not there


MUTATIONS: dict[str, tuple[str, Any]] = {
    "set-not-compare-set": ("_decide", _set_not_compare_set),
    "no-cycle-rule": ("_won_cycle", _no_cycle),
    "rank-0-waits-on": ("GIVES_UP", _rank_0_waits_on),
    "no-absent": ("absence:still", _no_absent),
    "absence-budget-three-quarters": ("ABSENCE_BUDGET", 0.75),
    "no-last-wait": ("LAST_WAIT", 0.0),
    "no-retire": ("__init__", _no_retire),
    "retire-at-once": ("__init__", _retire_at_once),
    "no-pass-by": ("__init__", _no_pass_by),
    "keep-old-verdicts": ("forget", _keep_old_verdicts),
    "no-handoff-wait": ("handoff:take", _turns(wait_before=False)),
    "no-final-wait": ("handoff:take", _turns(wait_last=False)),
    "forget-own-handoff-at-once": ("handoff:take", _turns(forget=0)),
    "name-the-one-before": ("handoff:_last_break", _name_the_one_before),
    "emit-twice": ("side:emit_at_once", _emit_twice),
    "wait-without-deadline": ("wait_for", _wait_without_deadline),
    "peek-after-timeout": ("wait_for", _peek_after_timeout),
    "read-without-deadline": ("read_until", _read_without_deadline),
    "peek-after-read-timeout": ("read_until", _peek_after_read_timeout),
    "wall-clock": ("WALL", None),
}


def mutated(name: str) -> Any:
    """A context in which `checkin.CheckIn` (or "handoff:..." `handoff.Turns`, "absence:..." `checkin.Absence`,
    "side:..." a name in `side`; a constant by its name) carries mutation `name`."""
    import contextlib
    from unittest import mock

    attribute, replacement = MUTATIONS[name]
    owner, _, attribute = attribute.rpartition(":")
    if attribute == "WALL":
        return contextlib.nullcontext()
    if attribute == "GIVES_UP":
        return mock.patch.object(checkin, "gives_up", replacement)
    if attribute in ("ABSENCE_BUDGET", "LAST_WAIT", "read_until"):
        return mock.patch.object(checkin, attribute, replacement)
    if attribute == "LATE_WAIT":
        return mock.patch.object(handoff, attribute, replacement)
    target = {"handoff": handoff.Turns, "absence": checkin.Absence, "side": side, "": checkin.CheckIn}[owner]
    return mock.patch.object(target, attribute, replacement)


def explore(seed: int, wall_clock: bool = False) -> tuple[Sim, list[str]]:
    return run(draw(seed), seed, wall_clock)


def run(script: Script, seed: int = 0, wall_clock: bool = False) -> tuple[Sim, list[str]]:
    """Run `script` on the schedule `seed` picks; the finished simulation and its invariant violations."""
    sim = Sim(seed, script, wall_clock)
    ranks = {r: Rank(sim, r) for r in range(script.n)}
    sim.run({r: ranks[r].main for r in ranks})
    return sim, check(sim)


def coverage(sim: Sim) -> set[str]:
    """What one schedule covered: each fault kind drawn ("fault:skip", ...) and each outcome seen ("verdict:go",
    "verdict:timeout", ..., "named" for a rank named in the turns, "killed" for a user collective a dead rank left)."""
    kinds = {"fault:" + ("main-only" if "main-only" in note else note.partition(":")[0]) for note in sim.script.notes}
    kinds |= {"verdict:" + ("go" if e[3].go else e[3].why) for e in sim.events if e[0] == "verdict"}
    kinds |= {"named" for e in sim.events if e[0] == "turns" and e[5]}
    kinds |= {"killed" for e in sim.events if e[0] == "killed by the launcher"}
    return kinds or {"fault:none"}


def shard(seeds: list[int], mutate: Optional[str] = None, verbose: bool = False) -> tuple[list[Any], dict[str, int]]:
    """Run `seeds` (under mutation `mutate`): the failing seeds with their violations, and the coverage counts."""
    failures: list[Any] = []
    counts: dict[str, int] = {}
    for seed in seeds:
        if mutate:
            with mutated(mutate):
                sim, problems = explore(seed, wall_clock=mutate == "wall-clock")
        else:
            sim, problems = explore(seed)
        if verbose:
            print(f"seed {seed}: n={sim.script.n} {sim.script.notes}")
            for r, actions in sim.script.actions.items():
                print(f"  rank {r}: {actions}")
            for event in sim.events:
                print("  ", event)
        if problems:
            failures.append((seed, problems))
        for kind in coverage(sim):
            counts[kind] = counts.get(kind, 0) + 1
    return failures, counts


def _in_processes(seeds: list[int], jobs: int, mutate: Optional[str]) -> tuple[list[Any], dict[str, int]]:
    """`shard` over `jobs` processes, in chunks of at most 2,000 seeds (a line of progress after each);
    the failures in seed order, so the output does not depend on which process ran what."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("fork")  # the workers inherit the imported modules; nothing to pickle
    chunks = [seeds[i : i + 2000] for i in range(0, len(seeds), 2000)]
    failures: list[Any] = []
    counts: dict[str, int] = {}
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for done, (part, part_counts) in enumerate(pool.map(shard, chunks, [mutate] * len(chunks)), 1):
            failures += part
            for kind, n in part_counts.items():
                counts[kind] = counts.get(kind, 0) + n
            if len(chunks) > 1:
                print(
                    f"  {min(done * 2000, len(seeds))} of {len(seeds)} schedules, {len(failures)} failed", flush=True
                )
    return sorted(failures, key=lambda f: f[0]), counts


def print_coverage(counts: dict[str, int], schedules: int) -> None:
    """The coverage table: how many schedules had each fault kind, and each outcome."""
    print(f"coverage ({schedules} schedules):")
    print(f"  {'kind':<24} {'schedules':>10}")
    for kind in sorted(counts):
        print(f"  {kind:<24} {counts[kind]:>10}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay one schedule")
    parser.add_argument("--schedules", type=int, default=2000)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="shard the seeds over this many processes")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--mutate", choices=sorted(MUTATIONS), help="break the protocol on purpose")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.schedules))
    start = time.monotonic()
    if args.jobs > 1 and len(seeds) > 1:
        failures, counts = _in_processes(seeds, args.jobs, args.mutate)
    else:
        failures, counts = shard(seeds, args.mutate, args.verbose)
    for seed, problems in failures:
        print(f"seed {seed} FAILED (replay: python tests/unit/explorer.py --seed {seed} -v): {problems}")
    print_coverage(counts, len(seeds))
    print(f"{len(seeds)} schedules, {len(failures)} failed, {time.monotonic() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
