"""Walk one module's syntax tree and find the collectives that only some ranks reach.

A path is rank-dependent inside a branch or loop whose condition is rank-dependent (see `rank`), in a
function decorated to run on some ranks only (`@accelerator.on_main_process`), and in the rest of a block
after `if <rank-dependent>: return` (or `continue`, `break`, `raise`, `sys.exit()`). A `with` block is not a
branch: every rank runs the body of `main_process_first()`. The walk stays inside one function: a call made
on a rank-dependent path to a function that makes a collective is not followed (that would be a guess).

Such a call is only a candidate. It is a finding when the paths through its function are unbalanced for
its kind (`paths`: the balancing rule), so that `if main: info(a, in_order=True) else: info(b,
in_order=True)` and the zero-first barrier pair are silent. A collective on an explicit `group=` under a
membership test (`if rank in ranks_of_group:`, `if rank not in ranks: return`) is silent too: only the
group's members take part. AIF003 is counted per backend, DeepSpeed and FSDP, so that a condition letting
every rank through under DeepSpeed (`distributed_type == DistributedType.DEEPSPEED or is_main_process`)
leaves only FSDP in the message.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Optional, Union

from . import helpers, paths, rank, sources
from .paths import Definitions
from .shapes import exit_word, range_arguments
from .sources import Binding


IN_ORDER, COLLECTIVE, STATE = "AIF001", "AIF002", "AIF003"
CODES = (IN_ORDER, COLLECTIVE, STATE)
_MAX_CONDITION = 60
_BACKENDS = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP"}
# flake8's own syntax: a bare noqa comment silences every code; `noqa: AIF001,E501` those codes (by prefix).
_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z][0-9A-Z]*(?:[,\s]+[A-Z][0-9A-Z]*)*))?", re.IGNORECASE)

FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]


@dataclass(frozen=True)
class Reason:
    """Why the path is rank-dependent: `under` `if rank == 0:` (line 3); whether a membership test or a
    decorator is on the way (a group collective under the first is silent, balance never excuses the second)."""

    where: str
    condition: str
    line: int
    membership: bool = False
    decorated: bool = False
    source: str = ""  # which rank source makes the condition rank-dependent, as a sentence

    def inner(self, where: str, condition: str, line: int, membership: bool, source: str) -> Reason:
        """A nested rank-dependent condition: its own text and source, this one's flags kept."""
        return Reason(where, condition, line, membership or self.membership, self.decorated, source)

    def describe(self) -> str:
        where = f"{self.where} `{self.condition}` (line {self.line})"
        return f"{where}, where {self.source}" if self.source else where


@dataclass(frozen=True)
class Finding:
    """One call that only some ranks reach; line and column as flake8 counts them (both from 1)."""

    line: int
    col: int
    code: str
    message: str
    condition: str
    condition_line: int
    source: str = ""  # the rank source that makes the condition rank-dependent
    callee_line: Optional[int] = None  # for a call to the user's own function: the collective's line in it


def silences(line: str, code: str) -> bool:
    """Whether the line carries `# noqa` or `# noqa: <a prefix of code>`."""
    match = _NOQA.search(line)
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or any(code.startswith(c.upper()) for c in re.split(r"[,\s]+", codes) if c)


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _MAX_CONDITION else text[: _MAX_CONDITION - 3] + "..."


_NEW_SCOPES: tuple[type[ast.AST], ...] = (
    *(ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef),
    *(ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp),
)


_IF_WORD = re.compile(r"\bif\b")
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases", "items")


def _statement_children(node: ast.AST) -> Iterator[ast.AST]:
    """The statements, handlers, match cases and `with` items under a node, and a function's parameters."""
    for name in _BLOCKS:
        value = getattr(node, name, None)
        if isinstance(value, list):
            yield from value
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        yield from (a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a)


