"""The `lint` command's arguments and run, shared by `accelerate-inorder-fix lint` and the pre-commit hook.

Standard library only, like the rest of `lint`: the hook (`scripts/lint-hook`) loads this folder by its
path and runs it on whatever Python pre-commit finds, with nothing installed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from .report import EXIT_UNREADABLE, parse_codes, run


HELP = "find in_order calls and collectives that only some ranks reach (static, before launch)"
DESCRIPTION = (
    "Read Python files (directories recursively) with `ast`, importing nothing from them, and "
    "report in flake8's format each in_order log call (AIF001), known collective (AIF002: accelerate's, "
    "torch.distributed's, mmengine.dist's, Lightning Fabric's, a strategy's, the DeepSpeed engine's) and call "
    "that is collective under DeepSpeed or FSDP (AIF003, `save_state`, `trainer.save_model`...) on a "
    "rank-dependent path: under `if accelerator.is_main_process:`, `if args.local_rank in [-1, 0]:`, after `if "
    "rank != 0: return`, in a function decorated `@accelerator.on_main_process`...; also a call there to your "
    "own function that makes one (files given together: their functions too). Each finding names its rank "
    "source. `# noqa: AIF001` silences a line. Exit codes: 0 "
    "nothing found, 1 findings, 2 a path that cannot be read or parsed (the rest is still checked)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments: paths, `--format`, `--select`, `--ignore`."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories to check")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="text (flake8's, default) or a JSON array"
    )
    parser.add_argument("--select", metavar="CODES", help="report only these codes or prefixes (AIF001,AIF003)")
    parser.add_argument("--ignore", metavar="CODES", help="do not report these codes or prefixes")


def run_command(args: argparse.Namespace) -> int:
    """Check `args.paths`; the exit code (0 clean, 1 findings, 2 a bad code list or an unreadable path)."""
    try:
        select, ignore = parse_codes(args.select), parse_codes(args.ignore)
    except ValueError as error:
        sys.stderr.write(f"lint: {error}\n")
        return EXIT_UNREADABLE  # a usage error, as argparse's own
    return run(args.paths, args.format, sys.stdout, sys.stderr, select, ignore)


def main(argv: Optional[list[str]] = None) -> int:
    """`lint` on its own (the pre-commit hook): parse `argv` (default `sys.argv[1:]`) and run."""
    parser = argparse.ArgumentParser(prog="accelerate-inorder-fix lint", description=DESCRIPTION)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
