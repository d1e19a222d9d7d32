"""The balancing rule: a call on a rank-dependent path is a hang only if the ranks' paths are unbalanced.

Rule: every path through a function (or a module's top level) must reach the same collectives, counted by
kind. `if rank == 0: barrier()` then `if rank != 0: barrier()` gives each rank one barrier, as do the
zero-first pair (`if local_rank not in [-1, 0]: barrier()` ... `if local_rank == 0: barrier()`), an early
`if rank not in ranks: barrier(); return` before a `barrier()`, and an if/else with one call on each side.
`walker` finds the calls on rank-dependent paths; this module says whether their kind is balanced.

How: the body is run abstractly for ranks 0..3 of 4 at once (0 is the main process, 3 the last), each
holding a count of the kind. A condition is evaluated for each rank where it can be (`rank == 0`,
`local_rank not in [-1, 0]`, `is_main_process`); a rank-dependent part that cannot (`rank in group_ranks`)
is a bit each rank may hold either way, every combination tried; a part that is the same on every rank
(`args.push_to_hub`) sends all ranks the same way, both ways tried. Anything the run cannot follow (a loop
whose trip count is the rank, too many combinations) is unknown: the caller stays silent.

A value a collective delivered (`broadcast(size, src)` then `n = size.item()`) is the same on every rank that
receives it, and what the sender tested to send it: a test of it on some ranks only (`if n == 0: return`) is
unknown, not a fork of its own, so the sender's `if len(data) == 0:` and the receivers' `if n == 0:` never
pair up into paths that no run takes.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional, Union

from . import rank, sources
from .shapes import is_exit, range_arguments
from .sources import Binding


WORLD = 4
RANKS = tuple(range(WORLD))
_LIVE, _DONE, _SKIP = 0, 1, 2  # a rank still running the block; returned or raised; gone to the loop's end
_MAX_ATOMS = 6  # rank-dependent and mixed unknowns tried in every combination: at most 2**6 worlds
_MAX_STATES = 512
_UNKNOWN = object()
_MATCH: tuple[type[ast.AST], ...] = tuple(getattr(ast, name) for name in ("Match",) if hasattr(ast, name))

Definitions = Mapping[str, Binding]  # rank-dependent names: their one defining value, if one, and origin
Vector = tuple[tuple[int, int], ...]  # (count, status) for each scenario
Counter = Callable[[ast.Call], bool]  # whether a call is of the kind being counted


class GiveUp(Exception):
    """The run cannot follow this body; the kind's balance is unknown."""


class Unbalanced(Exception):
    """A loop whose turns depend on the rank makes a counted call: the ranks make different numbers of it."""


@dataclass(frozen=True)
class Imbalance:
    """How the ranks' counts differ on one path: each count with the ranks making it, or the rank-dependent
    loop that makes them differ."""

    counts: tuple[tuple[int, tuple[int, ...]], ...] = ()
    loop: str = ""

    def describe(self, what: str) -> str:
        """`dist.barrier()`: rank 0 makes 1, ranks 1-3 make 0` (of `WORLD` ranks), or the loop's head."""
        if self.loop:
            return f"{what} in `{self.loop}`, whose number of turns depends on the rank"
        seen = [r for _, ranks in self.counts for r in ranks]
        if len(seen) != len(set(seen)):  # a rank in two groups: a test the run cannot evaluate, both ways
            return f"{what}: some ranks make " + ", others ".join(str(n) for n, _ in self.counts)
        made = (f"{_ranks(ranks)} {'makes' if len(ranks) == 1 else 'make'} {n}" for n, ranks in self.counts)
        return f"{what}: " + ", ".join(made)