@dataclass
class _Index:
    """What one walk of the whole tree learns: every node, each scope's binding nodes, the lines of `x if c else y`.

    A scope is the module or a function (by `id`); a class body, lambda or comprehension is a scope of its own
    whose bindings no rank name comes from.
    """

    nodes: list[ast.AST]
    binders: dict[int, list[ast.AST]]
    if_exp_lines: set[int]
    guards: dict[int, tuple[ast.expr, ...]] = dataclasses.field(default_factory=dict)  # a binder's `if` tests

    @classmethod
    def of(cls, tree: ast.Module, lines: Optional[Sequence[str]] = None) -> _Index:
        """Every node; or, given the source lines, statements only (a fraction of the nodes) plus what the
        lines say: which lines may hold `x if c else y` (any line with the word `if`)."""
        index = cls([], {}, set())
        shallow = lines is not None and not any(":=" in line for line in lines)  # `:=` binds inside expressions
        children = _statement_children if shallow else ast.iter_child_nodes
        stack: list[tuple[ast.AST, int, tuple[ast.expr, ...]]] = [(tree, id(tree), ())]
        while stack:
            node, owner, tests = stack.pop()
            index.nodes.append(node)
            if isinstance(node, _BINDERS):
                index.binders.setdefault(owner, []).append(node)
                if tests:
                    index.guards[id(node)] = tests
            elif isinstance(node, ast.IfExp):
                index.if_exp_lines.add(node.lineno)
            if isinstance(node, _NEW_SCOPES):
                owner, tests = id(node), ()
            elif isinstance(node, ast.If):
                tests = (*tests, node.test)
            stack.extend((child, owner, tests) for child in children(node))
        if shallow and lines is not None:
            index.if_exp_lines = {i for i, line in enumerate(lines, 1) if _IF_WORD.search(line)}
        return index

    def may_hold_if_exp(self, expr: ast.expr) -> bool:
        end = getattr(expr, "end_lineno", None) or expr.lineno
        return any(line in self.if_exp_lines for line in range(expr.lineno, end + 1))


def rank_names(
    binders: Iterable[ast.AST], params: Sequence[ast.arg], inherited: Definitions, walker: _Walker
) -> Definitions:
    """Names of this scope that hold a rank-dependent value, each with its one value (if one) and origin.

    A name is one when every binding of it in the scope is `name = <rank-dependent value>` (also element by
    element in `a, b = x, y`); when it is a parameter, or unpacked from a call (`rank, world = init()`), and
    its own name is in `sources.RANK_NAMES`; or when the enclosing scope's is and this one does not rebind it.
    """
    bound = _Bindings()
    guards: dict[str, list[ast.expr]] = {}  # a name's bindings' enclosing `if` tests
    guarded: set[int] = set()  # the values bound under an `if`
    for node in binders:
        bound.add(node)
        tests = walker.index.guards.get(id(node), ())
        if tests and isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            guarded.add(id(node.value))
            for name in _assigned_names(node):
                guards.setdefault(name, []).extend(tests)
    parameters = {a.arg for a in params}
    tainted = {k: v for k, v in inherited.items() if k not in bound.names() | parameters}
    tainted.update(_named_sources(bound, params))
    unsure = bound.other | set(bound.unpacked) | parameters  # bound otherwise than by `name = value`
    changed = True
    while changed:  # a = dist.get_rank(); b = a == 0: b is rank-dependent once a is known to be
        changed = False
        for name, values in bound.assigned.items():
            if name in tainted or name in unsure:
                continue
            dependent = [walker.rank_dependent(v, tainted) for v in values]
            if all(dependent):
                only = values[0] if len(values) == 1 else None
                tainted[name] = Binding(only, walker.origin(name, values[0], tainted))
                changed = True
            elif all(
                d or isinstance(v, ast.Constant) and (id(v) in guarded or not any(dependent))
                for d, v in zip(dependent, values)
            ):
                origin = _flag_origin(name, values, dependent, guards.get(name, ()), walker, tainted)
                if origin:  # `master_process = rank == 0` or `= True`; `start = True`, then under a rank test False
                    tainted[name] = Binding(None, origin)
                    changed = True
    return tainted


