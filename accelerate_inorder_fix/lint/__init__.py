"""`accelerate-inorder-fix lint`: find, before the job runs, the collectives that only some ranks reach.

The fix makes every in_order call safe when every rank makes it. A call inside `if accelerator.is_main_process:`
is still the user's hang: the other ranks wait at it forever. This reads source with `ast` only (it imports
nothing from the files it checks, nor torch or accelerate) and reports, in flake8's format:

    AIF001  an in_order log call (`logger.info(msg, in_order=True)`) on a rank-dependent path
    AIF002  a known collective (`wait_for_everyone`, `gather`, `dist.barrier`...) on a rank-dependent path
    AIF003  a call collective under DeepSpeed or FSDP only (`accelerator.save_state()`...) on such a path

A call on a rank-dependent path is reported only when the paths through its function are unbalanced for
its kind (the balancing rule, in `paths`): one finding per rank-dependent branch, saying how the ranks'
counts differ. A collective is accelerate's, `torch.distributed`'s (or a module that is it under another name:
`deepspeed.comm`, `mmengine.dist`), or a method of a framework's object (`rank.RECEIVERS`: the accelerator,
Lightning Fabric, a Lightning or OpenRLHF strategy, the DeepSpeed engine, transformers' `Trainer`).

`sources` lists the rank sources (every name read as a rank or a main-process flag, in one place), `rank` says
what a rank-dependent value and a collective are, `helpers` which of the user's own functions certainly make a
collective (a call to one counts as it: one call deep), `walker` which paths are rank-dependent, `paths`
whether the ranks' paths balance (both read `shapes`: how a block leaves, a `range` call), `report` reads files
and prints; `flake8_plugin` serves the same checks to `flake8 --select AIF`.
"""

from .report import EXIT_CLEAN, EXIT_FOUND, EXIT_UNREADABLE, FORMATS, check_file, is_selected, parse_codes, run
from .walker import CODES, COLLECTIVE, IN_ORDER, STATE, Finding, check_tree


__all__ = [
    "CODES",
    "COLLECTIVE",
    "EXIT_CLEAN",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "FORMATS",
    "IN_ORDER",
    "STATE",
    "Finding",
    "check_file",
    "check_tree",
    "is_selected",
    "parse_codes",
    "run",
]
