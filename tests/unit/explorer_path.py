"""A seeded schedule explorer for the whole call path: the real session, in both modes, on 2-4 simulated ranks.

Each simulated process runs what `_wrapper.patched_log`'s in_order branch runs (`Actor.call`) on its own
`session.InOrderSession`, opened through the product's `store.connection.Connection` on `explorer.py`'s
in-memory store, virtual clock and scheduler (one actor runs at a time: a seed is a schedule), the
session's and the gather side's locks made scheduler locks (`SimLock`). A seed (`draw`) picks the job's
mode, the main's word at its group's start or at its first call, main-only and others-only calls, and
one scenario: a rank that dies or whose connection fails at a store operation, before or after the
server applied it (gather); two threads per rank at two sites; a child forked inside the group (before,
after, or inside a sibling thread's call); ranks forked by a launcher before the group; a late
`configure(mode=...)` on one rank or all; a differing setting. `check` holds every record exactly once,
each call in the job's mode, rank order and whole blocks, and every wait at the numbers of
`accelerate_inorder_fix.bounds` (each check's docstring says its rule); a child logs at once, touches no
store and never waits; nothing hangs.

    python tests/unit/explorer_path.py --seed 1234 -v           # one schedule, its script and events
    python tests/unit/explorer_path.py --schedules 20000 --jobs 2   # the long run (docs/testing.md)
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import logging
import random
import re
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional
from unittest import mock


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import explorer  # noqa: E402
from explorer import Killed, Request, Script, Sim  # noqa: E402

from accelerate_inorder_fix import bounds  # noqa: E402
from accelerate_inorder_fix import session as session_module  # noqa: E402
from accelerate_inorder_fix._call import InOrderCall, LogArgs, emit_at_once  # noqa: E402
from accelerate_inorder_fix._diagnostics import DIAGNOSTICS, text_of  # noqa: E402
from accelerate_inorder_fix.barrier.side import BarrierSide  # noqa: E402
from accelerate_inorder_fix.config import Settings  # noqa: E402
from accelerate_inorder_fix.gather import collector as collector_module  # noqa: E402
from accelerate_inorder_fix.gather import queues  # noqa: E402
from accelerate_inorder_fix.store.connection import PREFIX, Connection  # noqa: E402


T = explorer.T
SITES = {name: (f"path_{name}.py", "step", 20 + i) for i, name in enumerate("ABMO")}
MESSAGE = re.compile(r"call (\d+)\.(\w) (\d+)$")  # actor.site, the actor's call number there
OTHER_MODE = {"gather": "barrier", "barrier": "gather"}
LATE_MODE = "after this job's mode was fixed"


@dataclass
class PathScript:
    """What each actor does, and the schedule's faults.

    Attributes:
        n: ranks. actors: actor -> (rank, role: "main" thread, "second" thread, or forked "child").
        actions: actor -> its steps: ("call", site), ("delay", s), ("configure", mode), ("start",) (the main
            process's group starts), ("joined",) (wait until it has), ("launched",) (forked by a launcher,
            then the group starts), ("fork", child, "now" | "held"), ("forked",), ("exit",).
        modes: rank -> its mode setting at the start (rank 0's is the job's).
        die_at, fail_at, applied: as `explorer.Script`, by actor.
    """

    n: int
    actors: dict[int, tuple[int, str]]
    actions: dict[int, list[tuple[Any, ...]]]
    modes: dict[int, str]
    start_word: bool = False
    die_at: dict[int, int] = field(default_factory=dict)
    fail_at: dict[int, int] = field(default_factory=dict)
    applied: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return self.modes[0]

    def has(self, note: str) -> bool:
        return any(n.startswith(note) for n in self.notes)


class SimLock:
    """A lock of the scheduler's actors (re-entrant or not): a waiter stops until it is free."""

    def __init__(self, sim: PathSim, reentrant: bool = True) -> None:
        self.sim, self.reentrant = sim, reentrant
        self.owner: Optional[int] = None
        self.depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self.sim.actor()
        while self.owner is not None and not (self.reentrant and self.owner == me):
            self.sim.block(Request(me, "lock", args=(self,)))
        self.owner, self.depth = me, self.depth + 1
        return True

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None

    __enter__ = acquire

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Client(explorer.Connection):
    """One thread's client of the job's store (what `Server.clone` gives `Connection.own`), or a prefixed view of
    one; a failure breaks the client for good. A store operation from a forked child is a violation."""

    def __init__(self, sim: PathSim, prefix: str = "", base: Optional[Client] = None) -> None:
        self.sim, self.prefix, self.base, self.broken = sim, prefix, base or self, False
        self.timeout = explorer.CONNECTION_TIMEOUT  # what a `get` waits for a missing key (`set_timeout`)

    def set_timeout(self, timeout: Any) -> None:
        self.base.timeout = timeout.total_seconds()

    def get(self, key: str) -> bytes:
        return bytes(self._op("get", key, until=self.sim.now + self.base.timeout))

    def _signalled(self, seconds: float) -> float:
        return seconds  # no signals here

    def prefixed(self, prefix: str) -> Client:
        return Client(self.sim, prefix, self.base)

    def _op(self, name: str, *args: Any, until: float = 0.0) -> Any:
        sim, actor = self.sim, self.sim.actor()
        if sim.path.actors[actor][1] == "child":
            sim.violations.append(f"forked child {actor} made a store operation ({name})")
        if self.base.broken:
            raise ConnectionError("connection closed")
        key = [self.prefix + k for k in args[0]] if isinstance(args[0], list) else self.prefix + args[0]
        return sim.block(Request(actor, "op", name, (key, *args[1:]), until=until, conn=self.base))


