"""The statement shapes both the walker and the path balancer read: how a block leaves, and a `range` call.

`walker` words a finding with them ("after `if rank != 0: return`"); `paths` runs the ranks through them. One
definition, so the two never disagree on what leaves a function.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Optional

from . import rank


EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
_LEAVING_WORDS = {ast.Return: "return", ast.Raise: "raise", ast.Continue: "continue", ast.Break: "break"}


def exit_call(stmt: ast.stmt) -> Optional[str]:
    """The dotted name of a `sys.exit()`-like call that is the whole statement, else None."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        name = ".".join(rank.dotted(stmt.value.func) or [])
        return name if name in EXIT_CALLS else None
    return None


def is_exit(stmt: ast.stmt) -> bool:
    """`return`, `raise` or `sys.exit()`-like: the rank leaves the function."""
    return isinstance(stmt, (ast.Return, ast.Raise)) or exit_call(stmt) is not None


def exit_word(body: Sequence[ast.stmt]) -> Optional[str]:
    """How this block certainly leaves: "return", "raise", "continue", "break", "sys.exit()"; else None."""
    if not body:
        return None
    last = body[-1]
    for kind, word in _LEAVING_WORDS.items():
        if isinstance(last, kind):
            return word
    name = exit_call(last)
    return None if name is None else f"{name}()"


def range_arguments(node: ast.expr) -> Sequence[ast.expr]:
    """The arguments of a `range(...)` call (`range(accelerator.process_index)`), else none."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        return node.args
    return ()
