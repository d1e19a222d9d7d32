"""Walk one module's syntax tree and find the collectives that only some ranks reach.

A path is rank-dependent inside a branch or loop whose condition is rank-dependent (see `rank`), in a
function decorated to run on some ranks only (`@accelerator.on_main_process`), and in the rest of a block
after `if <rank-dependent>: return` (or `continue`, `break`, `raise`, `sys.exit()`). A `with` block is not a
branch: every rank runs the body of `main_process_first()`. The walk stays inside one function: a call made
on a rank-dependent path to a function that makes a collective is not followed (that would be a guess).

Balanced paths are not findings: `if is_main_process: info(a, in_order=True) else: info(b, in_order=True)`
makes one in_order call on every rank, so a code found on the other side of a branch silences it here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Optional, Union

from . import rank


IN_ORDER, COLLECTIVE = "AIF001", "AIF002"
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
_MAX_CONDITION = 60

FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]


@dataclass(frozen=True)
class Reason:
    """Why the path is rank-dependent: `under` `if rank == 0:` (line 3); codes balanced on the other path."""

    where: str
    condition: str
    line: int
    exempt: frozenset[str] = frozenset()

    def describe(self) -> str:
        return f"{self.where} `{self.condition}` (line {self.line})"


@dataclass(frozen=True)
class Finding:
    """One call that only some ranks reach; line and column as flake8 counts them (both from 1)."""

    line: int
    col: int
    code: str
    message: str
    condition: str
    condition_line: int


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _MAX_CONDITION else text[: _MAX_CONDITION - 3] + "..."


def codes_in(nodes: Iterable[ast.AST], walker: _Walker) -> frozenset[str]:
    """Every code a call somewhere under these nodes would get on a rank-dependent path."""
    found = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Call):
                code = walker.code_of(node)
                if code:
                    found.add(code)
    return frozenset(found)


def exit_word(body: Sequence[ast.stmt]) -> Optional[str]:
    """How this block certainly leaves: "return", "raise", "continue", "break", "sys.exit()"; else None."""
    if not body:
        return None
    last = body[-1]
    words = {ast.Return: "return", ast.Raise: "raise", ast.Continue: "continue", ast.Break: "break"}
    for kind, word in words.items():
        if isinstance(last, kind):
            return word
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        name = ".".join(rank.dotted(last.value.func) or [])
        if name in _EXIT_CALLS:
            return f"{name}()"
    return None


def _scope_nodes(body: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """Every node of one scope, not those of the functions, classes and comprehensions it defines."""
    stack = list(body)
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    comprehensions = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, nested + comprehensions):
            continue
        stack.extend(ast.iter_child_nodes(node))


def rank_names(
    body: Sequence[ast.stmt], params: Iterable[str], inherited: frozenset[str], walker: _Walker
) -> frozenset[str]:
    """Names of this scope bound only by `name = <rank-dependent value>` (plus the enclosing scope's, unless rebound)."""
    assigned: dict[str, list[ast.expr]] = {}
    other = set(params)
    for node in _scope_nodes(body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            other.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            other.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other.add(node.name)
        other.update(_other_stores(node))
    tainted = inherited - other - set(assigned)
    changed = True
    while changed:  # a = dist.get_rank(); b = a == 0: b is rank-dependent once a is known to be
        changed = False
        for name, values in assigned.items():
            if name not in tainted and name not in other and all(walker.rank_dependent(v, tainted) for v in values):
                tainted = tainted | {name}
                changed = True
    return tainted


def _other_stores(node: ast.AST) -> Iterator[str]:
    """Names bound by anything but a plain `name = value`: loop targets, unpacking, `with ... as`, `+=`, `:=`."""
    if isinstance(node, ast.Assign):
        targets: list[ast.expr] = [t for t in node.targets if not isinstance(t, ast.Name)]
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.AugAssign)):
        targets = [node.target]
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


def _parameters(node: Union[FunctionNode, ast.Lambda]) -> Iterator[str]:
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            yield arg.arg


