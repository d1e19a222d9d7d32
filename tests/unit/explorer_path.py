"""A seeded schedule explorer for the whole call path: the real session, in both modes, on 2-4 simulated ranks.

`explorer.py` runs barrier mode's check-in and turns alone. This one runs what the wrapper runs for an
in_order call (`_wrapper.patched_log`'s in_order branch, restated in `Actor.call`): the product's own
`session.InOrderSession` (opened on an in-memory store, one per simulated process), its mode agreement
(`store.mode`, with or without the start word), `configure` switches, gather mode's real `GatherSide`,
`queues` and `Collector`, and barrier mode's real check-in. The scheduler, the virtual clock, the store
and its connections are `explorer.Sim` and `explorer.Connection`: one actor runs at a time, each store
operation hands control back, time moves only when nothing can run, so a seed is one schedule:

    python tests/unit/explorer_path.py --seed 1234 -v          # one schedule, its script and events
    python tests/unit/explorer_path.py --schedules 2000        # a run, with its coverage table

What a seed draws (`draw`): 2-4 ranks in gather mode (calls every rank makes, main-only calls, calls only
the other ranks make, a rank that dies at a store operation or whose connection fails there, the main
process's handler logging in_order mid-block); or a `configure` switch made on every rank (gather to
barrier) or on one non-main rank only, in a barrier-mode job; or a process forked before the first
call, after it, or while another thread of the rank holds the session lock; or two threads per rank
sharing one session (forks and threads in either mode); and whether the main process's start word
(`mode/started`, written when the process group starts) is there. A failed connection strikes before or
after the server applied the operation (a post whose reply was lost: the rank asks again on a fresh
connection, and the record comes out once). Threads are actors of the scheduler sharing one session
whose `lock` is a scheduler lock (`SimLock`, re-entrant as the session's `RLock`): a thread that finds
it held stops until it is free, so the interleavings are the scheduler's, not the OS's. A fork copies the session (with its lock,
held or not, as `os.fork` would) into a new actor, then runs the session's own at-fork hook
(`InOrderSession.after_fork_in_child`) there, as `os.register_at_fork` does in the child.

After each schedule `check` holds, at the numbers of `accelerate_inorder_fix.bounds`:
- every record made exactly once, by whoever emits it (the main process, or the rank itself when its
  record cannot reach the main process); a forked child's records by the child itself;
- in the main process's stream, each rank's records of one site in call order, and a block's records in
  rank order (not at an others-only site, whose records go out as found);
- a non-main rank's gather-mode post never waits (`bounds.GATHER_POST`) once the start word is there, and
  after its first call always; no call waits over `bounds.CALL` once it holds the session lock (the time a
  thread waits for the lock is the other thread's calls': the lock is not fair, as an `RLock` is not);
- after each main call, the collector keeps the records of a site the main process never called from for
  less than T since the end of the main call that first kept one there (then the site is others-only, its
  records emitted as found):
  its kept state does not grow per call;
- a switch: each call made in the same mode on every rank; one made on one rank only: one warning
  there, the job's mode kept, no record lost;
- a forked child touches no store, never waits, never blocks on its parent's lock;
- nothing hangs (a hang is reported with every actor's place).
"""

from __future__ import annotations

import argparse
import copy
import logging
import random
import re
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from unittest import mock


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import explorer  # noqa: E402
from explorer import Connection, Killed, Request, Script, Sim  # noqa: E402

from accelerate_inorder_fix import (
    _diagnostics,  # noqa: E402
    bounds,  # noqa: E402
)
from accelerate_inorder_fix import session as session_module  # noqa: E402
from accelerate_inorder_fix._call import InOrderCall, LogArgs  # noqa: E402
from accelerate_inorder_fix.barrier.side import BarrierSide  # noqa: E402
from accelerate_inorder_fix.gather import collector as collector_module  # noqa: E402
from accelerate_inorder_fix.gather import queues  # noqa: E402
from accelerate_inorder_fix.gather import side as gather_side  # noqa: E402
from accelerate_inorder_fix.store import mode  # noqa: E402


