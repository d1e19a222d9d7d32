"""What a single expression means to the lint: a rank-dependent value, a collective call, an in_order call.

Every rule here errs towards silence. A value counts as rank-dependent only when it certainly differs
between ranks: a rank source of `sources` (`accelerator.is_main_process`, `args.local_rank`, `dist.get_rank()`,
`is_master(cfg)`, `os.environ["RANK"]`), a name bound only from such values, and `not`/`and`/`or`/comparisons/
arithmetic over them; a check that is the same on every rank, such as `local_rank != -1` ("are we
distributed?"), does not count. A call counts as a collective only
when its name cannot belong to something else: `gather` and `reduce` only on an accelerator or from
`accelerate`, `barrier` and `broadcast` only from `torch.distributed` or a module known to be it under another
name (`deepspeed.comm`, `mmengine.dist`); an unknown module named `dist` is not. A method counts on a receiver
of its framework only (`RECEIVERS`): `accelerator.save_state`, `fabric.barrier`, `strategy.all_reduce`,
`model_engine.save_checkpoint`, `trainer.save_model`; a receiver is one by its conventional name, by being built
(`Accelerator()`, `Fabric()`, `DeepspeedStrategy()`, the engine `deepspeed.initialize()` returns first), by a
parameter's annotation, or by being bound to one.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Optional, Union

from .sources import ARGS_ATTRIBUTES, RANK, RANK_NAMES, RANK_PREDICATES, RANK_VARIABLES


LOG_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "log", "warning_once"})
# Names no other common library uses for something that is not a collective: counted on any receiver.
ACCELERATE_ONLY = frozenset({"wait_for_everyone", "gather_for_metrics", "pad_across_processes"})
# Names that are also torch.gather, functools.reduce...: counted on an accelerator or from accelerate only.
ACCELERATE_AMBIGUOUS = frozenset({"gather", "reduce", "gather_object", "broadcast", "broadcast_object_list"})
TORCH_DISTRIBUTED = frozenset(
    {"barrier", "all_reduce", "all_gather", "broadcast", "reduce", "monitored_barrier", "all_gather_object"}
    | {"broadcast_object_list", "all_to_all", "all_to_all_single", "reduce_scatter", "all_gather_into_tensor"}
    | {"reduce_scatter_tensor", "gather", "scatter", "gather_object", "scatter_object_list"}
    | {"collect_results", "all_reduce_dict", "all_reduce_params", "sync_random_seed"}  # mmengine.dist's own
)
# Modules that are torch.distributed under another name: they define (or re-export) the same collectives.
# deepspeed.comm wraps each torch.distributed collective; nanotron.distributed does `from torch.distributed
# import *`; distributed_c10d is where torch defines them. Nothing else is assumed: an unknown alias is silent.
DISTRIBUTED_ALIASES = (
    "deepspeed.comm.comm",
    "deepspeed.comm",
    "torch.distributed.distributed_c10d",
    "nanotron.distributed",
    "mmengine.dist",
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
# The frameworks' objects whose methods every rank must call, by framework: its conventional receiver names,
# the class names that build one, and its collective methods (AIF002) and methods collective under DeepSpeed
# ZeRO-3 or FSDP only (AIF003, `STATE_COLLECTIVES`). Lightning's `Fabric` and `Strategy` (barrier...), OpenRLHF's
# strategy (`all_reduce`, `save_model`: it gathers ZeRO-3 shards), the DeepSpeed engine, transformers' `Trainer`.
ACCELERATOR = "accelerator"
RECEIVERS: dict[str, tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]] = {
    ACCELERATOR: (
        frozenset({"accelerator"}),
        frozenset({"Accelerator"}),
        frozenset({*ACCELERATE_ONLY, *ACCELERATE_AMBIGUOUS}),
        frozenset(STATE_COLLECTIVES),
    ),
    "fabric": (
        frozenset({"fabric"}),
        frozenset({"Fabric"}),
        frozenset({"barrier", "all_reduce", "all_gather", "broadcast", "save", "load"}),
        frozenset(),
    ),
    "strategy": (
        frozenset({"strategy"}),
        frozenset({"Strategy"}),  # a class name ending so: DeepspeedStrategy, FSDPStrategy
        frozenset(
            {"barrier", "broadcast", "reduce", "all_reduce", "all_gather", "save_model", "save_ckpt", "load_ckpt"}
        ),
        frozenset(),
    ),
    "engine": (
        frozenset({"model_engine"}),
        frozenset({"DeepSpeedEngine"}),
        frozenset({"save_checkpoint", "load_checkpoint"}),
        frozenset(),
    ),
    "trainer": (frozenset({"trainer"}), frozenset({"Trainer"}), frozenset(), frozenset({"save_model"})),
}
Receivers = Mapping[str, str]  # a receiver's (last) name -> its framework, a key of RECEIVERS
_ENGINE_BUILDERS = frozenset({"deepspeed.initialize"})  # `model_engine, optimizer, _, _ = deepspeed.initialize()`

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


def relative_imports(nodes: Sequence[ast.AST]) -> frozenset[str]:
    """The names a module imports relatively (`from .worker import loop`): the user's own code."""
    return frozenset(
        alias.asname or alias.name
        for node in nodes
        if isinstance(node, ast.ImportFrom) and node.level
        for alias in node.names
    )


