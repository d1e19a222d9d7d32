"""The command line: `accelerate-inorder-fix` or `python -m accelerate_inorder_fix`.

    status   what is installed, and whether a process here gets the fix
    check    run the in_order scenarios on real CPU ranks, without and with the fix
    bench    time the two in_order modes (barrier, gather) beside upstream
    lint     find in_order calls and collectives that only some ranks reach, before the job runs

Exit codes: 0 success; 1 the check found a problem with the fix, or could not run (`lint`: found
something); 2 bad arguments (`lint`: also a path that cannot be read or parsed; `status`: also a
setting of the package that is not valid); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

from .. import __version__
from .. import config as _config
from ..config import SETTINGS
from . import scenarios


EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _say(text: str) -> None:
    """Progress goes to stderr, so stdout holds only the result (the table, or the JSON)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _whole_number(what: str, least: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of `what`, at least `least` (`why` says why, when it is not 1)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what}, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}{why}, not {value}")
        return value

    return parse


_nproc = _whole_number("ranks", 2, " (in_order only matters with several ranks)")
_jobs = _whole_number("jobs", 1)  # `--jobs`: jobs at once


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelerate-inorder-fix",
        description="Check that accelerate's `logger.info(msg, in_order=True)` works on this machine.",
        epilog="Start with `check`: it shows the bug without the fix and the fix at work, in a few minutes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    status = commands.add_parser(
        "status",
        help="show versions, and whether a Python process here gets the fix",
        description="Show the installed accelerate and torch, which upstream log body is installed, whether a "
        "Python process here gets the fix and how, the in_order mode and timeout in effect, and "
        "whether the start-up hook is installed. Exits 2 when a setting (ACCELERATE_INORDER_*) is not valid, "
        "naming it.",
    )
    status.add_argument("--json", action="store_true", help="print the facts as JSON, for scripts")

    check = commands.add_parser(
        "check",
        help="run the in_order scenarios on real CPU ranks, without and with the fix",
        description="Start real CPU ranks (torchrun, gloo; no GPU needed) and run each in_order scenario "
        "first without the fix, then with it. Prints a table of what happened. Exits 0 only if "
        "every scenario is ordered with the fix.",
    )
    check.add_argument("--nproc", type=_nproc, default=4, metavar="N", help="ranks per job (default: 4)")
    check.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="jobs run at once (default: what the cores allow, a core per rank: "
        "cores // nproc, at least 1; 1 on a 2-core machine)",
    )
    check.add_argument(
        "--mode",
        choices=_config.MODES,
        default=None,
        help="in_order mode of the patched run (default: the mode in effect, "
        f"{_config.MODE_ENV} or {_config.DEFAULT_MODE})",
    )
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=8.0,
        metavar="S",
        help="seconds a job may print nothing before it counts as deadlocked and is stopped (default: 8)",
    )
    check.add_argument(
        "--scenario",
        action="append",
        choices=list(scenarios.CHECK_SCENARIOS),
        metavar="NAME",
        help=f"run only this scenario (repeatable; default: all of {', '.join(scenarios.CHECK_SCENARIOS)})",
    )
    check.add_argument("-v", "--verbose", action="store_true", help="explain every verdict, not only failures")

    commands.add_parser(
        "bench",
        help="time in_order logging in barrier and gather mode",
        description="Run the benchmark of both modes beside upstream and print its table. Any other argument "
        "goes to the benchmark itself (`bench -- --help` shows them). Gather mode at up to 1,024 simulated "
        "ranks is a repository script: python benchmarks/bench_scale.py.",
    )
    from ..lint import command as _lint_command  # stdlib only

    lint = commands.add_parser("lint", help=_lint_command.HELP, description=_lint_command.DESCRIPTION)
    _lint_command.add_arguments(lint)
    for command in (status, check, lint):  # a command's own usage for its bad arguments (`main`)
        command.set_defaults(command_parser=command)
    return parser


def cmd_lint(args: argparse.Namespace) -> int:
    from ..lint import command as _lint_command

    return _lint_command.run_command(args)


def cmd_status(args: argparse.Namespace) -> int:
    from . import status as _status

    facts = _status.collect()
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
    else:
        print("\n".join(_status.render(facts)))
    return EXIT_USAGE if facts["invalid_settings"] else EXIT_OK