T = explorer.T
SITES = {name: (f"path_{name}.py", "step", 20 + i) for i, name in enumerate("AMOH")}
LOGGER = "accelerate_inorder_fix.path_explorer"
MESSAGE = re.compile(r"call (\d+)\.(\w+)\.(\w) (\d+)$")  # actor.thread.site, the actor's call there


# -- the simulated processes ----------------------------------------------------------------------


@dataclass
class PathScript:
    """What each actor (a rank's thread, or a forked child) does, and the schedule's faults.

    Attributes:
        n: ranks.
        actors: actor -> (rank, its thread on that rank; a forked child's is "child").
        actions: actor -> its steps: ("call", site), ("delay", seconds), ("configure", mode),
            ("fork", child actor, "now" or "held"); a child's first step is ("forked",).
        job_mode: every rank's setting at the start.
        start_word: the main process's start word is written before any call (`mode.publish_started`).
        die_at: actor -> the store operation it dies at.
        one_sided: the non-main rank that switches alone (`configure` on that rank only), if any.
        nested_at: k > 0: the main process's log handler, emitting the first record of call k at A (any
            rank's), makes an in_order call itself, at H (in the main process's collector, mid-block).
    """

    n: int
    actors: dict[int, tuple[int, str]]
    actions: dict[int, list[tuple[Any, ...]]]
    job_mode: str = "gather"
    start_word: bool = False
    die_at: dict[int, int] = field(default_factory=dict)
    fail_at: dict[int, int] = field(default_factory=dict)  # actor -> the store operation its connection fails at
    applied: set[int] = field(default_factory=set)  # actors whose death or failure strikes after the server applied
    one_sided: Optional[int] = None
    nested_at: int = 0  # the main process's handler, emitting a record of call k at A, logs in_order at H (once)
    notes: list[str] = field(default_factory=list)