class Server:
    """The job's store as `Connection` sees it: `clone` is a new client for the calling thread."""

    def __init__(self, sim: PathSim) -> None:
        self.sim = sim

    def clone(self) -> Client:
        return Client(self.sim)


class PathSim(Sim):
    """`explorer.Sim` with actors that wait for a lock, a fork, the group's start or the job's end."""

    def __init__(self, seed: int, path: PathScript) -> None:
        script = Script(len(path.actors), {}, die_at=dict(path.die_at), fail_at=dict(path.fail_at))
        script.applied = set(path.applied)
        super().__init__(seed, script)
        self.path = path
        self.threads: dict[int, int] = {}  # thread ident -> actor
        self.actors: dict[int, Actor] = {}
        self.forked: dict[int, Process] = {}  # child actor -> its process, once forked
        self.started = False
        self.emitted: list[tuple[int, str, float]] = []  # (emitting actor, message, when)
        self.warnings: list[tuple[int, str]] = []
        self.said: set[Any] = set()  # (process, key) of each warn_once said
        self.calls: list[tuple[int, str, str, float, float]] = []  # (actor, site, path taken, start, end)

    def actor(self) -> int:
        return self.threads[threading.get_ident()]

    def role(self, actor: int) -> str:
        return self.path.actors[actor][1]

    def _runnable(self, q: Request) -> bool:
        kind = q.kind
        if kind == "lock":
            return q.args[0].owner is None
        if kind == "forked":
            return q.rank in self.forked
        if kind == "started":
            return self.started
        if kind == "held":  # a sibling thread inside a call (or done)
            locks, sibling = q.args
            return any(lock.owner == sibling for lock in locks.values()) or self._done(sibling)
        if kind == "exit":  # the job's end: every thread of every rank done with its calls
            return all(self._done(a) for a, (_, role) in self.path.actors.items() if role != "child")
        return bool(super()._runnable(q))

    def _done(self, actor: int) -> bool:
        return actor in self.ended or getattr(self.pending.get(actor), "kind", "") == "exit"

    def warn_once(self, said: Any, key: Any = None) -> bool:
        process = id(self.actors[self.actor()].process)
        if (process, key or text_of(said)) in self.said:
            return False
        self.said.add((process, key or text_of(said)))
        return self.warn_every(said)

    def warn_every(self, said: Any) -> bool:
        self.warnings.append((self.actor(), text_of(said)))
        return True