def _ranks(ranks: Sequence[int]) -> str:
    """`rank 0`, `ranks 1-3`, `ranks 0, 2`."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


@dataclass(frozen=True)
class Scenario:
    """One rank, with its bits for the rank-dependent unknowns, in one world of same-on-every-rank unknowns."""

    rank: int
    bits: Mapping[str, bool]
    uniform: Mapping[str, bool]
    backend: Optional[str]


class Context:
    """One module's imports, its names for the backend and a scope's rank-dependent names, for conditions."""

    def __init__(
        self,
        imports: Mapping[str, str],
        names: Definitions,
        backend_names: Mapping[str, ast.expr] = {},
        delivered: Collection[str] = (),
        unknown: Counter = lambda call: False,
    ) -> None:
        self.imports = imports
        self.names = names
        self.backend_names = backend_names  # `is_fsdp = accelerator.distributed_type == ...`: same on every rank
        self.delivered = delivered  # names whose value a collective delivered (`delivered_names`)
        self.unknown = unknown  # whether a call may make collectives this run cannot count (a worker loop)

    def reads_delivered(self, node: ast.expr) -> bool:
        """Whether the expression reads a value a collective delivered (`size.item() == 0`)."""
        return bool(self.delivered) and any(isinstance(n, ast.Name) and n.id in self.delivered for n in ast.walk(node))

    def rank_dependent(self, node: ast.expr) -> bool:
        return rank.is_rank_dependent(node, self.imports, self.names)

    def value(self, node: ast.expr, scen: Scenario, depth: int = 0) -> object:
        """The expression's value for this scenario's rank, or _UNKNOWN."""
        if depth > 20:
            return _UNKNOWN
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.value(e, scen, depth + 1) for e in node.elts]
            return _UNKNOWN if _UNKNOWN in items else tuple(items)
        kind = rank.source_kind(node, self.imports)
        if kind is not None:
            return sources.value_for(kind, scen.rank, WORLD)
        if isinstance(node, ast.Name):
            return self._name_value(node.id, scen, depth)
        held = rank.held_name(node)
        if held is not None and held in self.names:
            return self._name_value(held, scen, depth)
        if isinstance(node, (ast.Attribute, ast.Call)):
            found = _backend_value(node, scen)
            if found is not _UNKNOWN or isinstance(node, ast.Attribute):
                return found
        return self._compound(node, scen, depth)

    def _name_value(self, name: str, scen: Scenario, depth: int) -> object:
        """A rank name's one value (a parameter or unpacked flag by its name's kind), or a backend name's."""
        binding = self.names.get(name)
        if binding is not None and sources.is_named_source(binding, name):
            return sources.value_for(sources.RANK_NAMES[name], scen.rank, WORLD)
        known = binding.value if binding is not None else self.backend_names.get(name)
        return _UNKNOWN if known is None else self.value(known, scen, depth + 1)

    def _compound(self, node: ast.expr, scen: Scenario, depth: int) -> object:
        """Comparisons, arithmetic, `and`/`or`, a rank-side conditional expression, `int(...)`: by their parts."""
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.value(node.left, scen, depth + 1), self.value(node.comparators[0], scen, depth + 1)
            return _compare(node.ops[0], left, right)
        if isinstance(node, ast.UnaryOp):
            operand = self.value(node.operand, scen, depth + 1)
            return _apply(_UNARY.get(type(node.op)), operand)
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left, scen, depth + 1), self.value(node.right, scen, depth + 1)
            return _apply(_BINARY.get(type(node.op)), left, right)
        if isinstance(node, ast.BoolOp):
            return self._bool_op(node, scen, depth)
        if isinstance(node, ast.IfExp):
            side = rank.rank_side(node, self.imports, self.names)
            if side is not None:
                return self.value(side, scen, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
            if node.func.id in ("int", "str"):  # int(os.environ["RANK"]): the rank, as a number either way
                return self.value(node.args[0], scen, depth + 1)
        return _UNKNOWN

    def _bool_op(self, node: ast.BoolOp, scen: Scenario, depth: int) -> object:
        values = [self.value(v, scen, depth + 1) for v in node.values]
        decisive = any(v is not _UNKNOWN and bool(v) == isinstance(node.op, ast.Or) for v in values)
        if decisive:
            return isinstance(node.op, ast.Or)
        return _UNKNOWN if _UNKNOWN in values else not isinstance(node.op, ast.Or)

    def truth(self, test: ast.expr, scen: Scenario) -> bool:
        """Whether the test holds for this scenario; an unknown part takes its bit (True when it has none)."""
        if isinstance(test, ast.BoolOp):
            parts = (self.truth(v, scen) for v in test.values)
            return any(parts) if isinstance(test.op, ast.Or) else all(parts)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return not self.truth(test.operand, scen)
        value = self.value(test, scen)
        if value is not _UNKNOWN:
            return bool(value)
        key = ast.dump(test)
        return scen.bits.get(key, scen.uniform.get(key, True))

    def atoms(self, test: ast.expr) -> Iterator[tuple[str, bool]]:
        """The unknown parts of a test, with whether each is rank-dependent (a bit) or the same everywhere."""
        if isinstance(test, ast.BoolOp):
            for v in test.values:
                yield from self.atoms(v)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            yield from self.atoms(test.operand)
        else:
            probe = Scenario(0, {}, {}, None)
            if self.value(test, probe) is _UNKNOWN:
                yield ast.dump(test), self.rank_dependent(test)


def delivered_names(body: Sequence[ast.stmt], is_collective: Counter) -> frozenset[str]:
    """The scope's names whose value a collective delivered: passed to one as a buffer (`broadcast(size, src)`),
    bound from one, or bound from such a name (`n = size.item()`). Not in nested functions."""
    names: set[str] = set()
    assigns: list[ast.Assign] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call) and is_collective(node):
            names.update(_buffers(node.args))
        elif isinstance(node, ast.Assign):
            assigns.append(node)
        stack.extend(_children(node))
    if not names:
        return frozenset()
    changed = True
    while changed:
        before = len(names)
        for node in assigns:
            if any(
                isinstance(n, ast.Name) and n.id in names or isinstance(n, ast.Call) and is_collective(n)
                for n in ast.walk(node.value)
            ):
                stored = (n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
                names.update(n.id for n in stored if isinstance(n.ctx, ast.Store))  # not `videos[i] = ...`'s `videos`
        changed = len(names) != before
    return frozenset(names)


def _buffers(args: Sequence[ast.expr]) -> Iterator[str]:
    """The names a collective can write into: its positional arguments that are names, or in a list of them
    (`broadcast(size, src)`, `broadcast_object_list([obj])`); not `gather(loss.repeat(args.n))`'s `args`."""
    for arg in args:
        for item in arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]:
            if isinstance(item, ast.Starred):
                item = item.value
            if isinstance(item, ast.Name):
                yield item.id