def qualified(node: ast.expr, imports: Mapping[str, str]) -> Optional[str]:
    """The imported name a name chain stands for (`dist.barrier` -> "torch.distributed.barrier"), if any."""
    parts = dotted(node)
    if parts is None or parts[0] not in imports:
        return None
    return ".".join([imports[parts[0]], *parts[1:]])


def receiver_names(tree: Union[ast.Module, Sequence[ast.AST]], imports: Mapping[str, str] = {}) -> Receivers:
    """Names and attributes bound to a framework's object in this file, plus the conventional names: name -> framework.

    A receiver is built (`Accelerator(...)`, `L.Fabric(...)`, `DeepspeedStrategy(...)`), a parameter annotated
    with its class, the first name `deepspeed.initialize(...)` returns (the engine), or a name already known to
    be one: `self.acc = Accelerator()` and `def __init__(self, acc: Accelerator): self.trainer_acc = acc` make
    `acc` and `trainer_acc` accelerators. A name is matched by its last part.
    """
    nodes = list(ast.walk(tree)) if isinstance(tree, ast.Module) else tree
    names = {name: kind for kind, (conventional, *_) in RECEIVERS.items() for name in conventional}
    for node in nodes:
        if isinstance(node, ast.arg) and _built_kind(node.annotation) is not None:
            names[node.arg] = _built_kind(node.annotation) or ""
    assigns = [
        n for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Call, ast.Name, ast.Attribute))
    ]
    changed = True
    while changed:
        before = len(names)
        for node in assigns:
            for target, kind in _bound_receivers(node, names, imports):
                names.setdefault(target, kind)
        changed = len(names) != before
    return names


def _bound_receivers(node: ast.Assign, names: Receivers, imports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(name, framework) for each target this assignment binds to a receiver."""
    value = node.value
    if isinstance(value, ast.Call):
        if (
            ".".join(dotted(value.func) or []) in _ENGINE_BUILDERS
            or qualified(value.func, imports) in _ENGINE_BUILDERS
        ):
            first = [t.elts[0] for t in node.targets if isinstance(t, (ast.Tuple, ast.List)) and t.elts]
            yield from ((n, "engine") for n in map(_last_part, first) if n)
            return
        kind = _built_kind(value.func)
    else:
        kind = names.get(_last_part(value) or "")
    if kind is not None:
        yield from ((n, kind) for n in map(_last_part, node.targets) if n)


def _built_kind(node: Optional[ast.expr]) -> Optional[str]:
    """The framework whose class a constructor call or annotation names (`Accelerator`, `"Accelerator"`)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        name: Optional[str] = node.value.rsplit(".", 1)[-1]
    else:
        name = last_name(node)
    if not name:
        return None
    for kind, (_, classes, *_) in RECEIVERS.items():
        if name in classes or kind == "strategy" and name.endswith("Strategy"):
            return kind
    return None


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


def collective_name(call: ast.Call, imports: Mapping[str, str], receivers: Receivers) -> Optional[str]:
    """The collective this call certainly is (`wait_for_everyone`, `dist.barrier`, `fabric.barrier`...), or None."""
    full = qualified(call.func, imports) or ""
    name = full.rsplit(".", 1)[-1] if full else last_name(call.func)  # `gather as g`: g is gather
    if name is None:
        return None
    if name in ACCELERATE_ONLY:
        return name
    if name in TORCH_DISTRIBUTED and full.startswith("torch.distributed."):
        return f"torch.distributed.{name}"
    if name in ACCELERATE_AMBIGUOUS and full.startswith("accelerate."):
        return name
    kind = receiver_of(call, receivers)
    if kind is not None and name in RECEIVERS[kind][2]:
        return name if kind == ACCELERATOR else f"{kind}.{name}"
    return None


def receiver_of(call: ast.Call, receivers: Receivers) -> Optional[str]:
    """The framework of the object whose method this is: `accelerator.x()`, `self.fabric.x()`, else None."""
    receiver = dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
    return receivers.get(receiver[-1]) if receiver else None


def state_collective(call: ast.Call, receivers: Receivers) -> Optional[str]:
    """A method collective under DeepSpeed or FSDP only (`accelerator.save_state`, `trainer.save_model`), or None."""
    name = last_name(call.func)
    kind = receiver_of(call, receivers)
    return name if kind is not None and name in RECEIVERS[kind][3] else None


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
        if node.attr in ARGS_ATTRIBUTES:
            owner = last_name(node.value) or ""
            return ARGS_ATTRIBUTES[node.attr] if owner == "args" or owner.endswith("_args") else None
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


def held_name(node: ast.expr) -> Optional[str]:
    """The key a rank-dependent name or `self` attribute is held under: `rank`, `self._is_rank_zero`; else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def is_rank_dependent(node: ast.expr, imports: Mapping[str, str], tainted: Collection[str]) -> bool:
    """Whether this expression's value certainly differs between the ranks of one job."""
    held = held_name(node)
    if held is not None and held in tainted:
        return True
    if isinstance(node, ast.Name):
        return False
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