class Process:
    """A simulated process: its settings, its default process group (None before it starts), its session."""

    def __init__(self, sim: PathSim, rank: int, mode: str, group: Optional[object]) -> None:
        self.sim, self.rank, self.group = sim, rank, group
        self.settings = Settings()
        self.settings.configure(mode=mode, timeout=T)
        self.session = session_module.InOrderSession(self.open_store, self.default_group)
        self.opened = float("inf")  # when a call of this process first returned through its side

    def open_store(self, timeout: float) -> tuple[Connection, None]:
        return Connection(Server(self.sim), PREFIX, timeout), None

    def default_group(self) -> Optional[object]:
        return self.group

    def fork(self) -> Process:
        """A child's image of this process: its session copied with each lock as held as it is now."""
        child = copy.copy(self)
        twin = child.session = copy.copy(self.session)
        twin._open_store, twin._default_group = child.open_store, child.default_group
        twin._lock = copy.copy(self.session._lock)
        twin._site_locks = collections.defaultdict(
            self.session._site_locks.default_factory,
            {s: copy.copy(lock) for s, lock in self.session._site_locks.items()},
        )
        return child


class Handler(logging.Handler):
    """Every record any simulated process emits: by which actor, what, when (no handler lock: the processes
    share this handler, which a real process would not)."""

    def __init__(self, sim: PathSim) -> None:
        super().__init__()
        self.sim = sim

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        self.sim.emitted.append((self.sim.actor(), record.getMessage(), self.sim.now))
        return True