def backend_names(nodes: Sequence[ast.AST]) -> dict[str, ast.expr]:
    """Names the file binds once, to a value that says which backend runs (`is_fsdp = ... fsdp_plugin ...`)."""
    seen: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(node.value)
    return {
        name: values[0]
        for name, values in seen.items()
        if len(values) == 1 and any(_names_backend(n) for n in ast.walk(values[0]))
    }


def _names_backend(node: ast.AST) -> bool:
    words = (*_PLUGINS, "distributed_type")
    return (
        isinstance(node, ast.Attribute)
        and node.attr in words
        or isinstance(node, ast.Constant)
        and node.value in words
    )


_PLUGINS = {"fsdp_plugin": "FSDP", "deepspeed_plugin": "DEEPSPEED"}


def _backend_value(node: ast.expr, scen: Scenario) -> object:
    """`accelerator.distributed_type` is the scenario's backend, `DistributedType.FSDP` is "FSDP", and
    `accelerator.state.fsdp_plugin` (or `getattr(state, "fsdp_plugin", None)`) is set under FSDP only."""
    if isinstance(node, ast.Call):
        args = node.args
        if rank.last_name(node.func) != "getattr" or len(args) < 2 or not isinstance(args[1], ast.Constant):
            return _UNKNOWN
        attr = args[1].value
    elif isinstance(node, ast.Attribute):
        if rank.last_name(node.value) == "DistributedType":
            return node.attr
        attr = node.attr
    else:
        return _UNKNOWN
    if scen.backend is None or not isinstance(attr, str):
        return _UNKNOWN
    if attr == "distributed_type":
        return scen.backend
    if attr in _PLUGINS:
        return attr if _PLUGINS[attr] == scen.backend else None
    return _UNKNOWN


def _apply(op: Optional[Callable[..., object]], *values: object) -> object:
    if op is None or _UNKNOWN in values:
        return _UNKNOWN
    try:
        return op(*values)
    except Exception:  # `"0" + 1`, `x % 0`: not a value this run can know
        return _UNKNOWN


