"""One call deep: the user's own functions that certainly make a collective, in this file or its package.

`if accelerator.is_main_process: checkpoint(accelerator, out)` hangs when `checkpoint` calls `save_state`,
exactly as if `save_state` were written under the `if`. So a call on a rank-dependent path to a function
defined in the same file (a module-level function, or a method called on `self`), or in a file given
together with it that the call's name is imported from, counts as the collective the function makes.

Only a collective the function makes on every path through it counts: one in its top-level statements, or
inside a `with` or `try` body, before any statement that can leave (`return`, `raise`) and outside any loop.
An `if` counts only when its test is the same on every rank and reads none of the function's own names
(`if is_distributed(): dist.barrier()`, `if not dist.is_initialized(): return`): when it is false no rank
makes the collective and nothing can hang. A test of a parameter (`if sync: barrier()`) is not followed, and
neither is a second call deep: silence where the lint cannot be sure. An argument that is a framework's
object (`checkpoint(accelerator, out)`) makes its parameter one inside the function (`acc.save_state()`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from . import paths, rank, shapes


FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]
_BARRIERS = {"wait_for_everyone": "barrier", "torch.distributed.barrier": "barrier"}
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# Every word a collective call is spelled with: a file that spells none has no function worth indexing.
_WORDS = {*rank.ACCELERATE_ONLY, *rank.ACCELERATE_AMBIGUOUS, *rank.TORCH_DISTRIBUTED, *rank.STATE_COLLECTIVES}
_MENTIONS_COLLECTIVE = re.compile("|".join(sorted(_WORDS | {"in_order"})).encode())


@dataclass(frozen=True)
class Reach:
    """What a user's function certainly makes: the call's kind, its text and line, and where it is defined."""

    kind: str
    call: str
    line: int
    function: str
    path: str = ""  # the file, when it is not the caller's own
    when: str = ""  # the tests, the same on every rank, it is made under: "`is_distributed()`"

    def where(self) -> str:
        """`line 350`, or `utils.py:350` when the function is in another file; and when it is made."""
        place = f"{Path(self.path).name}:{self.line}" if self.path else f"line {self.line}"
        return f"{place}, when {self.when}" if self.when else place


def mentions_collective(source: bytes) -> bool:
    """Whether the source spells any collective at all (files that do not define no helper worth indexing)."""
    return _MENTIONS_COLLECTIVE.search(source) is not None


def call_kind(call: ast.Call, imports: Mapping[str, str], receivers: rank.Receivers) -> Optional[str]:
    """What the balancing rule counts: "in_order", a collective's name (and group), a state method's name."""
    if rank.is_in_order_call(call):
        return "in_order"
    name = rank.collective_name(call, imports, receivers)
    if name:
        group = next((k.value for k in call.keywords if k.arg == "group"), None)
        suffix = "" if group is None else f"[group={ast.unparse(group)}]"
        return "collective:" + _BARRIERS.get(name, name) + suffix
    state = rank.state_collective(call, receivers)
    return f"state:{state}" if state else None


def functions(tree: ast.Module) -> dict[str, FunctionNode]:
    """The module's functions by the name a call uses: `f` for a module-level `def f`, `self.m` for a method.

    A name defined twice (two module-level `def f`, two classes with a `save` method) is left out: which one
    runs is not certain. A `def` under an `if` or inside another function is not seen at all.
    """
    seen: dict[str, list[FunctionNode]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            seen.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    seen.setdefault(f"self.{item.name}", []).append(item)
    return {name: defs[0] for name, defs in seen.items() if len(defs) == 1}


def reach(fn: FunctionNode, imports: Mapping[str, str], receivers: rank.Receivers) -> Optional[Reach]:
    """The first collective `fn` makes on every path through it (under tests the same on every rank), or None."""
    own = {a.arg for a in _parameters(fn)[_skipped_self(fn) :]} | _bound_names(fn)

    def uniform(test: ast.expr) -> bool:
        reads = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        return not reads & own and not rank.is_rank_dependent(test, imports, ())

    found = _first_sure_call(fn.body, lambda c: call_kind(c, imports, receivers) is not None, uniform)
    if found is None:
        return None
    call, tests = found
    kind = call_kind(call, imports, receivers) or ""
    text = ast.unparse(call.func)
    made = f"{text}(..., in_order=True)" if kind == "in_order" else f"{text}()"
    return Reach(kind, made, call.lineno, fn.name, when=" and ".join(f"`{t}`" for t in tests))


def makes_collective(fn: FunctionNode, imports: Mapping[str, str], receivers: rank.Receivers) -> bool:
    """Whether `fn` makes a counted call anywhere in its body, on some path or in a loop."""
    calls = (c for stmt in fn.body for c in ast.walk(stmt) if isinstance(c, ast.Call))
    return any(call_kind(c, imports, receivers) is not None for c in calls)


Found = tuple[ast.Call, tuple[str, ...]]  # a sure call, and the uniform tests it is made under


def _first_sure_call(
    body: Sequence[ast.stmt], counts: paths.Counter, uniform: Callable[[ast.expr], bool]
) -> Optional[Found]:
    """The first counted call of a block that every path through it makes (an `if` the same on every rank
    taken as true); None once a statement may leave, unless it is `if <uniform>: return`."""
    for stmt in body:
        found: Optional[Found] = None
        if isinstance(stmt, ast.If) and uniform(stmt.test):
            if not stmt.orelse and len(stmt.body) == 1 and shapes.is_exit(stmt.body[0]):
                continue  # `if not dist.is_initialized(): return`: the rest runs whenever it matters
            inner = _first_sure_call(stmt.body, counts, uniform)
            found = None if inner is None else (inner[0], (ast.unparse(stmt.test), *inner[1]))
        elif isinstance(stmt, (ast.With, ast.AsyncWith, ast.Try)):
            heads = [i.context_expr for i in stmt.items] if not isinstance(stmt, ast.Try) else []
            call = next((c for h in heads for c in _calls(h) if counts(c)), None)
            found = (call, ()) if call is not None else _first_sure_call(stmt.body, counts, uniform)
        elif isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)):
            call = next((c for c in _calls(stmt) if counts(c)), None)
            found = None if call is None else (call, ())
        if found is not None:
            return found
        if _may_leave(stmt):
            return None
    return None


def _parameters(fn: FunctionNode) -> list[ast.arg]:
    args = fn.args
    return [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None]


def _skipped_self(fn: FunctionNode) -> int:
    """1 when the first parameter is `self` or `cls` (its attributes are the object's state, not an argument)."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    return 1 if params and params[0].arg in ("self", "cls") else 0


def _bound_names(fn: FunctionNode) -> set[str]:
    """Every name the function binds itself (its locals), not in nested functions."""
    names: set[str] = set()
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _NESTED))
    return names


