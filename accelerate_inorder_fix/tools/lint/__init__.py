"""`accelerate-inorder-fix lint`: find, before the job runs, the collectives that only some ranks reach.

The fix makes every in_order call safe when every rank makes it. A call inside `if accelerator.is_main_process:`
is still the user's hang: the other ranks wait at it forever. This reads source with `ast` only (it imports
nothing from the files it checks, nor torch or accelerate) and reports, in flake8's format:

    AIF001  an in_order log call (`logger.info(msg, in_order=True)`) on a rank-dependent path
    AIF002  a known collective (`wait_for_everyone`, `gather`, `dist.barrier`...) on a rank-dependent path

`rank` says what a rank-dependent value and a collective are, `walker` which paths are rank-dependent,
`report` reads files and prints; `flake8_plugin` serves the same checks to `flake8 --select AIF`.
"""

from .report import EXIT_CLEAN, EXIT_FOUND, EXIT_UNREADABLE, FORMATS, check_file, run
from .walker import COLLECTIVE, IN_ORDER, Finding, check_tree


__all__ = [
    "COLLECTIVE",
    "EXIT_CLEAN",
    "EXIT_FOUND",
    "EXIT_UNREADABLE",
    "FORMATS",
    "IN_ORDER",
    "Finding",
    "check_file",
    "check_tree",
    "run",
]