class SimLock:
    """The session's lock, held by actors of the scheduler: re-entrant, and a waiter stops until it is free."""

    def __init__(self, sim: PathSim) -> None:
        self.sim = sim
        self.owner: Optional[int] = None
        self.depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self.sim.actor()
        if self.owner != me:
            while self.owner is not None:
                self.sim.block(Request(me, "lock", args=(self,)))
            self.owner = me
        self.depth += 1
        return True

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class NoLock(SimLock):
    """A lock that excludes nobody: the mutation `calls-without-the-lock`."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        return None


class PathSim(Sim):
    """`explorer.Sim` with actors that wait for a lock or for their fork, and a clock the product reads."""

    def __init__(self, seed: int, path: PathScript) -> None:
        die = dict(path.die_at)
        script = Script(
            n=len(path.actors), actions={}, die_at=die, fail_at=dict(path.fail_at), applied=set(path.applied)
        )
        super().__init__(seed, script)
        self.path = path
        self.threads: dict[int, int] = {}  # thread ident -> actor
        self.forked: dict[int, Any] = {}  # child actor -> its copy of the parent's session, once forked
        self.emitted: list[tuple[int, str, float]] = []  # (emitting actor, message, when)
        self.warnings: list[tuple[int, str]] = []
        self.calls: list[tuple[int, str, str, float, float]] = []  # (actor, site, mode, start, end)
        self.posted: dict[str, float] = {}  # message -> when its call returned (the record made)
        self.actors: dict[int, Actor] = {}
        self.nested = False  # the handler made its in_order call (`PathScript.nested_at`)
        self.kept_counts: list[int] = []  # after each main call: the records the collector keeps
        self.kept_ages: list[float] = []  # after each main call: how long each others-only site's records were kept
        self.first_kept: dict[Any, float] = {}  # site -> when a main call first ended with records kept for it

    def actor(self) -> int:
        return self.threads[threading.get_ident()]

    def monotonic(self) -> float:
        return self.now

    def _runnable(self, q: Request) -> bool:
        if q.kind == "lock":
            return bool(q.args[0].owner is None)
        if q.kind == "forked":
            return q.rank in self.forked
        if q.kind == "held":
            return bool(q.args[0].owner is not None or q.args[1] in self.ended)
        if q.kind == "collective":
            return self._collective() is not None
        return bool(super()._runnable(q))

    def _collective(self) -> Optional[list[Request]]:
        """One barrier of the process group: an actor of every rank still running waits in a collective (a
        rank's threads share its process group; a forked child is no member), or None while one does not."""
        group: dict[int, Request] = {}
        members = {r for a, (r, t) in self.path.actors.items() if t != "child" and a not in self.ended}
        for q in sorted(self.pending.values(), key=lambda q: q.rank):
            rank, thread = self.path.actors[q.rank]
            if q.kind == "collective" and thread != "child":
                group.setdefault(rank, q)
        return list(group.values()) if set(group) == members else None

    def _step(self) -> bool:
        """`explorer.Sim._step`, with this simulation's process group (`_collective`)."""
        ready = [q for q in self.pending.values() if self._runnable(q)]
        if not ready:
            return False
        q = self.rng.choice(sorted(ready, key=lambda q: q.rank))
        if q.kind == "collective":
            self._pair(self._collective() or [])
            return True
        del self.pending[q.rank]
        if q.kind == "op":
            self._operate(q)
        q.done = True
        self._resume(q.rank)
        return True


class WatchedConnection(Connection):
    """A process's store connection, shared by its threads: each operation stops the actor that makes it. One
    from a forked child's thread is a violation (the socket is its parent's)."""

    sim: PathSim

    def _op(self, name: str, *args: Any, until: float = 0.0) -> Any:
        sim, actor = self.sim, self.sim.actor()
        if sim.path.actors[actor][1] == "child":
            sim.violations.append(f"forked child actor {actor} made a store operation ({name})")
        if self.broken:
            raise ConnectionError("connection closed")
        return sim.block(Request(actor, "op", name, args, until=until, conn=self))


class ActorSettings:
    """One process's `Settings`, as the session reads them: its mode (changed by `configure`), T."""

    def __init__(self, own: str) -> None:
        self._mode = own
        self.mode_generation = 0

    def mode(self) -> str:
        return self._mode

    def timeout(self) -> float:
        return T

    def mode_source(self) -> str:
        return "configure()"

    def configure(self, own: str) -> None:
        self._mode, self.mode_generation = own, self.mode_generation + 1


class Handler(logging.Handler):
    """Every record a simulated process emits: who emitted it (the running actor), what, when."""

    def __init__(self, sim: PathSim) -> None:
        super().__init__()
        self.sim = sim

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        """Without the handler's own lock: the simulated processes share this handler, and a nested call stops
        its actor mid-emit (in its own process, another thread would wait for that lock: not so across them)."""
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        sim, text = self.sim, record.getMessage()
        actor = sim.actor()
        sim.emitted.append((actor, text, sim.now))
        nested = sim.path.nested_at
        if nested and actor == 0 and text.endswith(f".A {nested}") and not sim.nested:
            sim.nested = True
            caller, began = sim.actors[actor], sim.now
            caller.call("H")
            caller.handled += sim.now - began


class Actor:
    """One thread of a simulated process: the wrapper's in_order path on that process's session."""

    def __init__(self, sim: PathSim, actor: int, process: Process) -> None:
        self.sim, self.actor, self.process = sim, actor, process
        self.rank, self.thread = sim.path.actors[actor]
        self.process_index, self.num_processes = self.rank, sim.path.n
        self.is_main_process = self.rank == 0
        self.calls = 0
        self.at_site: dict[str, int] = {}  # site letter -> this actor's calls there
        self.handled = 0.0  # seconds its handler spent in its own in_order calls (`PathScript.nested_at`)

    # accelerate's PartialState, as the session and `turns.PlainBarriers` use it
    def wait_for_everyone(self) -> None:
        self.sim.block(Request(self.actor, "collective", "turn"))

    def call(self, letter: str) -> None:
        """One in_order call at site `letter`, as `_wrapper.patched_log` makes it (the lock, the mode, the side)."""
        self.calls += 1
        self.at_site[letter] = self.at_site.get(letter, 0) + 1
        session, settings, sim = self.process.session, self.process.settings, self.sim
        msg = f"call {self.actor}.{self.thread}.{letter} {self.at_site[letter]}"
        adapter = self.process.adapter
        start, handled = sim.now, self.handled
        log = LogArgs(adapter, logging.INFO, msg, (), {})
        call = InOrderCall(SITES[letter], log, session.origin(self), settings.timeout())
        with session.lock:  # `InOrderSession.call`, with the mode its side stands for noted
            queued, start = sim.now - start, sim.now  # behind another thread's call: that call's wait, not this one's
            side = session.side(self, settings, call)
            agreed = "gather" if isinstance(side, (gather_side.GatherSide, session_module._InChild)) else "barrier"
            side.call(call)
        # A call the handler made inside this one is timed on its own, not as this call's wait
        sim.calls.append((self.actor, letter, agreed, start, sim.now - (self.handled - handled)))
        sim.events.append(("queued", self.actor, letter, queued))
        sim.posted[msg] = sim.now
        if self.rank == 0 and agreed == "gather" and self.thread != "child":
            self._kept_age()

    def _kept_age(self) -> None:
        """How long the collector has kept records of a site the main process never called from (others-only).

        The collector keeps such a site's records at most a timeout from the end of the main call that
        first kept one (`Collector._release_others_only`), then emits them and keeps none there any more.
        Timed here from the first main call seen to end with them kept, not from the collector's own clock.
        """
        side = self.process.session._gather
        collector = None if side is None else side._collector
        if collector is None:
            return
        sites = {identity[0] for identity, block in collector.pending.items() if block} - set(collector.made)
        now = self.sim.now
        first = self.sim.first_kept
        for site in [site for site in first if site not in sites]:
            del first[site]
        self.sim.kept_ages += [now - first.setdefault(site, now) for site in sites]
        self.sim.kept_counts.append(sum(len(block) for block in collector.pending.values()))

    def main(self) -> None:
        sim = self.sim
        sim.threads[threading.get_ident()] = self.actor
        died = False
        try:
            sim.block(Request(self.actor, "resume"))
            for action in sim.path.actions[self.actor]:
                self.step(action)
        except Killed:
            died = True
        except Exception as exc:  # noqa: BLE001 -- an exception into user code is itself a violation
            sim.violations.append(f"actor {self.actor} raised {exc!r}")
        finally:
            sim.finish(self.actor, died, self.calls)

    def step(self, action: tuple[Any, ...]) -> None:
        sim, kind = self.sim, action[0]
        if kind == "call":
            self.call(action[1])
        elif kind == "delay":
            sim.block(Request(self.actor, "delay", until=sim.now + action[1]))
        elif kind == "configure":
            self.process.settings.configure(action[1])
        elif kind == "fork":
            self.fork(action[1], action[2])
        elif kind == "forked":
            sim.block(Request(self.actor, "forked"))
            self.process.session = sim.forked[self.actor]
            self.process.session.after_fork_in_child()  # what os.register_at_fork runs in the child
        elif kind == "close":
            self.process.session.close()

    def fork(self, child: int, when: str) -> None:
        """Fork `child` now, or (`"held"`) once another thread of this process holds the session lock."""
        sim, session = self.sim, self.process.session
        if when == "held":
            other = next(
                a for a, (r, t) in sim.path.actors.items() if r == self.rank and a != self.actor and t != "child"
            )
            sim.block(Request(self.actor, "held", args=(session.lock, other)))
            sim.events.append(("fork while held", self.actor, session.lock.owner, sim.now))
        twin = copy.copy(session)
        twin.lock = copy.copy(session.lock)  # held or not, as the parent's was at the fork
        twin._counts = copy.copy(session._counts)
        sim.forked[child] = twin


def _messages(block: dict[int, Any]) -> list[str]:
    found = []
    for entry in block.values():
        if isinstance(entry, logging.LogRecord):
            match = MESSAGE.search(entry.getMessage())
            if match:
                found.append(match.group(0))
    return found


class Process:
    """A simulated process: its session (opened on this rank's in-memory connection), settings and logger."""

    lock = SimLock  # the session's lock, as the scheduler's: re-entrant, exclusive

    def __init__(self, sim: PathSim, rank: int, own: str, logger: logging.Logger) -> None:
        self.settings = ActorSettings(own)
        self.session = session_module.InOrderSession(lambda timeout: (WatchedConnection(sim, rank), None))
        self.session.lock = self.lock(sim)  # type: ignore[assignment]
        self.adapter = Adapter(logger)


class Adapter:
    """accelerate's `MultiProcessAdapter`, as `_call.log_for_this_call` uses it (in both modes)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def isEnabledFor(self, level: int) -> bool:
        return True

    def process(self, msg: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return msg, kwargs


# -- schedules ------------------------------------------------------------------------------------


def draw(seed: int) -> PathScript:
    """The script of schedule `seed`: its kind (gather, switch, fork, threads), ranks, steps and faults."""
    rng = random.Random(seed)
    kind = rng.choice(["gather", "gather", "switch", "fork", "threads"])
    n = rng.randint(2, 4)
    script = PathScript(n, {r: (r, "main") for r in range(n)}, {}, start_word=rng.random() < 0.5)
    script.notes.append(kind)
    if kind in ("fork", "threads") and rng.random() < 0.4:
        script.job_mode = "barrier"
        script.notes.append("barrier: the job's mode")
    if kind == "switch":
        _switch(rng, script)
    else:
        _gather(rng, script, kind)
    for a in script.actions:
        if script.actors[a][1] == "main":
            script.actions[a].append(("close",))
    return script


def _steps(
    rng: random.Random, script: PathScript, rank: int, steps: int, dead: Optional[int]
) -> list[tuple[Any, ...]]:
    actions: list[tuple[Any, ...]] = []
    for _ in range(steps):
        actions.append(("delay", round(rng.uniform(0.0, 0.3) * T, 3)))
        actions.append(("call", "A"))
        if "main-only" in script.notes and rank == 0 and rng.random() < 0.5:
            actions.append(("call", "M"))
        if "others-only" in script.notes and rank != 0:
            actions.append(("call", "O"))
    return actions


def _gather(rng: random.Random, script: PathScript, kind: str) -> None:
    """Gather mode: calls every rank makes, main-only ones, others-only ones, a dead rank; a fork, or threads."""
    n = script.n
    if rng.random() < 0.5:
        script.notes.append("main-only")
    if rng.random() < 0.5:
        script.notes.append("others-only")
    steps = rng.randint(4, 12)
    dead = rng.randrange(1, n) if kind == "gather" and rng.random() < 0.3 else None
    for r in range(n):
        script.actions[r] = _steps(rng, script, r, steps, dead)
    if dead is not None:
        script.die_at[dead] = rng.randint(1, 3 * steps)
        if rng.random() < 0.5:
            script.applied.add(dead)
        script.notes.append(f"dead: rank {dead} at op {script.die_at[dead]}{' (applied)' * (dead in script.applied)}")
    elif kind == "gather" and rng.random() < 0.3:
        failed = rng.randrange(1, n)
        script.fail_at[failed] = rng.randint(1, 3 * steps)
        if rng.random() < 0.5:
            script.applied.add(failed)
        script.notes.append(
            f"fail: rank {failed} at op {script.fail_at[failed]}{' (applied)' * (failed in script.applied)}"
        )
    if kind == "threads":
        for r in range(n):
            a = len(script.actors)
            script.actors[a] = (r, "second")
            script.actions[a] = [("delay", round(rng.uniform(0.0, 0.3) * T, 3)), ("call", "A")] * rng.randint(1, 4)
    if kind == "fork":
        _fork(rng, script)
    if kind != "fork" and rng.random() < 0.3:
        script.nested_at = rng.randint(1, steps)
        script.notes.append(f"nested: the main's handler at A call {script.nested_at}")


def _fork(rng: random.Random, script: PathScript) -> None:
    """A rank forks a child: before its first call, after it, or while its other thread holds the lock."""
    r = rng.randrange(script.n)
    when = rng.choice(["before", "after", "held"])
    script.notes.append(f"fork: rank {r} {when}")
    child = len(script.actors)
    if when == "held":
        thread = child + 1
        script.actors[thread] = (r, "second")
        script.actions[thread] = [("fork", child, "held")]
    else:
        at = 0 if when == "before" else 2
        script.actions[r].insert(at, ("fork", child, "now"))
    script.actors[child] = (r, "child")
    script.actions[child] = [("forked",)] + [("call", "A")] * rng.randint(1, 3)


def _switch(rng: random.Random, script: PathScript) -> None:
    """A `configure` switch on every rank before the same call (gather to barrier), or on one rank alone in a
    barrier-mode job (to gather): the one that lost records when taken."""
    one_sided = rng.random() < 0.5
    script.job_mode = "barrier" if one_sided else "gather"
    script.start_word = False
    steps = rng.randint(3, 6)
    at = rng.randint(1, steps - 1)
    script.one_sided = rng.randrange(1, script.n) if one_sided else None
    script.notes.append(
        f"switch: {'rank ' + str(script.one_sided) if one_sided else 'every rank'} before call {at + 1}"
    )
    for r in range(script.n):
        actions: list[tuple[Any, ...]] = []
        for k in range(steps):
            if k == at and (not one_sided or r == script.one_sided):
                actions.append(("configure", "gather" if one_sided else "barrier"))
            actions += [("delay", round(rng.uniform(0.0, 0.2) * T, 3)), ("call", "A")]
        script.actions[r] = actions


# -- running one ----------------------------------------------------------------------------------


class _Clock:
    """What the product's modules see as `time`: the virtual clock."""

    def __init__(self, sim: PathSim) -> None:
        self.monotonic = sim.monotonic
        self.time = sim.monotonic


def run(path: PathScript, seed: int = 0) -> tuple[PathSim, list[str]]:
    """Run `path` on the schedule `seed` picks; the finished simulation and its invariant violations."""
    sim = PathSim(seed, path)
    actors: dict[int, Actor] = {}
    sim.actors = actors
    logger = logging.getLogger(f"{LOGGER}.{seed}")
    logger.propagate, logger.level = False, logging.INFO
    handler = Handler(sim)
    logger.addHandler(handler)
    processes = {r: Process(sim, r, path.job_mode, logger) for r in range(path.n)}
    actors.update(
        {
            a: Actor(sim, a, processes[r] if t != "child" else Process(sim, r, path.job_mode, logger))
            for a, (r, t) in path.actors.items()
        }
    )

    def warn(said: Any, key: Any = None) -> None:
        sim.warnings.append((sim.actor(), _diagnostics.text_of(said)))

    def barrier_side(*args: Any, **kwargs: Any) -> Any:
        side = BarrierSide(*args, **kwargs)
        side.checkin.clock = sim.monotonic  # the check-in's deadlines on the virtual clock, as the session's
        return side

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(session_module, "BarrierSide", barrier_side))
        for module in (session_module, collector_module, mode):
            stack.enter_context(mock.patch.object(module, "time", _Clock(sim)))
        stack.enter_context(mock.patch.object(session_module, "warn_once", warn))
        stack.enter_context(mock.patch.object(gather_side, "warn_once", warn))
        stack.enter_context(mock.patch.object(gather_side, "warn_every", warn))
        stack.enter_context(mock.patch.object(collector_module, "warn_every", warn))
        stack.enter_context(mock.patch.object(session_module.atexit, "register", lambda f: f))
        stack.enter_context(mock.patch.object(session_module.teardown, "on_destroy", lambda f: f))
        if path.start_word:
            _start(sim, processes)
        sim.run({a: actors[a].main for a in actors})
    logger.removeHandler(handler)
    return sim, check(sim)