def passed_receivers(fn: FunctionNode, call: ast.Call, receivers: rank.Receivers) -> dict[str, str]:
    """The parameters of `fn` this call gives a framework's object: `checkpoint(accelerator, out)` makes
    `def checkpoint(acc, path)`'s `acc` an accelerator inside it."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if isinstance(call.func, ast.Attribute):
        params = params[_skipped_self(fn) :]  # `self.save(acc)`: the first argument is the second parameter
    given = [*zip(params, call.args), *((k.arg, k.value) for k in call.keywords if k.arg)]
    found = {}
    for param, value in given:
        parts = None if isinstance(value, ast.Starred) else rank.dotted(value)
        kind = receivers.get(parts[-1]) if parts else None
        if kind is not None and param not in receivers:
            found[param] = kind
    return found


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    """The calls an expression or simple statement certainly makes: not in lambdas, `x if c else y`, `a and b`
    or comprehensions (whose loop may not turn)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, (ast.IfExp, ast.BoolOp, *_NESTED, *_COMPREHENSIONS)):
            continue
        if isinstance(item, ast.Call):
            yield item
        stack.extend(reversed(list(ast.iter_child_nodes(item))))


def _may_leave(stmt: ast.stmt) -> bool:
    """Whether a statement may end the function (a `return`, `raise` or exit call in it, not in nested defs)."""
    stack: list[ast.AST] = [stmt]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.stmt) and shapes.is_exit(item):
            return True
        stack.extend(c for c in ast.iter_child_nodes(item) if not isinstance(c, _NESTED))
    return False