class Actor:
    """One thread of a simulated process; what accelerate's `PartialState` says of its rank."""

    def __init__(self, sim: PathSim, actor: int, process: Process, logger: logging.Logger) -> None:
        self.sim, self.actor, self.process, self.logger = sim, actor, process, logger
        self.rank, self.role = sim.path.actors[actor]
        self.process_index, self.num_processes, self.is_main_process = self.rank, sim.path.n, self.rank == 0
        self.at_site: collections.Counter[str] = collections.Counter()

    def isEnabledFor(self, level: int) -> bool:  # the adapter, as `_call.log_for_this_call` uses it
        return True

    def process_message(self, msg: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return msg, kwargs

    def call(self, letter: str) -> None:
        """One in_order call, as `_wrapper.patched_log` makes it."""
        sim, session = self.sim, self.process.session
        self.at_site[letter] += 1
        adapter = SimpleNamespace(isEnabledFor=self.isEnabledFor, process=self.process_message, logger=self.logger)
        log = LogArgs(adapter, logging.INFO, f"call {self.actor}.{letter} {self.at_site[letter]}", (), {})
        call = InOrderCall(SITES[letter], log, session.origin(self), self.process.settings.timeout())
        start = sim.now
        session.call(self, self.process.settings, call)
        side = session.current_side
        path = {BarrierSide: "barrier", collector_module.GatherSide: "gather"}.get(type(side), "once")
        if path != "once":
            self.process.opened = min(self.process.opened, sim.now)
        sim.calls.append((self.actor, letter, path, start, sim.now))

    def main(self) -> None:
        sim = self.sim
        sim.threads[threading.get_ident()] = self.actor
        threading.current_thread().name = sim.path.actors[self.actor][1]  # as a rank's thread is named on every rank
        died = False
        try:
            sim.block(Request(self.actor, "resume"))
            for action in sim.path.actions[self.actor]:
                self.step(*action)
        except Killed:
            died = True
        except Exception as exc:  # noqa: BLE001 -- an exception into user code is itself a violation
            sim.violations.append(f"actor {self.actor} raised {exc!r}")
        finally:
            sim.finish(self.actor, died, sum(self.at_site.values()))

    def step(self, kind: str, *args: Any) -> None:
        sim, process = self.sim, self.process
        if kind == "call":
            self.call(args[0])
        elif kind == "delay":
            sim.block(Request(self.actor, "delay", until=sim.now + args[0]))
        elif kind == "configure":
            process.settings.configure(mode=args[0])
        elif kind == "start":  # what `InOrderSession.started` does on the main process
            process.session.side(self, process.settings, 0.0)
            sim.started = True
        elif kind in ("joined", "exit"):
            sim.block(Request(self.actor, "started" if kind == "joined" else "exit"))
            if kind == "exit" and self.role == "main":
                process.session.close()
        elif kind == "launched":  # forked by a launcher that has no process group; then the group starts
            process.session.after_fork_in_child()  # its session made with no group: the launcher's image
            process.group = JOB
        elif kind == "fork":
            self.fork(*args)
        elif kind == "forked":
            sim.block(Request(self.actor, "forked"))
            self.process = sim.forked[self.actor]
            self.process.session.after_fork_in_child()  # what os.register_at_fork runs in the child

    def fork(self, child: int, when: str) -> None:
        """Fork `child` now, or (`"held"`) once this process's other thread is inside a call."""
        sim, session = self.sim, self.process.session
        if when == "held":
            sibling = next(a for a, (r, role) in sim.path.actors.items() if r == self.rank and role == "main")
            sim.block(Request(self.actor, "held", args=(session._site_locks, sibling)))
            if any(lock.owner == sibling for lock in session._site_locks.values()):
                sim.events.append(("fork while held", self.actor, sim.now))
        sim.forked[child] = self.process.fork()


JOB = object()  # the job's default process group


# -- schedules ------------------------------------------------------------------------------------


def draw(seed: int) -> PathScript:
    """Schedule `seed`'s script: the job's mode, ranks, steps, and one scenario."""
    rng = random.Random(seed)
    mode = rng.choice(["gather", "gather", "barrier"])
    n = rng.randint(2, 4)
    script = PathScript(n, {r: (r, "main") for r in range(n)}, {}, dict.fromkeys(range(n), mode))
    script.start_word = rng.random() < 0.5
    scenario = rng.choice(
        ["plain", "threads", "fork", "launched", "switch", "differs"] + ["fault"] * 2 * (mode == "gather")
    )
    script.notes += [f"mode: {mode}", scenario] + [f"{s}" for s in ("main-only", "others-only") if rng.random() < 0.3]
    steps = rng.randint(3, 8)
    for r in range(n):
        script.actions[r] = _steps(rng, script, r, steps)
    if scenario == "threads":
        count = rng.randint(1, 5)
        for r in range(n):
            a = len(script.actors)
            script.actors[a] = (r, "second")
            calls = [("delay", round(rng.uniform(0.0, 0.3) * T, 3)), ("call", "B")] * count
            script.actions[a] = [("joined",)] * script.start_word + calls + [("exit",)]
    elif scenario == "fork":
        _fork(rng, script)
    elif scenario == "launched":
        for r in range(n):
            script.actions[r].insert(0, ("launched",))
    elif scenario == "switch":
        ranks = list(range(n)) if rng.random() < 0.4 else [rng.randrange(n)]
        at = rng.randint(1, steps - 1)
        script.notes.append(f"switch: ranks {ranks} before step {at}")
        for r in ranks:
            index = [i for i, a in enumerate(script.actions[r]) if a == ("call", "A")][at]
            script.actions[r].insert(index, ("configure", OTHER_MODE[mode]))
    elif scenario == "differs":
        r = rng.randrange(1, n)
        script.modes[r] = OTHER_MODE[mode]
        script.notes.append(f"differs: rank {r}")
    elif scenario == "fault":
        _fault(rng, script, steps)
    return script


def _steps(rng: random.Random, script: PathScript, rank: int, steps: int) -> list[tuple[Any, ...]]:
    """One rank's main thread: the group's start, then per step a delay and a call at A (M, O as drawn), the end."""
    actions: list[tuple[Any, ...]] = []
    if script.start_word:
        actions.append(("start",) if rank == 0 else ("joined",))
    for _ in range(steps):
        actions += [("delay", round(rng.uniform(0.0, 0.3) * T, 3)), ("call", "A")]
        if script.has("main-only") and rank == 0 and rng.random() < 0.5:
            actions.append(("call", "M"))
        if script.has("others-only") and rank != 0:
            actions.append(("call", "O"))
    return actions + [("exit",)]


def _fork(rng: random.Random, script: PathScript) -> None:
    """A rank forks a child while the group exists: before its first call, after it, or inside its other thread's."""
    r, when = rng.randrange(script.n), rng.choice(["before", "after", "held"])
    script.notes.append(f"fork: rank {r} {when}")
    child = len(script.actors)
    if when == "held":
        script.actors[child + 1] = (r, "second")
        script.actions[child + 1] = [("fork", child, "held"), ("exit",)]
    else:
        calls = [i for i, a in enumerate(script.actions[r]) if a[0] == "call"]
        script.actions[r].insert(calls[0] if when == "before" else calls[1] + 1, ("fork", child, "now"))
    script.actors[child] = (r, "child")
    script.actions[child] = [("forked",)] + [("call", "A")] * rng.randint(1, 3)


def _fault(rng: random.Random, script: PathScript, steps: int) -> None:
    """Gather mode: a non-main rank dies at a store operation, or its connection fails there, before or after the
    server applied it."""
    r, kind = rng.randrange(1, script.n), rng.choice(["dead", "fail"])
    at = rng.randint(1, 4 * steps)
    (script.die_at if kind == "dead" else script.fail_at)[r] = at
    applied = rng.random() < 0.5
    if applied:
        script.applied.add(r)
    script.notes.append(f"{kind}: rank {r} at op {at}{' (applied)' * applied}")


# -- running one ----------------------------------------------------------------------------------


def run(path: PathScript, seed: int = 0) -> tuple[PathSim, list[str]]:
    """Run `path` on the schedule `seed` picks; the finished simulation and its invariant violations."""
    sim = PathSim(seed, path)
    logger = logging.getLogger(f"accelerate_inorder_fix.path_explorer.{seed}")
    logger.propagate, logger.level = False, logging.INFO
    handler = Handler(sim)
    logger.addHandler(handler)
    locks = SimpleNamespace(
        Lock=lambda: SimLock(sim, reentrant=False),
        RLock=lambda: SimLock(sim),
        get_ident=threading.get_ident,
        current_thread=threading.current_thread,
    )
    with ExitStack() as stack:
        patch = functools.partial(_patch, stack)
        patch(session_module, "threading", locks)
        patch(collector_module, "threading", locks)
        patch(session_module, "BarrierSide", functools.partial(BarrierSide, clock=sim.clock))
        patch(collector_module, "time", SimpleNamespace(monotonic=sim.clock))
        patch(session_module, "atexit", SimpleNamespace(register=lambda f: f, unregister=lambda f: None))
        patch(session_module, "teardown", SimpleNamespace(on_destroy=lambda f: f))
        patch(DIAGNOSTICS, "warn_once", sim.warn_once)
        patch(DIAGNOSTICS, "warn_every", sim.warn_every)
        processes = {r: Process(sim, r, path.modes[r], None if path.has("launched") else JOB) for r in range(path.n)}
        for a, (r, _) in path.actors.items():
            sim.actors[a] = Actor(sim, a, processes[r], logger)
        sim.run({a: sim.actors[a].main for a in sim.actors})
    logger.removeHandler(handler)
    return sim, check(sim)


def _patch(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    stack.enter_context(mock.patch.object(owner, name, value))


# -- the checks -----------------------------------------------------------------------------------


def check(sim: PathSim) -> list[str]:
    """Every invariant of the module docstring, on the finished schedule."""
    problems = sim.violations + _exactly_once(sim) + _paths(sim) + _waits(sim) + _warnings(sim)
    return problems + (_gather(sim) if sim.path.mode == "gather" else _barrier(sim))


def _records(sim: PathSim) -> list[tuple[int, int, str, int]]:
    """Each emitted record of a call: (emitting actor, calling actor, site, its call number there)."""
    found = [(e, MESSAGE.search(text)) for e, text, _ in sim.emitted]
    return [(e, int(m[1]), m[2], int(m[3])) for e, m in found if m]


def _struck(sim: PathSim) -> set[int]:
    return sim.dead | sim.failed


def _exactly_once(sim: PathSim) -> list[str]:
    """Each record of a call that returned emitted exactly once; of one that did not (its rank died), at most once."""
    counts = collections.Counter((a, s, k) for _, a, s, k in _records(sim))
    made = collections.Counter((a, s) for a, s, *_ in sim.calls)
    problems = [f"record {r} emitted {c} times" for r, c in counts.items() if c > 1]
    for (a, s), k in made.items():
        problems += [f"record {(a, s, i)} never emitted" for i in range(1, k + 1) if not counts[(a, s, i)]]
    return problems


def _paths(sim: PathSim) -> list[str]:
    """A member's call in the job's mode (or at once, if a fault struck its actor); a child's at once, on its own."""
    problems = []
    for actor, site, path, start, end in sim.calls:
        if sim.role(actor) == "child":
            if path != "once" or end > start:
                problems.append(f"child {actor}'s call at {site}: {path}, waited {(end - start) / T:g} T")
        elif path != sim.path.mode and not (path == "once" and actor in _struck(sim)):
            problems.append(f"actor {actor}'s call at {site} made {path}, the job's mode being {sim.path.mode}")
    problems += [
        f"child's record {r} emitted by actor {e}"
        for e, *r in _records(sim)
        if sim.role(r[0]) == "child" and e != r[0]
    ]
    return problems


def _waits(sim: PathSim) -> list[str]:
    """No call over `CALL`; a non-main gather post, once its process knows the word, within `GATHER_POST`."""
    problems = []
    for actor, site, path, start, end in sim.calls:
        if end - start > bounds.CALL.value * T + 1e-9:
            problems.append(f"actor {actor}'s call at {site} waited {(end - start) / T:g} T")
        process, rank = sim.actors[actor].process, sim.path.actors[actor][0]
        known = sim.path.start_word or start >= process.opened
        if path == "gather" and rank != 0 and known and end - start > bounds.GATHER_POST.value * T + 1e-9:
            problems.append(f"rank {rank}'s post at {site} waited {(end - start) / T:g} T")
    return problems


def _warnings(sim: PathSim) -> list[str]:
    """A mode set after the first call: one line on that process; a differing setting: one line on that rank."""
    problems = []
    switched = {
        sim.path.actors[a][0]
        for a, acts in sim.path.actions.items()
        if ("configure", OTHER_MODE[sim.path.mode]) in acts
    }
    for r in range(sim.path.n):
        said = [t for a, t in sim.warnings if sim.path.actors[a][0] == r and sim.role(a) != "child" and LATE_MODE in t]
        if len(said) != (r in switched):
            problems.append(
                f"rank {r}: {len(said)} lines about a mode set late ({'switched' if r in switched else 'not switched'})"
            )
        differs = [t for a, t in sim.warnings if sim.path.actors[a][0] == r and "differs from the main process's" in t]
        if len(differs) != (sim.path.modes[r] != sim.path.mode):
            problems.append(f"rank {r}: {len(differs)} lines about its differing setting")
    return problems


def _in_order(sim: PathSim, records: list[tuple[int, int, str, int]], where: str) -> list[str]:
    """Per site: each actor's records in call order, each call's records together and in rank order."""
    problems: list[str] = []
    rank = {a: r for a, (r, _) in sim.path.actors.items()}
    for site in "ABM":
        mine = [(a, k) for _, a, s, k in records if s == site]
        last: dict[int, int] = {}
        for i, (a, k) in enumerate(mine):
            if last.get(a, 0) >= k:
                problems.append(f"{where}: actor {a}'s record {k} at {site} after its record {last[a]}")
            last[a] = k
            before = mine[i - 1] if i else None
            if before is not None and before[1] == k and rank[before[0]] > rank[a]:
                problems.append(f"{where}: call {k} at {site} has rank {rank[before[0]]} before rank {rank[a]}")
            if before is not None and before[1] != k and any(k == kk for _, kk in mine[: i - 1]):
                problems.append(f"{where}: call {k} at {site} not whole")
    return problems


def _gather(sim: PathSim) -> list[str]:
    """Every record of a rank whose connection held emitted by the main process, in order; the main's waits in all."""
    ranks = {a: r for a, (r, role) in sim.path.actors.items() if role != "child"}
    records = [r for r in _records(sim) if r[1] in ranks and r[2] != "O"]
    alone = [r for r in records if ranks[r[0]] and r[1] not in _struck(sim)]  # a fault may leave a rank alone
    problems = [f"record {r[1:]} emitted by rank {ranks[r[0]]}" for r in alone]
    problems += _in_order(sim, [r for r in records if ranks.get(r[0]) == 0], "main stream")
    if sim.failed or any(role == "second" for _, role in sim.path.actors.values()):
        return problems
    delays = [sum(s[1] for s in sim.path.actions[r] if s[0] == "delay") for r in range(1, sim.path.n)]
    budget = max(delays) + T * (
        bounds.GATHER_DEATH.value * len(sim.dead) + bounds.GATHER_MAIN_ONLY.value * sim.path.has("main-only")
    )
    waited = sum(end - start for actor, _, _, start, end in sim.calls if actor == 0)
    if waited > budget + 1e-9:
        problems.append(f"the main process waited {waited / T:g} T in all, over {budget / T:g} T")
    return problems


def _barrier(sim: PathSim) -> list[str]:
    """With no divergence (every rank makes every call), each call's records whole and in rank order."""
    if sim.path.has("main-only") or sim.path.has("others-only"):
        return []
    members = {a for a, (_, role) in sim.path.actors.items() if role != "child"}
    return _in_order(sim, [r for r in _records(sim) if r[1] in members], "barrier")


# -- mutations: each a planted product bug that some invariant must catch ---------------------------


_INIT = session_module.InOrderSession.__init__
_AFTER_FORK = session_module.InOrderSession.after_fork_in_child


def _one_site_lock(self: session_module.InOrderSession, *args: Any) -> None:
    _INIT(self, *args)
    one = self._site_locks.default_factory()  # type: ignore[misc]
    self._site_locks = collections.defaultdict(lambda: one)


def _member_inverted(self: session_module.InOrderSession) -> None:
    _AFTER_FORK(self)
    self.member = not self.member


def _setting_taken(self: session_module.InOrderSession, state: Any, settings: Any) -> None:
    if self._setting is not None and settings.mode() != self._setting:
        self._mode = self._setting = settings.mode()
        self._group = None  # the next call opens a session in the new mode


def _no_fresh_retry(self: collector_module.GatherSide, outbox: queues.Outbox, payload: bytes) -> bool:
    return outbox.post(payload)


_missed = collector_module.Collector._missed


def _quiet_forgotten(
    self: collector_module.Collector, identity: Any, block: Any, timeout: float, waited: float
) -> None:
    """A quiet rank is never remembered as quiet: each call waits for it a whole T again."""
    _missed(self, identity, block, timeout, waited)
    self.quiet.clear()
    self.skipped.clear()


def _emit_reversed(self: collector_module.Collector, block: dict[int, Any], identity: Any) -> None:
    for rank in sorted(block, reverse=True):
        _EMIT_BLOCK(self, {rank: block[rank]}, identity)


_EMIT_BLOCK = collector_module.Collector._emit_block
_WORD = session_module.InOrderSession._word


def _word_not_waited(self: session_module.InOrderSession, base: Any, state: Any, settings: Any, timeout: float) -> Any:
    return _WORD(self, base, state, settings, 0.0)


_CALL = session_module.InOrderSession.call


def _uncounted(self: session_module.InOrderSession, state: Any, settings: Any, call: InOrderCall) -> None:
    if self.side(state, settings, call.timeout) is None:  # logged at once, and not numbered at its site
        emit_at_once(call)
        return
    _CALL(self, state, settings, call)


MUTATIONS: dict[str, tuple[Any, str, Any]] = {
    "site-lock-global": (session_module.InOrderSession, "__init__", _one_site_lock),
    "child-keeps-session": (session_module.InOrderSession, "after_fork_in_child", lambda self: None),
    "non-member-inverted": (session_module.InOrderSession, "after_fork_in_child", _member_inverted),
    "late-setting-taken": (session_module.InOrderSession, "_check_setting", _setting_taken),
    "word-not-waited": (session_module.InOrderSession, "_word", _word_not_waited),
    "call-at-once-not-numbered": (session_module.InOrderSession, "call", _uncounted),
    "fresh-retry-removed": (collector_module.GatherSide, "_send", _no_fresh_retry),
    "quiet-rank-waited-in-full": (collector_module.Collector, "_missed", _quiet_forgotten),
    "block-in-reverse": (collector_module.Collector, "_emit_block", _emit_reversed),
    "exit-without-seal": (queues.Inbox, "seal", lambda self, rank: []),
}


def mutated(name: str) -> Any:
    """A context in which the product carries mutation `name`."""
    owner, attribute, replacement = MUTATIONS[name]
    return mock.patch.object(owner, attribute, replacement)


def explore(seed: int) -> tuple[PathSim, list[str]]:
    return run(draw(seed), seed)


def coverage(sim: PathSim) -> set[str]:
    """What one schedule covered: its scenario and notes, and what was seen (the modes taken, a fork inside a
    call, a post settled by a fresh connection)."""
    kinds = {"note:" + re.sub(r" \d+| \[.*\]|rank \d+ ", "", note).strip() for note in sim.path.notes}
    kinds |= {"start word" if sim.path.start_word else "word at first call"}
    kinds |= {"path:" + path for _, _, path, _, _ in sim.calls}
    kinds |= {"seen: fork while held"} if any(e[0] == "fork while held" for e in sim.events) else set()
    kinds |= {"seen: retry settled"} if any("fresh connection settled it" in t for _, t in sim.warnings) else set()
    return kinds


def shard(seeds: list[int], mutate: Optional[str] = None, verbose: bool = False) -> tuple[list[Any], dict[str, int]]:
    """Run `seeds` (under mutation `mutate`): the failing seeds with their violations, and the coverage counts."""
    failures: list[Any] = []
    counts: collections.Counter[str] = collections.Counter()
    for seed in seeds:
        with mutated(mutate) if mutate else ExitStack():
            sim, problems = explore(seed)
        if verbose:
            _print(seed, sim)
        if problems:
            failures.append((seed, problems))
        counts.update(coverage(sim))
    return failures, dict(counts)


def _print(seed: int, sim: PathSim) -> None:
    print(f"seed {seed}: n={sim.path.n} {sim.path.notes} start word={sim.path.start_word}")
    for a, actions in sim.path.actions.items():
        print(f"  actor {a} {sim.path.actors[a]}: {actions}")
    for event in [("call", *c) for c in sim.calls] + [("emit", *e) for e in sim.emitted] + sim.warnings + sim.events:
        print("  ", event)


def _in_processes(seeds: list[int], jobs: int, mutate: Optional[str]) -> tuple[list[Any], dict[str, int]]:
    """`shard` over `jobs` forked processes, in chunks of 1,000 seeds; the failures in seed order."""
    import concurrent.futures
    import multiprocessing

    chunks = [seeds[i : i + 1000] for i in range(0, len(seeds), 1000)]
    failures: list[Any] = []
    counts: collections.Counter[str] = collections.Counter()
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for part, part_counts in pool.map(shard, chunks, [mutate] * len(chunks)):
            failures += part
            counts.update(part_counts)
    return sorted(failures, key=lambda f: f[0]), dict(counts)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay one schedule")
    parser.add_argument("--schedules", type=int, default=500)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="shard the seeds over this many processes")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--mutate", choices=sorted(MUTATIONS), help="plant a product bug on purpose")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.schedules))
    start = time.monotonic()
    if args.jobs > 1 and len(seeds) > 1:
        failures, counts = _in_processes(seeds, args.jobs, args.mutate)
    else:
        failures, counts = shard(seeds, args.mutate, args.verbose)
    for seed, problems in failures:
        print(f"seed {seed} FAILED (replay: python tests/unit/explorer_path.py --seed {seed} -v): {problems}")
    explorer.print_coverage(counts, len(seeds))
    print(f"{len(seeds)} schedules, {len(failures)} failed, {time.monotonic() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