def _interrupt_on_sigterm() -> None:
    """SIGTERM takes the same path as Ctrl-C: the jobs' clean-up runs before the process ends."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def cmd_check(args: argparse.Namespace) -> int:
    from . import check as _check

    mode = args.mode or SETTINGS.mode()
    for name in ("accelerate", "torch"):
        if importlib.util.find_spec(name) is None:
            _say(f"check: {name} is not installed for {sys.executable}; nothing to check.")
            return EXIT_FAIL
    names = args.scenario or list(scenarios.CHECK_SCENARIOS)
    # Importing accelerate here costs seconds of CPU: do it while the ranks start, not before.
    header: list[tuple[str, bool]] = []
    describe = threading.Thread(target=lambda: header.append(_describe_setup(args.nproc, mode)), daemon=True)
    check = _check.Check(
        args.nproc, mode=mode, stall=args.timeout, names=names, say=_say, on_start=describe.start, jobs=args.jobs
    )
    _say(
        f"check: {len(names) + 1} jobs of {args.nproc} CPU ranks (torchrun, gloo), {check.workers} at a time: "
        f"{len(names)} unpatched (they do not depend on the mode) and 1 patched, in {mode} mode; "
        f"a job silent for {args.timeout:g} s counts as deadlocked and is stopped"
    )
    start = time.monotonic()
    _interrupt_on_sigterm()
    try:
        results = check.run()
    except KeyboardInterrupt:
        _say("check: interrupted; every rank it started has been stopped.")
        return EXIT_INTERRUPTED
    describe.join()
    text, known_body = header[0] if header else ("(could not describe the set-up)", True)
    print(text)
    print()
    print("\n".join(_check.table(results, mode)))
    print()
    code = _conclude(results, args, time.monotonic() - start)
    if code and not known_body:
        print(
            f"Note: the fix stands aside on a log body it was not tested against. To see it at work on "
            f"this one, run the check again with {_config.SWITCH_ENV}=force."
        )
    return code


def _describe_setup(nproc: int, mode: str) -> tuple[str, bool]:
    """(line naming what was checked, whether the log body is known); shown as progress at once."""
    from . import status as _status

    accelerate, torch = _status.accelerate_facts(), _status.torch_facts()
    known = True  # no note about the guard when accelerate itself is the problem
    if not accelerate.get("installed"):
        text = f"accelerate cannot be used here: {accelerate.get('error', 'not installed')}"
    else:
        known = accelerate["log_body"]["known"]
        body = accelerate["log_body"]
        body_text = f"log body of {body['release_line']}" if body["known"] else "UNKNOWN log body"
        text = (
            f"accelerate {accelerate['version']} ({body_text}), torch {torch.get('version', 'missing')}, "
            f"{nproc} CPU ranks per job, mode {mode}"
        )
    _say(f"  checking {text}")
    return text, known


def _conclude(results: dict[str, tuple[Any, Any]], args: argparse.Namespace, elapsed: float) -> int:
    """Explain the verdicts that need it and turn the patched column into the exit code."""
    for name, (before, after) in results.items():
        if args.verbose and before.detail:
            print(f"unpatched {name}: {before.word}: {before.detail}")
        if not after.ok:
            print(f"patched {name}: {after.word}: {after.detail}")
    broken = [name for name, (before, _) in results.items() if not before.ok]
    failed = [name for name, (_, after) in results.items() if not after.ok]
    if broken:
        print(f"Without the fix, {len(broken)} of {len(results)} scenarios go wrong on this accelerate.")
    else:
        print("Without the fix, every scenario came out ordered on this accelerate (no bug to show).")
    if failed:
        print(f"FAIL: with the fix, {len(failed)} scenario(s) are not ordered: {', '.join(failed)}.")
    else:
        print(f"PASS: with the fix, every scenario is ordered on {args.nproc} ranks.")
    print(f"(took {elapsed:.0f} s)")
    return EXIT_FAIL if failed else EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    argv = list(args.bench_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    result: Any
    if argv[:1] == ["scale"] or "--scale" in argv:  # moved out of the wheel: say where it went
        print(
            "accelerate-inorder-fix: error: `bench scale` moved to the repository: "
            "python benchmarks/bench_scale.py --ranks 8,64 (in a checkout)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from . import bench

    result = bench.main(argv)
    # main() prints its own table; what it returns is either an exit code or its raw results.
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    return EXIT_FAIL if result is False else EXIT_OK


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 bad arguments, 130 interrupted).

    Args:
        argv (`list[str]`, *optional*): the arguments, without the program name; `sys.argv[1:]` by default.
    """
    parser = build_parser()
    # Whatever `bench` does not know belongs to the benchmark; any other command knows all its options.
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        args.command_parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.bench_args = rest
    if args.command == "status":
        return cmd_status(args)
    if args.command == "check":
        return cmd_check(args)
    if args.command == "lint":
        return cmd_lint(args)
    return cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