def _start(sim: PathSim, processes: dict[int, Process]) -> None:
    """The process group started: each process notes its setting, the main process writes its start word."""
    for r, process in processes.items():
        process.session._started = (process.settings.mode(), process.settings.mode_generation)
    sim.data[mode.switch_key(mode.STARTED)] = processes[0].settings.mode().encode()


# -- the checks -----------------------------------------------------------------------------------


def check(sim: PathSim) -> list[str]:
    """Every invariant of the module docstring, on the finished schedule."""
    return (
        sim.violations + _exactly_once(sim) + _order(sim) + _waits(sim) + _kept(sim) + _switches(sim) + _children(sim)
    )


def _exactly_once(sim: PathSim) -> list[str]:
    """Each record made exactly once, whoever emitted it; none emitted that nobody made."""
    problems = []
    counts: dict[str, int] = {}
    for _, text, _ in sim.emitted:
        match = MESSAGE.search(text)
        if match:
            counts[match.group(0)] = counts.get(match.group(0), 0) + 1
    for msg in sim.posted:
        if counts.get(msg, 0) != 1:
            problems.append(f"record {msg!r} emitted {counts.get(msg, 0)} times")
    for msg, count in counts.items():
        if count > 1 and msg not in sim.posted:  # a call that never returned (its rank died in it): at most once
            problems.append(f"record {msg!r} emitted {count} times")
    return problems