class Package:
    """The files given together, so that a call imported from one of them can be followed.

    Lazy: a file is read, parsed and summarised (each module-level function's `Reach`) the first time a call
    imported from it is on a rank-dependent path or in a function the balancing rule judges; only its summary
    is kept, not its tree.
    """

    def __init__(self, files: Sequence[str] = ()) -> None:
        self.files = {Path(f).resolve(): f for f in files}
        self.reaches: dict[Path, dict[str, Reach]] = {}

    def summary(self, path: Path) -> dict[str, Reach]:
        """The functions of one given file that certainly make a collective (none if it cannot be read)."""
        if path not in self.reaches:
            self.reaches[path] = {}
            try:
                source = path.read_bytes()
                if mentions_collective(source):
                    self.reaches[path] = _summarise(ast.parse(source), self.files[path])
            except (OSError, SyntaxError, ValueError):
                pass  # the check of that file itself reports it
        return self.reaches[path]

    def lookup(self, importer: str, level: int, module: str, name: str) -> Optional[Reach]:
        """The function `name` of module `module` (relative at `level`) as seen from file `importer`."""
        parts = module.split(".") if module else []
        if level:
            parents = Path(importer).resolve().parents
            if level > len(parents):
                return None  # `from .... import f` above the file system's root: not a file given here
            base = parents[level - 1]
            candidates = [base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")]
            found = [c for c in candidates if c in self.files]
        else:
            tails = tuple(
                "/" + "/".join(t) for t in ([*parts[:-1], parts[-1] + ".py"], [*parts, "__init__.py"]) if parts
            )
            found = [p for p in self.files if p.as_posix().endswith(tails)] if parts else []
        return self.summary(found[0]).get(name) if len(found) == 1 else None


def _summarise(tree: ast.Module, path: str) -> dict[str, Reach]:
    """Each module-level function of a file that certainly makes a collective, by name."""
    imports = rank.import_table(tree)
    receivers = rank.receiver_names(tree, imports)
    found = {}
    for name, fn in functions(tree).items():
        summary = None if "." in name else reach(fn, imports, receivers)
        if summary is not None:
            found[name] = Reach(summary.kind, summary.call, summary.line, summary.function, path, summary.when)
    return found


def imported_function(
    node: ast.expr, tree_imports: Mapping[str, tuple[int, str, str]]
) -> Optional[tuple[int, str, str]]:
    """(level, module, name) of a called name or `module.name` that an import brings in; None otherwise."""
    parts = rank.dotted(node)
    if parts is None or parts[0] not in tree_imports:
        return None
    level, module, name = tree_imports[parts[0]]
    if len(parts) == 1:
        return level, module, name
    return level, ".".join(p for p in (module, name, *parts[1:-1]) if p), parts[-1]


def from_imports(tree: ast.Module) -> dict[str, tuple[int, str, str]]:
    """Local name -> (level, module, name) for each module-level import: `import a.b as m` is (0, "a", "b")."""
    table: dict[str, tuple[int, str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                table[alias.asname or alias.name] = (node.level, node.module or "", alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module, _, last = alias.name.rpartition(".")
                if alias.asname:
                    table[alias.asname] = (0, module, last)
                else:
                    root = alias.name.split(".")[0]
                    table[root] = (0, "", root)
    return table
