"""What a single expression means to the lint: a rank-dependent value, a collective call, an in_order call.

Every rule here errs towards silence. A value counts as rank-dependent only when it certainly differs
between ranks (`accelerator.is_main_process`, `dist.get_rank()`, `os.environ["RANK"]`, a name assigned only
from such values, and `not`/`and`/`or`/comparisons/arithmetic over them); a check that is the same on every
rank, such as `local_rank != -1` ("are we distributed?"), does not count. A call counts as a collective only
when its name cannot belong to something else: `gather` and `reduce` only on an accelerator or from
`accelerate`, `barrier` and `broadcast` only from `torch.distributed`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Optional


RANK_ATTRIBUTES = frozenset(
    {"is_main_process", "is_local_main_process", "is_last_process", "process_index", "local_process_index"}
)
RANK_FUNCTIONS = frozenset({"get_rank", "get_local_rank"})
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK"})
RANK_DECORATORS = frozenset(
    {"on_main_process", "on_local_main_process", "on_process", "on_last_process", "rank_zero_only"}
)
LOG_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "log", "warning_once"})
# Names no other common library uses for something that is not a collective: counted on any receiver.
ACCELERATE_ONLY = frozenset({"wait_for_everyone", "gather_for_metrics", "pad_across_processes"})
# Names that are also torch.gather, functools.reduce...: counted on an accelerator or from accelerate only.
ACCELERATE_AMBIGUOUS = frozenset({"gather", "reduce"})
TORCH_DISTRIBUTED = frozenset({"barrier", "all_reduce", "all_gather", "broadcast", "reduce", "monitored_barrier"})
# Wrappers that keep a value's rank-dependence: int(os.environ["RANK"]) is as rank-dependent as the string.
_TRANSPARENT_CALLS = frozenset({"int", "bool", "str"})


def dotted(node: ast.expr) -> Optional[list[str]]:
    """`a.b.c` as ["a", "b", "c"]; None for anything that is not a plain name chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def last_name(node: ast.expr) -> Optional[str]:
    """The name a call or decorator ends in: `on_process` for `accelerator.on_process(1)`."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def import_table(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it was imported as: {"dist": "torch.distributed", "gather": "accelerate.utils.gather"}."""
    table: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    table[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    table[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                table[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return table


def qualified(node: ast.expr, imports: Mapping[str, str]) -> Optional[str]:
    """The imported name a name chain stands for (`dist.barrier` -> "torch.distributed.barrier"), if any."""
    parts = dotted(node)
    if parts is None or parts[0] not in imports:
        return None
    return ".".join([imports[parts[0]], *parts[1:]])


def accelerator_names(tree: ast.Module) -> frozenset[str]:
    """Names bound to `Accelerator(...)` in this file, plus the conventional `accelerator`."""
    names = {"accelerator"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if last_name(node.value.func) == "Accelerator":
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def is_in_order_call(call: ast.Call) -> bool:
    """`<adapter>.info(..., in_order=True)` with a literal True (a variable could be False)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr in LOG_METHODS):
        return False
    return any(
        k.arg == "in_order" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords
    )


def collective_name(call: ast.Call, imports: Mapping[str, str], accelerators: frozenset[str]) -> Optional[str]:
    """The collective this call certainly is (`wait_for_everyone`, `dist.barrier`...), or None."""
    full = qualified(call.func, imports) or ""
    name = full.rsplit(".", 1)[-1] if full else last_name(call.func)  # `gather as g`: g is gather
    if name is None:
        return None
    if name in ACCELERATE_ONLY:
        return name
    if name in TORCH_DISTRIBUTED and full.startswith("torch.distributed."):
        return f"torch.distributed.{name}"
    if name in ACCELERATE_AMBIGUOUS:
        if full.startswith("accelerate."):
            return name
        receiver = dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
        if receiver and receiver[-1] in accelerators:
            return name
    return None


def _is_environ(node: ast.expr, imports: Mapping[str, str]) -> bool:
    return qualified(node, imports) == "os.environ"


def _names_rank_variable(args: list[ast.expr]) -> bool:
    return bool(args) and isinstance(args[0], ast.Constant) and args[0].value in RANK_VARIABLES


def is_rank_source(node: ast.expr, imports: Mapping[str, str]) -> bool:
    """An atom whose value is the rank or depends on it, before any combination."""
    if isinstance(node, ast.Attribute):
        return node.attr in RANK_ATTRIBUTES
    if isinstance(node, ast.Subscript):  # os.environ["RANK"]
        return _is_environ(node.value, imports) and _names_rank_variable([node.slice])
    if not isinstance(node, ast.Call):
        return False
    name = last_name(node.func)
    if name in RANK_FUNCTIONS:
        return True
    if isinstance(node.func, ast.Attribute) and name == "get" and _is_environ(node.func.value, imports):
        return _names_rank_variable(node.args)
    return qualified(node.func, imports) == "os.getenv" and _names_rank_variable(node.args)


# `0 <= rank` reads as `rank >= 0`: the operator seen from the rank's side.
_MIRRORED: dict[type[ast.cmpop], ast.cmpop] = {
    ast.Lt: ast.Gt(),
    ast.Gt: ast.Lt(),
    ast.LtE: ast.GtE(),
    ast.GtE: ast.LtE(),
}


def _is_presence_check(op: ast.cmpop, constant: ast.expr) -> bool:
    """`rank != -1`, `rank is None`, `rank >= 0`: the same answer on every rank of a job."""
    if isinstance(constant, ast.UnaryOp) and isinstance(constant.op, ast.USub):  # -1 is USub(1) in the tree
        inner = constant.operand
        if not (isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float))):
            return False
        return not isinstance(inner.value, bool) and inner.value > 0
    if not isinstance(constant, ast.Constant):
        return False
    value = constant.value
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value < 0 or (value == 0 and isinstance(op, (ast.GtE, ast.Lt)))


def is_rank_dependent(node: ast.expr, imports: Mapping[str, str], tainted: frozenset[str]) -> bool:
    """Whether this expression's value certainly differs between the ranks of one job."""
    if isinstance(node, ast.Name):
        return node.id in tainted
    if is_rank_source(node, imports):
        return True
    if isinstance(node, ast.UnaryOp):
        return is_rank_dependent(node.operand, imports, tainted)
    if isinstance(node, ast.BoolOp):
        return any(is_rank_dependent(v, imports, tainted) for v in node.values)
    if isinstance(node, ast.BinOp):
        return is_rank_dependent(node.left, imports, tainted) or is_rank_dependent(node.right, imports, tainted)
    if isinstance(node, ast.IfExp):  # `0 if is_main else 1`; not `x if is_main else x`
        if is_rank_dependent(node.body, imports, tainted) and is_rank_dependent(node.orelse, imports, tainted):
            return True
        differ = ast.dump(node.body) != ast.dump(node.orelse)
        return differ and is_rank_dependent(node.test, imports, tainted)
    if isinstance(node, ast.Compare):
        return _compare_is_rank_dependent(node, imports, tainted)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TRANSPARENT_CALLS:
        return len(node.args) == 1 and is_rank_dependent(node.args[0], imports, tainted)
    return False


def _compare_is_rank_dependent(node: ast.Compare, imports: Mapping[str, str], tainted: frozenset[str]) -> bool:
    if len(node.ops) != 1:
        return False  # chained comparisons: rare, and not worth the risk
    left, right, op = node.left, node.comparators[0], node.ops[0]
    if is_rank_dependent(left, imports, tainted):
        return not _is_presence_check(op, right)
    if is_rank_dependent(right, imports, tainted):
        return not _is_presence_check(_MIRRORED.get(type(op), op), left)
    return False