def _order(sim: PathSim) -> list[str]:
    """In the main process's stream: each actor's records of one site in call order; a block's in rank order
    (but at an others-only site, whose records go out as they are found)."""
    switched = any(action[0] == "configure" for actions in sim.path.actions.values() for action in actions)
    if any(t != "main" for _, t in sim.path.actors.values()) or switched or sim.path.job_mode != "gather":
        return []
    problems = []
    last: dict[tuple[int, str], int] = {}
    previous: Optional[tuple[int, str, int]] = None
    for actor, text, _ in sim.emitted:
        match = MESSAGE.search(text)
        if actor != 0 or not match:
            continue
        who, site, n = int(match.group(1)), match.group(3), int(match.group(4))
        if last.get((who, site), 0) > n:
            problems.append(f"main stream: actor {who}'s record {n} at {site} after its record {last[(who, site)]}")
        if previous is not None and previous[1:] == (site, n) and previous[0] > who and site != "O":
            problems.append(f"main stream: the block of {site} call {n} has rank {previous[0]} before rank {who}")
        last[(who, site)] = n
        previous = (who, site, n)
    return problems


def _waits(sim: PathSim) -> list[str]:
    """No call over `bounds.CALL`; a non-main rank's gather-mode post never waits (`bounds.GATHER_POST`) once the
    start word is there, and after its first call always."""
    problems = []
    first: set[int] = set()
    for actor, site, agreed, start, end in sim.calls:
        rank, thread = sim.path.actors[actor]
        waited = end - start
        if waited > bounds.CALL.value * T + 1e-9:
            problems.append(f"actor {actor}'s call at {site} waited {waited / T:g} T > {bounds.CALL.value:g} T")
        its_first = (rank, thread) not in first
        first.add((rank, thread))
        post = rank != 0 and agreed == "gather" and thread != "child" and sim.path.one_sided is None
        if post and (sim.path.start_word or not its_first) and waited > bounds.GATHER_POST.value * T:
            problems.append(f"rank {rank}'s gather post at {site} waited {waited / T:g} T")
    return problems