def _flag_origin(
    name: str,
    values: Sequence[ast.expr],
    dependent: Sequence[bool],
    guards: Sequence[ast.expr],
    walker: _Walker,
    tainted: Definitions,
) -> str:
    """Why a name bound from rank values and constants is rank-dependent: one binding is of a rank value (the
    constants then bound under an `if`: `else: master_process = True`), or one sits under a rank test (`start =
    True`, then `if rank > 0: start = False`); "" if neither."""
    for value, is_rank in zip(values, dependent):
        if is_rank:
            return walker.origin(name, value, tainted) + ", and elsewhere from a constant"
    test = next((t for t in guards if walker.rank_dependent(t, tainted)), None)
    if test is None:
        return ""
    return f"`{name}` is bound under `if {_text(test)}:` (line {test.lineno})"


def _assigned_names(node: ast.AST) -> Iterator[str]:
    """The names a plain `name = value` binds."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if isinstance(target, ast.Name):
                yield target.id


def _named_sources(bound: _Bindings, params: Sequence[ast.arg]) -> dict[str, Binding]:
    """Parameters and names unpacked from a call that are rank sources by their name, if bound no other way."""
    found = {}
    for arg in params:
        if arg.arg in sources.RANK_NAMES and arg.arg not in bound.names():
            origin = f"`{arg.arg}` is a parameter named for a rank or main-process flag (line {arg.lineno})"
            found[arg.arg] = sources.named_source(arg.arg, origin)
    parameters = {a.arg for a in params}
    for name, value in bound.unpacked.items():
        if name not in bound.other | set(bound.assigned) | parameters:
            origin = f"`{name}` is bound from `{_text(value)}` at line {value.lineno}"
            found[name] = sources.named_source(name, origin)
    return found


class _Bindings:
    """A scope's binding nodes sorted: plain `name = value` (element-wise through tuples), names unpacked from
    a call whose own name is a rank name, and every other name bound (loop targets, imports, `+=`...)."""

    def __init__(self) -> None:
        self.assigned: dict[str, list[ast.expr]] = {}
        self.unpacked: dict[str, ast.expr] = {}
        self.other: set[str] = set()

    def names(self) -> set[str]:
        """Every name the scope binds, in any way."""
        return self.other | set(self.assigned) | set(self.unpacked)

    def add(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                self.bind(target, node.value)
        else:
            self.other.update(_other_names(node))
            self.other.update(_other_stores(node))

    def bind(self, target: ast.expr, value: ast.expr) -> None:
        """`x = v`; `a, b = x, y` pair by pair; `rank, world = f()` by name; anything else is another binding."""
        if isinstance(target, ast.Name):
            self.assigned.setdefault(target.id, []).append(value)
        elif _pairs(target, value):
            for elt, part in zip(getattr(target, "elts"), getattr(value, "elts")):
                self.bind(elt, part)
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, ast.Call):
            for elt in target.elts:
                if isinstance(elt, ast.Name) and elt.id in sources.RANK_NAMES and elt.id not in self.unpacked:
                    self.unpacked[elt.id] = value
                else:
                    self.other.update(n.id for n in ast.walk(elt) if isinstance(n, ast.Name))
        else:
            self.other.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))


def _pairs(target: ast.expr, value: ast.expr) -> bool:
    """Whether `target = value` is `a, b = x, y`: two tuples (or lists) of one length, nothing starred."""
    if not (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))):
        return False
    starred = any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts))
    return not starred and len(target.elts) == len(value.elts)


_BINDERS: tuple[type[ast.AST], ...] = (
    *(ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr),
    *(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global),
    *(ast.Nonlocal, ast.ExceptHandler),
)


def _other_names(node: ast.AST) -> Iterator[str]:
    """Names bound by a definition, an import, `global`/`nonlocal` or `except ... as`."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        yield from ((a.asname or a.name).split(".")[0] for a in node.names)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        yield from node.names
    elif isinstance(node, ast.ExceptHandler) and node.name:
        yield node.name


