"""Run the lint over files and directories, honour `# noqa`, and print findings as flake8 text or JSON.

Findings go to stdout (one line each, or one JSON array); everything else (a path that does not exist, a
file that does not parse, the closing count) goes to stderr, so that stdout stays machine-readable.
Exit codes: 0 nothing found, 1 findings, 2 a path or file could not be read (the rest is still checked).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Optional, TextIO

from .helpers import Package
from .sources import mentions_rank
from .walker import CODES, Finding, check_tree, silences


EXIT_CLEAN, EXIT_FOUND, EXIT_UNREADABLE = 0, 1, 2
FORMATS = ("text", "json")


def python_files(paths: Sequence[str]) -> Iterator[tuple[str, Optional[str]]]:
    """(path, None) for each file to check, in order; (path, why) for a path that cannot be checked."""
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                parts = found.relative_to(path).parts
                if not any(p.startswith(".") or p == "__pycache__" for p in parts[:-1]):
                    yield str(found), None
        elif path.is_file():
            yield given, None  # named explicitly: checked whatever its suffix, as flake8 does
        else:
            yield given, "no such file or directory"


def is_suppressed(finding: Finding, lines: Sequence[str]) -> bool:
    """Whether the finding's line carries `# noqa` or `# noqa: <a prefix of its code>`."""
    return 0 < finding.line <= len(lines) and silences(lines[finding.line - 1], finding.code)


def check_file(path: str, package: Optional[Package] = None) -> list[Finding]:
    """The findings of one file that `# noqa` leaves; raises OSError, SyntaxError or ValueError (bad bytes).

    `package` holds the functions of the files checked with it: a call imported from one is followed.
    """
    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)  # honours the file's encoding declaration
    if not mentions_rank(source):
        return []  # parsed all the same: a file that does not parse is reported whatever it says
    lines = source.decode(_encoding(source), errors="replace").splitlines()
    return [f for f in check_tree(tree, lines, path, package) if not is_suppressed(f, lines)]


def _encoding(source: bytes) -> str:
    from tokenize import detect_encoding

    lines = iter(source.splitlines(keepends=True))
    return detect_encoding(lambda: next(lines, b""))[0]


# Statements newer than some Python this runs on, by how their line starts: (pattern, version, what).
_NEWER_SYNTAX = (
    (re.compile(r"\s*type\s+[A-Za-z_]\w*\s*[\[=]"), (3, 12), "a `type` statement"),
    (re.compile(r"\s*(async\s+)?def\s+[A-Za-z_]\w*\s*\["), (3, 12), "a generic function (`def f[T]`)"),
    (re.compile(r"\s*class\s+[A-Za-z_]\w*\s*\["), (3, 12), "a generic class (`class C[T]`)"),
    (re.compile(r"\s*except\s*\*"), (3, 11), "`except*`"),
    (re.compile(r"\s*(match|case)\b"), (3, 10), "a `match` statement"),
)


def needed_python(line: str) -> Optional[str]:
    """`Python 3.12 (a `type` statement)` when the line that does not parse is syntax newer than this Python."""
    for pattern, version, what in _NEWER_SYNTAX:
        if sys.version_info < version and pattern.match(line):
            return f"Python {version[0]}.{version[1]} or newer ({what})"
    return None


def _why(path: str, error: Exception) -> str:
    if not isinstance(error, SyntaxError):
        return f"{path}: cannot read: {type(error).__name__}: {error}"
    where = f"{path}:{error.lineno or 0}:{error.offset or 0}: cannot parse"
    needs = needed_python(error.text or "")
    if needs is not None:
        this = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return f"{where}: the file needs {needs}, this is Python {this}; run lint on that Python to check it"
    return f"{where}: SyntaxError: {error.msg}"


def parse_codes(text: Optional[str]) -> tuple[str, ...]:
    """`"AIF001, AIF3"` -> ("AIF001", "AIF3"): code prefixes, as flake8's and ruff's `--select` take them."""
    if not text:
        return ()
    codes = tuple(c.upper() for c in re.split(r"[,\s]+", text) if c)
    bad = [c for c in codes if not re.fullmatch(r"[A-Z]+[0-9]*", c)]
    if bad:
        raise ValueError(f"not a code or code prefix: {', '.join(bad)}")
    return codes


def is_selected(code: str, select: Sequence[str], ignore: Sequence[str]) -> bool:
    """Whether `--select`/`--ignore` keep this code: the longer matching prefix wins, `--ignore` on a tie."""
    chosen = max((len(c) for c in select if code.startswith(c)), default=-1) if select else 0
    dropped = max((len(c) for c in ignore if code.startswith(c)), default=-1)
    return chosen > dropped


def summary(found: Sequence[tuple[str, Finding]], files: int, unreadable: int, elapsed: float) -> str:
    """The closing line on stderr: totals, then the count for each code.

    `files` were checked; `unreadable` paths were not, whatever the reason (missing, unreadable, not Python
    that parses): one count, each path named on a line of its own above.
    """
    by_code = dict.fromkeys(CODES, 0)
    for _, finding in found:
        by_code[finding.code] = by_code.get(finding.code, 0) + 1
    counts = ", ".join(f"{code} {n}" for code, n in sorted(by_code.items()))
    skipped = (
        f", {unreadable} not checked (missing, unreadable or unparsable: named above; the rest checked)"
        if unreadable
        else ""
    )
    totals = f"{len(found)} finding(s) in {files} file(s) checked{skipped} ({elapsed:.2f} s)"
    return f"lint: {totals}; by code: {counts}\n"


def render_text(path: str, finding: Finding) -> str:
    return f"{path}:{finding.line}:{finding.col}: {finding.code} {finding.message}"


def run(
    paths: Sequence[str],
    fmt: str,
    out: TextIO,
    err: TextIO,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
) -> int:
    """Lint every path; print the findings `select`/`ignore` keep on `out`, problems and counts on `err`."""
    start = time.perf_counter()
    found: list[tuple[str, Finding]] = []
    files = unreadable = 0
    listed = list(python_files(paths))
    given = [path for path, problem in listed if problem is None]
    package = Package(given) if len(given) > 1 else None
    for path, problem in listed:
        try:
            if problem is not None:
                raise FileNotFoundError(problem)
            findings = check_file(path, package)
        except (OSError, SyntaxError, ValueError) as error:
            unreadable += 1
            err.write(_why(path, error) + "\n")
            continue
        files += 1
        for finding in (f for f in findings if is_selected(f.code, select, ignore)):
            found.append((path, finding))
            if fmt == "text":
                out.write(render_text(path, finding) + "\n")
    if fmt == "json":
        out.write(json.dumps([{"path": path, **asdict(f)} for path, f in found], indent=2) + "\n")
    err.write(summary(found, files, unreadable, time.perf_counter() - start))
    if unreadable:
        return EXIT_UNREADABLE
    return EXIT_FOUND if found else EXIT_CLEAN