def _kept(sim: PathSim) -> list[str]:
    """After each main call, the collector keeps records of a site the main process never called from for less
    than T since the end of the main call that first kept one there: its kept state does not grow per call."""
    oldest = max(sim.kept_ages, default=0.0)
    return [f"the collector kept records of an others-only site {oldest / T:g} T (>= 1 T)"] if oldest >= T else []


def _switches(sim: PathSim) -> list[str]:
    """A switch: every rank makes each call in the same mode (a switch on every rank is taken at the same call,
    one on one rank only not at all); one made on one rank only: one warning there (and, in the exactly-once
    check, no record lost)."""
    problems = []
    if any(action[0] == "configure" for actions in sim.path.actions.values() for action in actions):
        modes: dict[int, set[str]] = {}  # call number -> the modes the ranks made it in
        made: dict[int, int] = {}
        for actor, _, agreed, _, _ in sim.calls:
            made[actor] = made.get(actor, 0) + 1
            modes.setdefault(made[actor], set()).add(agreed)
        problems += [f"call {k} made in modes {sorted(m)} across the ranks" for k, m in modes.items() if len(m) > 1]
    r = sim.path.one_sided
    if r is None:
        return problems
    said = [text for actor, text in sim.warnings if actor == r and "configure(mode=" in text]
    return problems + ([] if len(said) == 1 else [f"one-sided switch on rank {r}: {len(said)} warnings about it"])


