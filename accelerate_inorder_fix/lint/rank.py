"""What a single expression means to the lint: a rank-dependent value, a collective call, an in_order call.

Every rule here errs towards silence. A value counts as rank-dependent only when it certainly differs
between ranks: a rank source of `sources` (`accelerator.is_main_process`, `args.local_rank`, `dist.get_rank()`,
`is_master(cfg)`, `os.environ["RANK"]`), a name bound only from such values, and `not`/`and`/`or`/comparisons/
arithmetic over them; a check that is the same on every rank, such as `local_rank != -1` ("are we
distributed?"), does not count. A call counts as a collective only
when its name cannot belong to something else: `gather` and `reduce` only on an accelerator or from
`accelerate`, `barrier` and `broadcast` only from `torch.distributed` or a module known to be it under another
name (`deepspeed.comm`); an unknown module named `dist` is not. AIF003's methods (`save_state`...) count on an
accelerator only: `Accelerator()`, a parameter annotated so, or a name or attribute bound to one.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping, Sequence
from typing import Optional, Union

from .sources import RANK, RANK_NAMES, RANK_PREDICATES, RANK_VARIABLES


LOG_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "log", "warning_once"})
# Names no other common library uses for something that is not a collective: counted on any receiver.
ACCELERATE_ONLY = frozenset({"wait_for_everyone", "gather_for_metrics", "pad_across_processes"})
# Names that are also torch.gather, functools.reduce...: counted on an accelerator or from accelerate only.
ACCELERATE_AMBIGUOUS = frozenset({"gather", "reduce", "gather_object", "broadcast", "broadcast_object_list"})
TORCH_DISTRIBUTED = frozenset(
    {"barrier", "all_reduce", "all_gather", "broadcast", "reduce", "monitored_barrier", "all_gather_object"}
    | {"broadcast_object_list", "all_to_all", "all_to_all_single", "reduce_scatter", "all_gather_into_tensor"}
    | {"reduce_scatter_tensor", "gather", "scatter", "gather_object", "scatter_object_list"}
)
# Modules that are torch.distributed under another name: they define (or re-export) the same collectives.
# deepspeed.comm wraps each torch.distributed collective; nanotron.distributed does `from torch.distributed
# import *`; distributed_c10d is where torch defines them. Nothing else is assumed: an unknown alias is silent.
DISTRIBUTED_ALIASES = (
    "deepspeed.comm.comm",
    "deepspeed.comm",
    "torch.distributed.distributed_c10d",
    "nanotron.distributed",
)
# Accelerator methods that are collective under DeepSpeed or FSDP only (accelerate's Accelerator: save_state
# and load_state call the engine's save/load_checkpoint or save/load_fsdp_model; get_state_dict consolidates
# ZeRO-3 or FSDP shards; save_model calls get_state_dict), with the backends that make each one collective.
STATE_COLLECTIVES = {
    "save_state": ("DeepSpeed", "FSDP"),
    "load_state": ("DeepSpeed", "FSDP"),
    "get_state_dict": ("DeepSpeed ZeRO-3", "FSDP"),
    "save_model": ("DeepSpeed ZeRO-3", "FSDP"),
}
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


def _unalias(name: str) -> str:
    """`deepspeed.comm.barrier` -> `torch.distributed.barrier`: a known alias read as what it stands for."""
    for alias in DISTRIBUTED_ALIASES:
        if name == alias or name.startswith(alias + "."):
            return "torch.distributed" + name[len(alias) :]
    return name


def import_table(tree: Union[ast.Module, Sequence[ast.AST]]) -> dict[str, str]:
    """Local name -> what it was imported as: {"dist": "torch.distributed", "gather": "accelerate.utils.gather"}.

    Takes the module, or all its nodes when the caller already has them (one walk of a large file is enough).
    """
    table = _imports(list(ast.walk(tree)) if isinstance(tree, ast.Module) else tree)
    return {local: _unalias(name) for local, name in table.items()}


def _imports(nodes: Sequence[ast.AST]) -> dict[str, str]:
    """Every import of the module, function-level ones included, as written (before `_unalias`)."""
    table: dict[str, str] = {}
    for node in nodes:
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


def accelerator_names(tree: Union[ast.Module, Sequence[ast.AST]]) -> frozenset[str]:
    """Names and attributes bound to an accelerator in this file, plus the conventional `accelerator`.

    An accelerator is `Accelerator(...)`, a parameter annotated `Accelerator`, or a name already known to be
    one: `self.acc = Accelerator()` and `def __init__(self, acc: Accelerator): self.trainer_acc = acc` make
    `acc` and `trainer_acc` receivers whose `gather`/`save_state` count. A name is matched by its last part.
    """
    nodes = list(ast.walk(tree)) if isinstance(tree, ast.Module) else tree
    names = {"accelerator"}
    names.update(n.arg for n in nodes if isinstance(n, ast.arg) and _names_accelerator_type(n.annotation))
    assigns = [
        n for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Call, ast.Name, ast.Attribute))
    ]
    changed = True
    while changed:
        before = len(names)
        for node in assigns:
            if _is_accelerator_value(node.value, names):
                names.update(n for n in map(_last_part, node.targets) if n)
        changed = len(names) != before
    return frozenset(names)


def _names_accelerator_type(annotation: Optional[ast.expr]) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.rsplit(".", 1)[-1] == "Accelerator"
    return last_name(annotation) == "Accelerator"


def _is_accelerator_value(value: ast.expr, names: set[str]) -> bool:
    if isinstance(value, ast.Call):
        return last_name(value.func) == "Accelerator"
    return _last_part(value) in names


def _last_part(node: ast.expr) -> Optional[str]:
    """`x` for `x`, `acc` for `self.acc`; None for anything else."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return last_name(node)
    return None


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
        if on_accelerator(call, accelerators):
            return name
    return None