class _Walker:
    """One module's walk: the file's imports and accelerator names, and the findings so far."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports = rank.import_table(tree)
        self.accelerators = rank.accelerator_names(tree)
        self.findings: list[Finding] = []

    def rank_dependent(self, node: ast.expr, tainted: frozenset[str]) -> bool:
        return rank.is_rank_dependent(node, self.imports, tainted)

    def code_of(self, call: ast.Call) -> Optional[str]:
        if rank.is_in_order_call(call):
            return IN_ORDER
        if rank.collective_name(call, self.imports, self.accelerators):
            return COLLECTIVE
        return None

    def block(self, body: Sequence[ast.stmt], reason: Optional[Reason], tainted: frozenset[str]) -> None:
        for stmt in body:
            self.statement(stmt, reason, tainted)
            reason = self.after(stmt, reason, tainted) or reason

    def statement(self, stmt: ast.stmt, reason: Optional[Reason], tainted: frozenset[str]) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(stmt, reason, tainted)
        elif isinstance(stmt, ast.If):
            self.branch(stmt, reason, tainted)
        elif isinstance(stmt, (ast.While, ast.For, ast.AsyncFor)):
            self.loop(stmt, reason, tainted)
        else:
            self.fields(stmt, reason, tainted)

    def fields(self, node: ast.AST, reason: Optional[Reason], tainted: frozenset[str]) -> None:
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

    def function(self, node: FunctionNode, reason: Optional[Reason], tainted: frozenset[str]) -> None:
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.scan(expr, reason, tainted)
        inner: Optional[Reason] = None  # a function body runs where it is called, not where it is defined
        for decorator in node.decorator_list:
            if rank.last_name(decorator) in rank.RANK_DECORATORS:
                inner = Reason("in a function decorated", f"@{_text(decorator)}", decorator.lineno)
        self.block(node.body, inner, rank_names(node.body, _parameters(node), tainted, self))

    def condition(self, test: ast.expr, reason: Optional[Reason], tainted: frozenset[str]) -> Optional[str]:
        """The test's text when it is rank-dependent (its own calls are checked on the path that evaluates it)."""
        self.scan(test, reason, tainted)
        return self.condition_text(test, tainted) if self.rank_dependent(test, tainted) else None

    def condition_text(self, test: ast.expr, tainted: frozenset[str]) -> str:
        """A long `a and accelerator.is_main_process and b` reads `... and accelerator.is_main_process and ...`."""
        if len(ast.unparse(test)) <= _MAX_CONDITION or not isinstance(test, ast.BoolOp):
            return _text(test)
        parts = [ast.unparse(v) if self.rank_dependent(v, tainted) else "..." for v in test.values]
        kept = [p for i, p in enumerate(parts) if p != "..." or i == 0 or parts[i - 1] != "..."]
        joined = (" and " if isinstance(test.op, ast.And) else " or ").join(kept)
        return joined if len(joined) <= _MAX_CONDITION else joined[: _MAX_CONDITION - 3] + "..."

    def branch(self, node: ast.If, reason: Optional[Reason], tainted: frozenset[str]) -> None:
        cond = self.condition(node.test, reason, tainted)
        if cond is None:
            self.block(node.body, reason, tainted)
            self.block(node.orelse, reason, tainted)
            return
        outer = reason.exempt if reason else frozenset()
        body_codes, else_codes = codes_in(node.body, self), codes_in(node.orelse, self)
        self.block(node.body, Reason("under", f"if {cond}:", node.lineno, else_codes | outer), tainted)
        self.block(node.orelse, Reason("in the else of", f"if {cond}:", node.lineno, body_codes | outer), tainted)

    def loop(
        self, node: Union[ast.While, ast.For, ast.AsyncFor], reason: Optional[Reason], tainted: frozenset[str]
    ) -> None:
        if isinstance(node, ast.While):
            cond = self.condition(node.test, reason, tainted)
            text = f"while {cond}:"
        else:
            self.scan(node.target, reason, tainted)
            cond = _text(node.iter) if self._rank_range(node.iter, tainted) else None
            self.scan(node.iter, reason, tainted)
            text = f"for {_text(node.target)} in {cond}:"
        inner = reason
        if cond is not None:
            inner = Reason("under", text, node.lineno, reason.exempt if reason else frozenset())
        self.block(node.body, inner, tainted)
        self.block(node.orelse, reason, tainted)

    def _rank_range(self, node: ast.expr, tainted: frozenset[str]) -> bool:
        """`range(accelerator.process_index)`: as many turns as the rank says."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"):
            return False
        return any(self.rank_dependent(arg, tainted) for arg in node.args)

    def after(self, stmt: ast.stmt, reason: Optional[Reason], tainted: frozenset[str]) -> Optional[Reason]:
        """The reason for the rest of the block after `if <rank-dependent>: return`, or None."""
        if not isinstance(stmt, ast.If) or not self.rank_dependent(stmt.test, tainted):
            return None
        body_exit, else_exit = exit_word(stmt.body), exit_word(stmt.orelse)
        if (body_exit is None) == (else_exit is None):
            return None  # neither branch leaves, or both do (the rest is unreachable)
        cond = self.condition_text(stmt.test, tainted)
        text = f"if {cond}: {body_exit}" if body_exit else f"if {cond}: ... else: {else_exit}"
        exempt = codes_in(stmt.body if body_exit else stmt.orelse, self)
        return Reason("after", text, stmt.lineno, exempt | (reason.exempt if reason else frozenset()))

    def scan(self, expr: ast.expr, reason: Optional[Reason], tainted: frozenset[str]) -> None:
        """Check every call in an expression (iteratively: long `a + b + ...` chains are deep trees)."""
        stack: list[tuple[ast.AST, Optional[Reason]]] = [(expr, reason)]
        while stack:
            node, why = stack.pop()
            if isinstance(node, ast.Lambda):
                continue  # runs where it is called
            if isinstance(node, ast.IfExp) and self.rank_dependent(node.test, tainted):
                outer = why.exempt if why else frozenset()
                text = f"... if {_text(node.test)} else ..."
                stack.append((node.test, why))
                stack.append((node.body, Reason("under", text, node.lineno, codes_in([node.orelse], self) | outer)))
                stack.append(
                    (node.orelse, Reason("in the else of", text, node.lineno, codes_in([node.body], self) | outer))
                )
                continue
            if isinstance(node, ast.Call) and why is not None:
                self.report(node, why)
            stack.extend((child, why) for child in ast.iter_child_nodes(node))

    def report(self, call: ast.Call, reason: Reason) -> None:
        code = self.code_of(call)
        if code is None or code in reason.exempt:
            return
        callee = _text(call.func)
        if code == IN_ORDER:
            what = f"`{callee}(..., in_order=True)` is an in_order log call"
        else:
            what = f"`{callee}()` is a collective"
        message = f"{what} on a rank-dependent path: {reason.describe()}; every rank must reach it"
        finding = Finding(call.lineno, call.col_offset + 1, code, message, reason.condition, reason.line)
        self.findings.append(finding)


def check_tree(tree: ast.Module) -> list[Finding]:
    """The findings of one parsed module, in source order."""
    walker = _Walker(tree)
    walker.block(tree.body, None, rank_names(tree.body, (), frozenset(), walker))
    return sorted(walker.findings, key=lambda f: (f.line, f.col, f.code))