def _children(sim: PathSim) -> list[str]:
    """A forked child's records are its own (emitted by it), and its calls never wait."""
    problems = []
    for actor, site, _, start, end in sim.calls:
        if sim.path.actors[actor][1] == "child" and end > start:
            problems.append(f"forked child {actor}'s call at {site} waited {(end - start) / T:g} T")
    for emitter, text, _ in sim.emitted:
        match = MESSAGE.search(text)
        if match and sim.path.actors[int(match.group(1))][1] == "child" and emitter != int(match.group(1)):
            problems.append(f"forked child's record {match.group(0)!r} emitted by actor {emitter}")
    return problems


# -- mutations ------------------------------------------------------------------------------------


_AFTER_FORK = session_module.InOrderSession.after_fork_in_child
_SWITCH = session_module.InOrderSession._switch


def _child_keeps_lock(self: session_module.InOrderSession) -> None:
    lock = self.lock
    _AFTER_FORK(self)
    self.lock = lock


def _child_is_a_rank(self: session_module.InOrderSession) -> None:
    self.lock = threading.RLock()


def _one_sided_switch_taken(
    self: session_module.InOrderSession, state: Any, settings: Any, own: str, current: str
) -> str:
    _SWITCH(self, state, settings, own, current)
    return own


_EMIT_BLOCK = collector_module.Collector._emit_block