def _other_stores(node: ast.AST) -> Iterator[str]:
    """Names bound by anything but a plain `name = value`: loop targets, unpacking, `with ... as`, `+=`, `:=`."""
    if isinstance(node, (ast.For, ast.AsyncFor, ast.AugAssign)):
        targets: list[ast.expr] = [node.target]
    elif isinstance(node, ast.AnnAssign):
        targets = [] if node.value is not None and isinstance(node.target, ast.Name) else [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    else:
        return
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                yield sub.id


def _parameters(node: Union[FunctionNode, ast.Lambda]) -> list[ast.arg]:
    args = node.args
    return [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None]


@dataclass(frozen=True)
class _Candidate:
    """A call on a rank-dependent path, before the balancing rule has judged its function."""

    call: ast.Call
    code: str
    reason: Reason
    scope: int  # index into _Walker.scopes
    reached: Optional[helpers.Reach] = None  # the collective a call to the user's own function makes


class _Walker:
    """One module's walk: the file's imports and accelerator names, the scopes seen and the candidates."""

    def __init__(
        self,
        tree: ast.Module,
        lines: Optional[Sequence[str]] = None,
        path: str = "",
        package: Optional[helpers.Package] = None,
    ) -> None:
        self.index = _Index.of(tree, lines)
        self.imports = rank.import_table(self.index.nodes)
        self.receivers = rank.receiver_names(self.index.nodes, self.imports)
        self.scopes: list[tuple[Sequence[ast.stmt], Definitions]] = []
        self.candidates: list[_Candidate] = []
        self.functions = helpers.functions(tree)
        self.path, self.package = path, package
        self.from_imports = helpers.from_imports(tree) if package is not None else {}
        self.from_imports_any = rank.relative_imports(self.index.nodes)
        self.lines = lines
        self.attributes: dict[str, list[Optional[Binding]]] = {}  # `self.x` -> each binding (None: not of a rank)
        self._reaches: dict[tuple[str, tuple[tuple[str, str], ...]], Optional[helpers.Reach]] = {}

    def rank_dependent(self, node: ast.expr, tainted: Definitions) -> bool:
        return rank.is_rank_dependent(node, self.imports, tainted)

    def code_of(self, call: ast.Call) -> Optional[str]:
        kind = self.kind_of(call)
        return None if kind is None else _code_of_kind(kind)

    def kind_of(self, call: ast.Call) -> Optional[str]:
        """What the balancing rule counts: the call's own kind, or the one its callee certainly makes."""
        kind = helpers.call_kind(call, self.imports, self.receivers)
        if kind is not None:
            return kind
        reached = self.reach_of(call)
        return None if reached is None else reached.kind

    def is_collective(self, call: ast.Call) -> bool:
        """Whether the call itself is a collective (not an in_order call, not a user's function)."""
        return (helpers.call_kind(call, self.imports, self.receivers) or "").startswith("collective")

    def unknown_count(self, call: ast.Call) -> bool:
        """Whether the call may make collectives the balancing rule cannot count: a method not defined in this
        file (`model.generate_other_ranks()`, `self.serve()` of a base class), a function imported from the
        user's own package (`from .worker import loop`), or a function of this file that makes one somewhere but
        not on every path (a worker loop). A library's function, a builtin and a log call make none."""
        if helpers.call_kind(call, self.imports, self.receivers) is not None or self.reach_of(call) is not None:
            return False
        parts = rank.dotted(call.func)
        if not parts or parts[-1] in rank.LOG_METHODS or parts[-1] == "print":
            return False
        name = ".".join(parts)
        if name in self.functions:
            return helpers.makes_collective(self.functions[name], self.imports, self.receivers)
        if parts[0] in self.from_imports_any:
            return True  # the user's own module, by a relative import
        return len(parts) > 1 and parts[0] not in self.imports

    def reach_of(self, call: ast.Call) -> Optional[helpers.Reach]:
        """The collective a call to the user's own function certainly makes (one call deep), or None."""
        name = ".".join(rank.dotted(call.func) or [])
        passed = helpers.passed_receivers(self.functions[name], call, self.receivers) if name in self.functions else {}
        key = (name, tuple(sorted(passed.items())))
        if key not in self._reaches:
            self._reaches[key] = None  # a function calling itself is not followed into
            self._reaches[key] = self._find_reach(call.func, name, passed)
        return self._reaches[key]

    def _find_reach(self, func: ast.expr, name: str, passed: rank.Receivers) -> Optional[helpers.Reach]:
        if name in self.functions:
            return helpers.reach(self.functions[name], self.imports, {**self.receivers, **passed})
        imported = helpers.imported_function(func, self.from_imports)
        if imported is None or self.package is None:
            return None
        return self.package.lookup(self.path, *imported)

    def origin(self, name: str, value: ast.expr, tainted: Definitions) -> str:
        """`RANK` is bound from `lm.rank` at line 3; for a chain, also where the name it is bound from came from."""
        here = f"`{name}` is bound from `{_text(value)}` at line {value.lineno}"
        atom = self.source_atom(value, tainted)
        held = None if atom is None else rank.held_name(atom)
        return f"{here}, and {tainted[held].origin}" if held is not None and held in tainted else here

    def source_of(self, expr: ast.expr, tainted: Definitions) -> str:
        """The sentence naming the rank source that makes `expr` rank-dependent (its first one), or ""."""
        atom = self.source_atom(expr, tainted)
        held = None if atom is None else rank.held_name(atom)
        if held is not None and held in tainted:
            return tainted[held].origin
        return "" if atom is None else sources.describe_atom(atom)

    def source_atom(self, expr: ast.expr, tainted: Definitions) -> Optional[ast.expr]:
        """The first rank source in `expr` (of `a and b`, in its first rank-dependent part): a rank name or atom."""
        if isinstance(expr, ast.BoolOp):
            part = next((v for v in expr.values if self.rank_dependent(v, tainted)), None)
            return None if part is None else self.source_atom(part, tainted)
        for node in ast.walk(expr):
            if isinstance(node, (ast.Name, ast.Attribute)) and rank.held_name(node) in tainted:
                return node
            if isinstance(node, ast.expr) and rank.is_rank_source(node, self.imports):
                return node
        return None

    def walk(self, body: Sequence[ast.stmt], reason: Optional[Reason], tainted: Definitions) -> None:
        """Walk a function's (or the module's) body as a scope of its own."""
        self.scopes.append((body, tainted))
        saved, self.scope = getattr(self, "scope", 0), len(self.scopes) - 1
        self.block(body, reason, tainted)
        self.scope = saved

    def block(self, body: Sequence[ast.stmt], reason: Optional[Reason], tainted: Definitions) -> None:
        for stmt in body:
            self.statement(stmt, reason, tainted)
            reason = self.after(stmt, reason, tainted) or reason

    def statement(self, stmt: ast.stmt, reason: Optional[Reason], tainted: Definitions) -> None:
        """One statement: a function is a scope of its own, `if` and loops may make the path rank-dependent."""
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(stmt, reason, tainted)
        elif isinstance(stmt, ast.If):
            self.branch(stmt, reason, tainted)
        elif isinstance(stmt, (ast.While, ast.For, ast.AsyncFor)):
            self.loop(stmt, reason, tainted)
        else:
            self.fields(stmt, reason, tainted)

    def fields(self, node: ast.AST, reason: Optional[Reason], tainted: Definitions) -> None:
        """Any other statement: its expressions, then its blocks (try, with, match, class bodies)."""
        for value in ast.iter_fields(node):
            for item in value[1] if isinstance(value[1], list) else [value[1]]:
                if isinstance(item, ast.expr):
                    self.scan(item, reason, tainted)
                elif isinstance(item, ast.AST) and not isinstance(item, ast.stmt):
                    self.fields(item, reason, tainted)  # except handlers, match cases, with items, keywords
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                self.block(body, reason, tainted)

    def function(self, node: FunctionNode, reason: Optional[Reason], tainted: Definitions) -> None:
        """Decorators and defaults where defined; the body where called, rank-dependent if decorated so."""
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.scan(expr, reason, tainted)
        inner: Optional[Reason] = None  # a function body runs where it is called, not where it is defined
        for decorator in node.decorator_list:
            if rank.last_name(decorator) in sources.RANK_DECORATORS:
                source = f"`{rank.last_name(decorator)}` is a rank decorator"
                inner = Reason(
                    "in a function decorated", f"@{_text(decorator)}", decorator.lineno, False, True, source
                )
        binders = self.index.binders.get(id(node), ())
        names = rank_names(binders, _parameters(node), tainted, self)
        self.record_attributes(binders, names)
        self.walk(node.body, inner, names)

    def record_attributes(self, binders: Iterable[ast.AST], names: Definitions) -> None:
        """Note each `self.x = ...` of a function: rank-dependent (with its value read in this scope) or not."""
        for node in binders:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = None if isinstance(node, ast.AugAssign) else node.value
                for target in targets:
                    held = rank.held_name(target)
                    if held is None or isinstance(target, ast.Name):
                        continue
                    binding = None
                    if value is not None and self.rank_dependent(value, names):
                        binding = Binding(sources.resolved(value, names), self.origin(held, value, names))
                    self.attributes.setdefault(held, []).append(binding)

    def rank_attributes(self) -> dict[str, Binding]:
        """The `self` attributes every binding of which, in this module, is rank-dependent: `self._is_rank_zero`."""
        return {
            held: bindings[0] if len(bindings) == 1 else Binding(None, bindings[0].origin)
            for held, bindings in self.attributes.items()
            if all(bindings) and bindings[0] is not None
        }

    def condition(self, test: ast.expr, reason: Optional[Reason], tainted: Definitions) -> Optional[str]:
        """The test's text when it is rank-dependent (its own calls are checked on the path that evaluates it)."""
        self.scan(test, reason, tainted)
        return self.condition_text(test, tainted) if self.rank_dependent(test, tainted) else None

    def condition_text(self, test: ast.expr, tainted: Definitions) -> str:
        """A long `a and accelerator.is_main_process and b` reads `... and accelerator.is_main_process and ...`."""
        if len(ast.unparse(test)) <= _MAX_CONDITION or not isinstance(test, ast.BoolOp):
            return _text(test)
        parts = [ast.unparse(v) if self.rank_dependent(v, tainted) else "..." for v in test.values]
        kept = [p for i, p in enumerate(parts) if p != "..." or i == 0 or parts[i - 1] != "..."]
        joined = (" and " if isinstance(test.op, ast.And) else " or ").join(kept)
        return joined if len(joined) <= _MAX_CONDITION else joined[: _MAX_CONDITION - 3] + "..."

    def reason(self, outer: Optional[Reason], where: str, text: str, test: ast.expr, tainted: Definitions) -> Reason:
        membership, source = self.is_membership(test, tainted), self.source_of(test, tainted)
        if outer is None:
            return Reason(where, text, test.lineno, membership, source=source)
        return outer.inner(where, text, test.lineno, membership, source)

    def is_membership(self, test: ast.expr, tainted: Definitions) -> bool:
        """`rank in ranks`, `rank not in ranks`, also inside `and`/`not`: the rank tested against a set."""
        if isinstance(test, ast.BoolOp):
            return any(self.is_membership(v, tainted) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_membership(test.operand, tainted)
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            return False
        return isinstance(test.ops[0], (ast.In, ast.NotIn)) and self.rank_dependent(test.left, tainted)

    def branch(self, node: ast.If, reason: Optional[Reason], tainted: Definitions) -> None:
        cond = self.condition(node.test, reason, tainted)
        if cond is None:
            self.block(node.body, reason, tainted)
            self.block(node.orelse, reason, tainted)
            return
        self.block(node.body, self.reason(reason, "under", f"if {cond}:", node.test, tainted), tainted)
        self.block(node.orelse, self.reason(reason, "in the else of", f"if {cond}:", node.test, tainted), tainted)

    def loop(
        self, node: Union[ast.While, ast.For, ast.AsyncFor], reason: Optional[Reason], tainted: Definitions
    ) -> None:
        """`while <rank-dependent>:` and `for _ in range(<rank>):` make their body rank-dependent; `else` is not."""
        if isinstance(node, ast.While):
            cond = self.condition(node.test, reason, tainted)
            text, head = f"while {cond}:", node.test
        else:
            self.scan(node.target, reason, tainted)
            cond = _text(node.iter) if self._rank_range(node.iter, tainted) else None
            self.scan(node.iter, reason, tainted)
            text, head = f"for {_text(node.target)} in {cond}:", node.iter
        inner = reason if cond is None else self.reason(reason, "under", text, head, tainted)
        self.block(node.body, inner, tainted)
        self.block(node.orelse, reason, tainted)

    def _rank_range(self, node: ast.expr, tainted: Definitions) -> bool:
        """`range(accelerator.process_index)`: as many turns as the rank says."""
        return any(self.rank_dependent(arg, tainted) for arg in range_arguments(node))

    def after(self, stmt: ast.stmt, reason: Optional[Reason], tainted: Definitions) -> Optional[Reason]:
        """The reason for the rest of the block after `if <rank-dependent>: return`, or None."""
        if not isinstance(stmt, ast.If) or not self.rank_dependent(stmt.test, tainted):
            return None
        body_exit, else_exit = exit_word(stmt.body), exit_word(stmt.orelse)
        if (body_exit is None) == (else_exit is None):
            return None  # neither branch leaves, or both do (the rest is unreachable)
        cond = self.condition_text(stmt.test, tainted)
        text = f"if {cond}: {body_exit}" if body_exit else f"if {cond}: ... else: {else_exit}"
        return self.reason(reason, "after", text, stmt.test, tainted)

    def scan(self, expr: ast.expr, reason: Optional[Reason], tainted: Definitions) -> None:
        """Check every call in an expression (iteratively: long `a + b + ...` chains are deep trees)."""
        if reason is None and not self.index.may_hold_if_exp(expr):
            return  # no call here is on a rank-dependent path
        stack: list[tuple[ast.AST, Optional[Reason]]] = [(expr, reason)]
        while stack:
            node, why = stack.pop()
            if isinstance(node, ast.Lambda):
                continue  # runs where it is called
            if isinstance(node, ast.IfExp) and self.rank_dependent(node.test, tainted):
                text = f"... if {_text(node.test)} else ..."
                stack.append((node.test, why))
                stack.append((node.body, self.reason(why, "under", text, node.test, tainted)))
                stack.append((node.orelse, self.reason(why, "in the else of", text, node.test, tainted)))
                continue
            if isinstance(node, ast.Call) and why is not None:
                self.candidate(node, why)
            stack.extend((child, why) for child in ast.iter_child_nodes(node))

    def candidate(self, call: ast.Call, reason: Reason) -> None:
        code = self.code_of(call)
        if code is None:
            return
        if code == COLLECTIVE and reason.membership and any(k.arg == "group" for k in call.keywords):
            return  # a group's collective under a membership test: only the members take part
        if (
            self.lines is not None
            and 0 < call.lineno <= len(self.lines)
            and silences(self.lines[call.lineno - 1], code)
        ):
            return  # silenced before its branch is grouped: the branch's other calls are still reported
        direct = helpers.call_kind(call, self.imports, self.receivers) is not None
        self.candidates.append(_Candidate(call, code, reason, self.scope, None if direct else self.reach_of(call)))


def _code_of_kind(kind: str) -> Optional[str]:
    if kind == "in_order":
        return IN_ORDER
    return {"collective": COLLECTIVE, "state": STATE}.get(kind.split(":", 1)[0])


def _judge(walker: _Walker) -> Iterator[Finding]:
    """One finding per rank-dependent branch (per code) whose calls the balancing rule keeps: judged per
    function and kind, AIF003 per backend; the finding is the branch's first kept call, with the counts."""
    backend_names = paths.backend_names(walker.index.nodes) if walker.candidates else {}
    kinds: dict[tuple[int, str], list[_Candidate]] = {}
    for cand in walker.candidates:
        kinds.setdefault((cand.scope, walker.kind_of(cand.call) or ""), []).append(cand)
    branches: dict[tuple[int, int, str], list[tuple[_Candidate, str, list[str], str]]] = {}
    for (scope, kind), cands in kinds.items():
        body, names = walker.scopes[scope]
        delivered = paths.delivered_names(body, walker.is_collective)
        ctx = paths.Context(walker.imports, names, backend_names, delivered, walker.unknown_count)
        counts = paths.counted({kind}, walker.kind_of)
        found = {b: paths.imbalance(body, ctx, counts, b if cands[0].code == STATE else None) for b in _BACKENDS}
        backends = [b for b, imbalance in found.items() if imbalance is not None]
        what = _counted_text(cands[0])
        differ = next((i.describe(what) for i in found.values() if i is not None), "")
        for cand in cands:
            if backends or cand.reason.decorated:
                key = (cand.scope, cand.reason.line, cand.code)
                branches.setdefault(key, []).append((cand, kind, backends or list(_BACKENDS), differ))
    for kept in branches.values():
        kept.sort(key=lambda k: (k[0].call.lineno, k[0].call.col_offset))
        yield _finding(kept)


def _counted_text(cand: _Candidate) -> str:
    """What the balancing rule counted for this call: `dist.barrier()`, or the collective its callee makes."""
    if cand.reached is not None:
        return f"`{cand.reached.call}`"
    return (
        f"`{_text(cand.call.func)}(..., in_order=True)`" if cand.code == IN_ORDER else f"`{_text(cand.call.func)}()`"
    )


def _finding(kept: Sequence[tuple[_Candidate, str, Sequence[str], str]]) -> Finding:
    """The branch's finding, at its first call: what the call is (or the collective its callee makes), why only
    some ranks reach it and which rank source says so, how the ranks' counts differ; for AIF003 how to fix it."""
    cand, kind, backends, _ = kept[0]
    call, reason, reached = cand.call, cand.reason, cand.reached
    callee = _text(call.func)
    where = f"on a rank-dependent path: {reason.describe()}"
    fix = "every rank must reach it"
    if cand.code == IN_ORDER:
        what, text = "an in_order log call", f"`{callee}(..., in_order=True)`"
    elif cand.code == COLLECTIVE:
        what, text = "a collective", f"`{callee}()`"
    else:
        names = dict(zip(_BACKENDS, rank.STATE_COLLECTIVES[kind.split(":", 1)[1]]))
        covered = [names[b] for b in _BACKENDS if b not in backends]
        lets = f" (the condition lets every rank through under {covered[0]} only)" if covered else ""
        what, text = "collective under " + " and ".join(names[b] for b in backends) + ",", f"`{callee}()`"
        where, fix = where + lets, "call it on every rank, and write files on the main process only"
    differ = list(dict.fromkeys(d for *_, d in kept if d))
    counts = f"; the ranks' counts differ: {'; '.join(differ)}" if differ else ""
    more = sorted({k[0].call.lineno for k in kept[1:]} - {call.lineno})
    also = (
        f" (and {len(more)} more under it: line{'s' if len(more) > 1 else ''} {', '.join(map(str, more))})"
        if more
        else ""
    )
    if reached is None:
        message = f"{text} is {what} {where}{also}{counts}; {fix}"
    else:
        message = (
            f"`{callee}()` calls `{reached.call}` ({reached.where()}), which is {what} {where}{also}{counts}; {fix}"
        )
    line = None if reached is None else reached.line
    return Finding(
        call.lineno, call.col_offset + 1, cand.code, message, reason.condition, reason.line, reason.source, line
    )


def check_tree(
    tree: ast.Module, lines: Optional[Sequence[str]] = None, path: str = "", package: Optional[helpers.Package] = None
) -> list[Finding]:
    """The findings of one parsed module, in source order; its source lines, if given, spare a full walk.

    `path` and `package` (the functions of the files given with it) let a call to a function imported from
    one of those files count as the collective that function makes.
    """
    walker = _Walker(tree, lines, path, package)
    names = rank_names(walker.index.binders.get(id(tree), ()), (), {}, walker)
    walker.walk(tree.body, None, names)
    attributes = walker.rank_attributes()
    if attributes:  # `self._is_rank_zero = rank == 0` in one method, tested in others: walk again knowing it
        walker.scopes, walker.candidates = [], []
        walker.walk(tree.body, None, {**names, **attributes})
    return sorted(_judge(walker), key=lambda f: (f.line, f.col, f.code))