def on_accelerator(call: ast.Call, accelerators: frozenset[str]) -> bool:
    """Whether the call is a method of an accelerator: `accelerator.x()`, `self.accelerator.x()`."""
    receiver = dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
    return bool(receiver) and receiver is not None and receiver[-1] in accelerators


def state_collective(call: ast.Call, accelerators: frozenset[str]) -> Optional[str]:
    """`save_state`, `load_state`, `get_state_dict` or `save_model` called on an accelerator, or None."""
    name = last_name(call.func)
    if name in STATE_COLLECTIVES and on_accelerator(call, accelerators):
        return name
    return None


def _is_environ(node: ast.expr, imports: Mapping[str, str]) -> bool:
    return qualified(node, imports) == "os.environ"


def _names_rank_variable(args: list[ast.expr]) -> bool:
    return bool(args) and isinstance(args[0], ast.Constant) and args[0].value in RANK_VARIABLES


def is_rank_source(node: ast.expr, imports: Mapping[str, str]) -> bool:
    """An atom whose value is the rank or depends on it, before any combination."""
    return source_kind(node, imports) is not None


def source_kind(node: ast.expr, imports: Mapping[str, str]) -> Optional[str]:
    """The kind (`sources.RANK`, `ZERO`, `LAST`) of an atom that is a rank source, or None."""
    if isinstance(node, ast.Attribute):
        return RANK_NAMES.get(node.attr)
    if isinstance(node, ast.Subscript):  # os.environ["RANK"]
        return RANK if _is_environ(node.value, imports) and _names_rank_variable([node.slice]) else None
    if not isinstance(node, ast.Call):
        return None
    name = last_name(node.func)
    if name in RANK_PREDICATES:
        return RANK_PREDICATES[name]
    if isinstance(node.func, ast.Attribute) and name == "get" and _is_environ(node.func.value, imports):
        return RANK if _names_rank_variable(node.args) else None
    return RANK if qualified(node.func, imports) == "os.getenv" and _names_rank_variable(node.args) else None


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


def is_rank_dependent(node: ast.expr, imports: Mapping[str, str], tainted: Collection[str]) -> bool:
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
    if isinstance(node, ast.IfExp):
        return _if_exp_is_rank_dependent(node, imports, tainted)
    if isinstance(node, ast.Compare):
        return _compare_is_rank_dependent(node, imports, tainted)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TRANSPARENT_CALLS:
        return len(node.args) == 1 and is_rank_dependent(node.args[0], imports, tainted)
    return False


def rank_side(node: ast.IfExp, imports: Mapping[str, str], tainted: Collection[str]) -> Optional[ast.expr]:
    """`dist.get_rank() if dist.is_initialized() else 0`: the rank side, under a test the same on every rank.

    The other side is a constant: when the test picks it, every rank has the same value and nothing can
    diverge; so the expression is read as its rank side.
    """
    if is_rank_dependent(node.test, imports, tainted):
        return None
    for side, other in ((node.body, node.orelse), (node.orelse, node.body)):
        if isinstance(other, (ast.Constant, ast.UnaryOp)) and is_rank_dependent(side, imports, tainted):
            return side
    return None


def _if_exp_is_rank_dependent(node: ast.IfExp, imports: Mapping[str, str], tainted: Collection[str]) -> bool:
    """`0 if is_main else 1`, `rank if initialized else 0`; not `x if is_main else x`."""
    if is_rank_dependent(node.body, imports, tainted) and is_rank_dependent(node.orelse, imports, tainted):
        return True
    if rank_side(node, imports, tainted) is not None:
        return True
    differ = ast.dump(node.body) != ast.dump(node.orelse)
    return differ and is_rank_dependent(node.test, imports, tainted)


def _compare_is_rank_dependent(node: ast.Compare, imports: Mapping[str, str], tainted: Collection[str]) -> bool:
    if len(node.ops) != 1:
        return False  # chained comparisons: rare, and not worth the risk
    left, right, op = node.left, node.comparators[0], node.ops[0]
    if is_rank_dependent(left, imports, tainted):
        return not _is_presence_check(op, right)
    if is_rank_dependent(right, imports, tainted):
        return not _is_presence_check(_MIRRORED.get(type(op), op), left)
    return False
