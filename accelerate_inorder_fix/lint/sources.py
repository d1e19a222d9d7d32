"""The rank sources: the one list of names the lint reads as a rank or a main-process flag, and what each means.

A rank source is where a value that differs between ranks enters the code. Every list lives here, so
docs/lint.md can name them all and a new one is one line. Each name says what its value is for rank r of a
job (`paths` evaluates conditions with it): the rank itself (`RANK`), a test for rank 0 (`ZERO`) or for the
last rank (`LAST`).

- `RANK_NAMES`: an attribute of any object (`self.rank`, `args.local_rank`, `trainer.data_parallel_rank`,
  `accelerator.is_main_process`, `state.is_world_process_zero`); also a parameter, or a name bound by tuple unpacking from a call, with
  this name (`def finish(..., is_main_process: bool)`, `rank, world = init_dist()`).
- `RANK_PREDICATES`: a call to a function or method of this name (`dist.get_rank()`,
  `distributed_utils.is_master(cfg)`, `is_rank_0()`).
- `ARGS_ATTRIBUTES`: an attribute of the training arguments (`args.should_save`), on an object so named.
- `RANK_VARIABLES`: the environment variables (`os.environ["RANK"]`, `os.getenv("LOCAL_RANK")`).
- `RANK_DECORATORS`: a function decorated with one of these runs on some ranks only (`@master_only`: mmengine's).

A name bound only from rank-dependent values (`RANK = lm.rank`, `is_main = rank == 0`) is one too: the walker
follows assignment, tuple unpacking and aliasing inside a function and from the module into its functions.
A name that merely contains one of these (`self.ranking`, `lora_rank`) is not one.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional


RANK, ZERO, LAST = "rank", "zero", "last"

RANK_NAMES = {
    **dict.fromkeys(("rank", "global_rank", "local_rank", "data_parallel_rank"), RANK),
    **dict.fromkeys(("process_index", "local_process_index"), RANK),  # accelerate's
    **dict.fromkeys(("is_main_process", "is_local_main_process", "is_main", "is_master", "is_local_master"), ZERO),
    **dict.fromkeys(("is_rank_0", "is_rank_zero", "is_global_zero"), ZERO),  # is_global_zero: Lightning's
    **dict.fromkeys(("is_world_process_zero", "is_local_process_zero"), ZERO),  # transformers' TrainerState
    "is_last_process": LAST,
}
RANK_PREDICATES = {
    **dict.fromkeys(("get_rank", "get_local_rank", "get_global_rank"), RANK),
    **dict.fromkeys(("is_world_process_zero", "is_local_process_zero"), ZERO),  # Transformers' Trainer
    **dict.fromkeys(("is_main_process", "is_local_main_process", "is_master", "is_local_master"), ZERO),
    **dict.fromkeys(("is_rank_0", "is_rank_zero"), ZERO),
}
RANK_PREDICATES.update({"get_fs_local_rank": RANK, "is_last_rank": LAST})  # OLMo's, Megatron's
# An attribute of the training arguments (`args.should_save`, `training_args.should_save`: transformers'
# `TrainingArguments`, true on the process that saves), read on an object named `args` or `..._args` only.
ARGS_ATTRIBUTES = {"should_save": ZERO}
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK"})
RANK_DECORATORS = frozenset(
    {"on_main_process", "on_local_main_process", "on_process", "on_last_process", "rank_zero_only", "master_only"}
)
# Every identifier a rank-dependent value starts from: a file that spells none of them has no finding.
# (`rank` covers every name that contains it; the decorators and `is_main`/`is_master` need their own.)
_WORDS = sorted({*RANK_NAMES, *RANK_PREDICATES, *ARGS_ATTRIBUTES, *RANK_VARIABLES, *RANK_DECORATORS})
_MENTIONS_RANK = re.compile("|".join(_WORDS).encode())


def mentions_rank(source: bytes) -> bool:
    """Whether the source spells a rank source at all (a fast test: most files of a codebase do not)."""
    return _MENTIONS_RANK.search(source) is not None


def value_for(kind: str, rank: int, world: int) -> object:
    """What a source of this kind is on rank `rank` of `world`: the rank, or whether it is the first or last."""
    if kind == ZERO:
        return rank == 0
    if kind == LAST:
        return rank == world - 1
    return rank


@dataclass(frozen=True)
class Binding:
    """A name that holds a rank-dependent value: its one value, if it has exactly one, and where it came from.

    `value` is what `paths` evaluates for each rank; a parameter or an unpacked name is its own value (an
    `ast.Name` of itself, read by its name's kind). `origin` is the sentence a finding quotes, so a user can
    judge at a glance why the condition differs between ranks.
    """

    value: Optional[ast.expr]
    origin: str


def named_source(name: str, origin: str) -> Binding:
    """A parameter or unpacked name that is a rank source by its name alone."""
    return Binding(ast.Name(id=name, ctx=ast.Load()), origin)


def is_named_source(binding: Binding, name: str) -> bool:
    """Whether the binding is a name that stands for itself (`named_source`), valued by its name's kind."""
    value = binding.value
    return isinstance(value, ast.Name) and value.id == name and name in RANK_NAMES


def resolved(value: ast.expr, names: Mapping[str, Binding], depth: int = 0) -> ast.expr:
    """`value` with its scope's rank names replaced by what they hold, so that it reads the same in another
    scope: `rank == 0`, `rank` a parameter, becomes `_.rank == 0` (an attribute named for the rank)."""

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            binding = names.get(node.id)
            if binding is None:
                return node
            if is_named_source(binding, node.id):
                return ast.Attribute(ast.Name("_", ast.Load()), node.id, ast.Load())
            if binding.value is None or depth > 5:
                return node
            return resolved(binding.value, names, depth + 1)

    result: ast.expr = Substitute().visit(copy.deepcopy(value))
    return result


def describe_atom(node: ast.expr) -> str:
    """Why an atom is a rank source, for a finding's message."""
    text = ast.unparse(node)
    if isinstance(node, ast.Attribute):
        return f"`{text}` is a rank attribute"
    if isinstance(node, ast.Subscript) or isinstance(node, ast.Call) and _last(node.func) in ("get", "getenv"):
        return f"`{text}` reads the rank's environment variable"
    return f"`{text}` is a rank predicate"


def _last(node: ast.expr) -> Optional[str]:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