_UNARY: dict[type[ast.unaryop], Callable[..., object]] = {ast.Not: lambda a: not a, ast.USub: lambda a: -a}
_BINARY: dict[type[ast.operator], Callable[..., object]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Mod: lambda a, b: a % b,
    ast.FloorDiv: lambda a, b: a // b,
}
_COMPARE: dict[type[ast.cmpop], Callable[..., object]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def _compare(op: ast.cmpop, left: object, right: object) -> object:
    if isinstance(left, str) and isinstance(right, int) or isinstance(left, int) and isinstance(right, str):
        return _UNKNOWN  # a backend name against a number: not what this run models
    return _apply(_COMPARE.get(type(op)), left, right)


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """Child nodes that run where the node runs: not nested functions, classes or lambdas."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield child


Loop = Union[ast.For, ast.AsyncFor, ast.While]


class _Run:
    """One abstract run of a body for a set of scenarios, counting the calls `counts` accepts."""

    def __init__(self, ctx: Context, counts: Counter, scenarios: Sequence[Scenario]) -> None:
        self.ctx = ctx
        self.counts = counts
        self.scenarios = scenarios
        self._effect: dict[int, bool] = {}
        self.world = scenarios[0].uniform if scenarios else {}  # tests and loops decided once for all ranks
        self._checks = 0  # how deep in branches taken the same way on every rank since the last rank test

    def effect(self, node: ast.AST) -> bool:
        """Whether the node holds a counted call or a way out (`return`, `continue`...): else it is skipped."""
        key = id(node)
        if key not in self._effect:
            here = isinstance(node, ast.Call) and self.counts(node)
            here = here or isinstance(node, (ast.Continue, ast.Break)) or isinstance(node, ast.stmt) and is_exit(node)
            self._effect[key] = here or any(self.effect(c) for c in _children(node))
        return self._effect[key]

    def block(self, body: Sequence[ast.stmt], states: frozenset[Vector], mask: tuple[bool, ...]) -> frozenset[Vector]:
        for stmt in body:
            if self.effect(stmt):
                states = frozenset(out for vec in states for out in self.statement(stmt, vec, mask))
                if len(states) > _MAX_STATES:
                    raise GiveUp("too many paths")
        return states

    def statement(self, stmt: ast.stmt, vec: Vector, mask: tuple[bool, ...]) -> frozenset[Vector]:
        """The vectors one statement can leave, for the ranks in `mask` (the others are untouched)."""
        one = frozenset({vec})
        if isinstance(stmt, ast.If):
            vec = self.add(stmt.test, vec, mask)
            return self.branch(stmt.test, stmt.body, stmt.orelse, vec, mask)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            return self.loop(stmt, vec, mask)
        if isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return self.try_(stmt, vec, mask)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                vec = self.add(item.context_expr, vec, mask)
            return self.block(stmt.body, frozenset({vec}), mask)
        if isinstance(stmt, _MATCH):  # Python 3.10's `match`: each case the same way on every rank
            subject, cases = getattr(stmt, "subject"), getattr(stmt, "cases")
            vec = self.add(subject, vec, mask)
            last = cases[-1]  # `case _:` matches whatever the others did not
            wildcard = getattr(last.pattern, "pattern", 0) is None and last.guard is None
            return frozenset().union(
                *(self.checked(c.body, one, mask) for c in cases), frozenset() if wildcard else one
            )
        for child in _children(stmt):
            if isinstance(child, ast.expr):
                vec = self.add(child, vec, mask)
        if isinstance(stmt, ast.Raise) and self._checks:
            return frozenset()  # an error check's raise: a crash, not a path the job is meant to take
        if is_exit(stmt) or isinstance(stmt, (ast.Continue, ast.Break)):
            vec = _set_status(vec, mask, _DONE if is_exit(stmt) else _SKIP)
        return frozenset({vec})

    def branch(
        self, test: ast.expr, body: Sequence[ast.stmt], orelse: Sequence[ast.stmt], vec: Vector, mask: tuple[bool, ...]
    ) -> frozenset[Vector]:
        """Both sides for every rank alike when the test is the same everywhere; else each rank its own side."""
        one = frozenset({vec})
        if not self.ctx.rank_dependent(test):
            self.refuse_delivered(test, mask)
            decided = self.world.get(ast.dump(test))
            sides = frozenset() if decided is False else self.checked(body, one, mask)
            return sides | (frozenset() if decided else self.checked(orelse, one, mask))
        for side, other in ((body, orelse), (orelse, body)) if orelse else ():
            if any(self._counts_in(s) for s in side) and any(self._unknown_in(s) for s in other):
                raise GiveUp("the other side of a rank split calls what this run cannot count (a worker loop)")
        taken = tuple(self.ctx.truth(test, s) for s in self.scenarios)
        yes = tuple(m and t for m, t in zip(mask, taken))
        no = tuple(m and not t for m, t in zip(mask, taken))
        checks, self._checks = self._checks, 0  # a raise right under a rank test is some ranks leaving
        try:
            return self.block(orelse, self.block(body, one, yes), no)
        finally:
            self._checks = checks

    def refuse_delivered(self, test: ast.expr, mask: tuple[bool, ...]) -> None:
        """A test of a value a collective delivered, on some ranks only: it goes as the sender's did (unknown)."""
        if not all(mask) and self.ctx.reads_delivered(test):
            raise GiveUp("a test of a value a collective delivered")

    def checked(
        self, body: Sequence[ast.stmt], states: frozenset[Vector], mask: tuple[bool, ...]
    ) -> frozenset[Vector]:
        """A block entered the same way on every rank: a `raise` in it abandons the path (an error check)."""
        self._checks += 1
        try:
            return self.block(body, states, mask)
        finally:
            self._checks -= 1

    def loop(self, node: Loop, vec: Vector, mask: tuple[bool, ...]) -> frozenset[Vector]:
        """A loop the same on every rank runs its body zero times or once; a rank-dependent one is not followed."""
        head = node.test if isinstance(node, ast.While) else node.iter
        vec = self.add(head, vec, mask)
        if self.ctx.rank_dependent(head) or any(self.ctx.rank_dependent(a) for a in range_arguments(head)):
            if any(self._counts_in(s) for s in node.body):
                raise Unbalanced(ast.unparse(head))
            if any(self._leaves_or_counts(s) for s in node.body):
                raise GiveUp("a loop whose turns depend on the rank, and a way out in it")
            return frozenset({vec})
        self.refuse_delivered(head, mask)
        decided = self.world.get(_head_key(node))
        once = frozenset(
            _set_status(v, mask, _LIVE, only=_SKIP) for v in self.block(node.body, frozenset({vec}), mask)
        )
        turns = once if decided else frozenset({vec}) if decided is False else once | {vec}
        return self.block(node.orelse, turns, mask)

    def try_(self, node: Union[ast.Try, ast.stmt], vec: Vector, mask: tuple[bool, ...]) -> frozenset[Vector]:
        """The body and else; or, the same way on every rank, a handler from the start; then `finally`."""
        one = frozenset({vec})
        states = self.block(getattr(node, "orelse", []), self.block(getattr(node, "body", []), one, mask), mask)
        for handler in getattr(node, "handlers", []):
            states |= self.checked(handler.body, one, mask)
        return self.block(getattr(node, "finalbody", []), states, mask)

    def _counts_in(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and self.counts(node):
            return True
        return self.effect(node) and any(self._counts_in(c) for c in _children(node))

    def _unknown_in(self, node: ast.AST) -> bool:
        """Whether the node calls what may make collectives uncounted (a method defined elsewhere, a worker loop)."""
        if isinstance(node, ast.Call) and not self.counts(node) and self.ctx.unknown(node):
            return True
        return any(self._unknown_in(c) for c in _children(node))

    def _leaves_or_counts(self, node: ast.AST) -> bool:
        if isinstance(node, ast.stmt) and is_exit(node) or isinstance(node, ast.Call) and self.counts(node):
            return True
        return self.effect(node) and any(self._leaves_or_counts(c) for c in _children(node))

    def add(self, expr: ast.expr, vec: Vector, mask: tuple[bool, ...]) -> Vector:
        """Count the calls in an expression for each running rank (a rank-dependent `x if c else y` per rank)."""
        if not self.effect(expr):
            return vec
        return tuple(
            (count + self.count(expr, scen), status) if on and status == _LIVE else (count, status)
            for (count, status), on, scen in zip(vec, mask, self.scenarios)
        )

    def count(self, node: ast.AST, scen: Scenario) -> int:
        if not self.effect(node):
            return 0
        if isinstance(node, ast.IfExp) and self.ctx.rank_dependent(node.test):
            side = node.body if self.ctx.truth(node.test, scen) else node.orelse
            return self.count(node.test, scen) + self.count(side, scen)
        here = 1 if isinstance(node, ast.Call) and self.counts(node) else 0
        return here + sum(self.count(c, scen) for c in _children(node))


def _set_status(vec: Vector, mask: tuple[bool, ...], status: int, only: int = _LIVE) -> Vector:
    return tuple((c, status) if on and s == only else (c, s) for (c, s), on in zip(vec, mask))


def _tests(body: Sequence[ast.AST]) -> Iterator[ast.expr]:
    """Every branch test of a scope: of `if`, `while` and conditional expressions, not in nested functions."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node.test
        stack.extend(_children(node))


def _head_key(node: Union[ast.If, Loop]) -> str:
    """What decides a branch or loop: its test (`if`, `while`) or what it iterates over (`for`)."""
    return ast.dump(node.iter) if isinstance(node, (ast.For, ast.AsyncFor)) else ast.dump(node.test)


def _repeated_heads(body: Sequence[ast.AST], ctx: Context, counts: Counter) -> set[str]:
    """Tests and loops the same on every rank that the scope repeats around counted calls: `for n in shards:
    broadcast(...)` on rank 0 and again on the others turns as often on both sides, so it is decided once."""
    seen: dict[str, int] = {}
    holds: dict[int, bool] = {}

    def visit(node: ast.AST) -> bool:
        """Whether the node holds a counted call; counts the heads around one on the way back up."""
        found = isinstance(node, ast.Call) and counts(node)
        for child in _children(node):
            found = visit(child) or found
        holds[id(node)] = found
        if isinstance(node, (ast.If, ast.While, ast.For, ast.AsyncFor)) and any(
            holds.get(id(b), False) for b in node.body
        ):
            head = node.test if isinstance(node, (ast.If, ast.While)) else node.iter
            if not ctx.rank_dependent(head):
                seen[_head_key(node)] = seen.get(_head_key(node), 0) + 1
        return found

    for stmt in body:
        visit(stmt)
    return {key for key, times in seen.items() if times > 1}


def imbalance(
    body: Sequence[ast.stmt], ctx: Context, counts: Counter, backend: Optional[str] = None
) -> Optional[Imbalance]:
    """How the ranks' counts of the counted calls differ on a path, if they certainly do; None if they balance
    on every path or the run cannot tell."""
    bits: set[str] = set()
    try:
        mixed = _repeated_heads(body, ctx, counts)
    except RecursionError:
        return None
    for test in _tests(body):
        if ctx.rank_dependent(test):
            for key, per_rank in ctx.atoms(test):
                (bits if per_rank else mixed).add(key)
    if len(bits) + len(mixed) > _MAX_ATOMS:
        return None
    try:
        for world in _worlds(sorted(mixed)):
            found = _imbalance_in(body, ctx, counts, backend, sorted(bits), world)
            if found is not None:
                return found
        return None
    except Unbalanced as loop:
        return Imbalance(loop=str(loop))
    except (GiveUp, RecursionError):
        return None


def _worlds(keys: Sequence[str]) -> Iterator[Mapping[str, bool]]:
    for values in itertools.product((False, True), repeat=len(keys)):
        yield dict(zip(keys, values))


def _imbalance_in(
    body: Sequence[ast.stmt],
    ctx: Context,
    counts: Counter,
    backend: Optional[str],
    bits: Sequence[str],
    world: Mapping[str, bool],
) -> Optional[Imbalance]:
    """One world: every scenario's rank and bits run together; the first path whose counts differ, if any."""
    scenarios = [
        Scenario(r, dict(zip(bits, values)), world, backend)
        for r in RANKS
        for values in itertools.product((False, True), repeat=len(bits))
    ]
    run = _Run(ctx, counts, scenarios)
    start: Vector = tuple((0, _LIVE) for _ in scenarios)
    ends = run.block(body, frozenset({start}), tuple(True for _ in scenarios))
    for vec in sorted(ends):
        by_count: dict[int, set[int]] = {}
        for (count, _), scen in zip(vec, scenarios):
            by_count.setdefault(count, set()).add(scen.rank)
        if len(by_count) > 1:
            return Imbalance(tuple((n, tuple(sorted(r))) for n, r in sorted(by_count.items(), reverse=True)))
    return None


def counted(kinds: Collection[str], kind_of: Callable[[ast.Call], Optional[str]]) -> Counter:
    """A counter for calls whose kind is one of `kinds`."""
    return lambda call: kind_of(call) in kinds
