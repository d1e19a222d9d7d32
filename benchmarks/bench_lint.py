"""`lint` over real codebases: files, seconds and findings per code, for benchmarks/RESULTS-lint.md.

The codebases are fetched by the person running this and never committed; each argument is `NAME=PATH`
(a directory). For each: the number of `.py` files, CPU seconds (one core: this process's user+system time,
so machine load from others does not count), the part of it spent in `ast.parse` alone, wall seconds, and
the findings per code. `--findings FILE` also writes every finding, one flake8 line each, for judging.

    python benchmarks/bench_lint.py diffusers=/tmp/diffusers/examples trl=/tmp/trl --markdown
"""

import argparse
import ast
import time
from collections import Counter
from pathlib import Path

from accelerate_inorder_fix.lint import CODES, check_file, report
from accelerate_inorder_fix.lint.helpers import Package


def measure(path: str) -> tuple[int, float, float, float, list[str]]:
    """(files, CPU s of lint, CPU s of ast.parse alone, wall s of lint, findings as flake8 lines)."""
    files = [p for p, problem in report.python_files([path]) if problem is None]
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    package = Package(files)  # the files are given together, as `lint PATH` gives them
    lines = []
    for name in files:
        try:
            lines += [report.render_text(name, f) for f in check_file(name, package)]
        except (OSError, SyntaxError, ValueError):
            continue
    cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
    parse_start = time.process_time()
    for name in files:
        try:
            ast.parse(Path(name).read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
    return len(files), cpu, time.process_time() - parse_start, wall, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codebases", nargs="+", metavar="NAME=PATH")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--findings", metavar="FILE", help="write every finding to FILE")
    args = parser.parse_args()
    rows, everything = [], []
    for item in args.codebases:
        name, _, path = item.partition("=")
        files, cpu, parse, wall, lines = measure(path)
        counts = Counter(line.split(": ", 1)[1].split(" ", 1)[0] for line in lines)
        rows.append([name, str(files), f"{cpu:.2f}", f"{parse:.2f}", f"{wall:.2f}"] + [str(counts[c]) for c in CODES])
        everything += lines
    header = ["codebase", "files", "CPU s", "ast.parse alone, CPU s", "wall s", *CODES]
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        print("\n".join("| " + " | ".join(row) + " |" for row in rows))
    else:
        print("\n".join("\t".join(row) for row in [header, *rows]))
    if args.findings:
        Path(args.findings).write_text("".join(line + "\n" for line in everything))


if __name__ == "__main__":
    main()