def _emit_reversed(self: collector_module.Collector, block: dict[int, Any], identity: Any) -> None:
    for rank in sorted(block, reverse=True):
        _EMIT_BLOCK(self, {rank: block[rank]}, identity)


_READ_MODE = mode.read_mode


def _start_word_unread(store: Any, seconds: float, switch: int = 0) -> Optional[str]:
    return None if switch == mode.STARTED else _READ_MODE(store, seconds, switch)


MUTATIONS: dict[str, tuple[Any, str, Any]] = {
    "post-waits-for-mode-word": (mode, "read_mode", _start_word_unread),
    "child-keeps-parent-lock": (session_module.InOrderSession, "after_fork_in_child", _child_keeps_lock),
    "child-is-a-rank": (session_module.InOrderSession, "after_fork_in_child", _child_is_a_rank),
    "one-sided-switch-taken": (session_module.InOrderSession, "_switch", _one_sided_switch_taken),
    "others-only-release-off": (collector_module.Collector, "_release_others_only", lambda self, timeout: None),
    "calls-without-the-lock": (Process, "lock", NoLock),
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
    kinds = {"kind:" + sim.path.notes[0]}
    kinds |= {"fault:" + note.partition(":")[0] for note in sim.path.notes[1:]}
    kinds |= {"start word" if sim.path.start_word else "no start word"}
    kinds |= {"mode:" + agreed for _, _, agreed, _, _ in sim.calls}
    kinds |= {"nested call made"} if sim.nested else set()
    kinds |= {"fork while held"} if any(e[0] == "fork while held" for e in sim.events) else set()
    kinds |= (
        {"fail after applied"} if any(n.startswith("fail") and "(applied)" in n for n in sim.path.notes) else set()
    )
    kinds |= (
        {"post settled anew"} if any("a fresh connection settled it" in text for _, text in sim.warnings) else set()
    )
    return kinds


def shard(seeds: list[int], mutate: Optional[str] = None, verbose: bool = False) -> tuple[list[Any], dict[str, int]]:
    """Run `seeds` (under mutation `mutate`): the failing seeds with their violations, and the coverage counts."""
    failures: list[Any] = []
    counts: dict[str, int] = {}
    for seed in seeds:
        with mutated(mutate) if mutate else ExitStack():
            sim, problems = explore(seed)
        if verbose:
            print(f"seed {seed}: n={sim.path.n} {sim.path.notes} start word={sim.path.start_word}")
            for a, actions in sim.path.actions.items():
                print(f"  actor {a} {sim.path.actors[a]}: {actions}")
            for event in sim.calls:
                print("   call", event)
            for event in sim.emitted:
                print("   emit", event)
            for event in sim.warnings + sim.events:
                print("  ", event)
        if problems:
            failures.append((seed, problems))
        for kind in coverage(sim):
            counts[kind] = counts.get(kind, 0) + 1
    return failures, counts


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay one schedule")
    parser.add_argument("--schedules", type=int, default=500)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--mutate", choices=sorted(MUTATIONS), help="break a promise on purpose")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.schedules))
    start = time.monotonic()
    failures, counts = shard(seeds, args.mutate, args.verbose)
    for seed, problems in failures:
        print(f"seed {seed} FAILED (replay: python tests/unit/explorer_path.py --seed {seed} -v): {problems}")
    explorer.print_coverage(counts, len(seeds))
    print(f"{len(seeds)} schedules, {len(failures)} failed, {time.monotonic() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
