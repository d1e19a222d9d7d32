"""`lint` over real codebases: files, seconds and findings per code, for benchmarks/RESULTS-lint.md.

The codebases are fetched by the person running this and never committed; each argument is `NAME=PATH`
(a directory). For each: the number of `.py` files, CPU seconds (one core: this process's user+system time,
so machine load from others does not count), the part of it spent in `ast.parse` alone, wall seconds, and
the findings per code. `--findings FILE` also writes every finding, one flake8 line each, for judging.
`--baseline REV` also runs the lint as it was at git revision REV, on the same files in the same process right
after each codebase (so both see the same load): its CPU seconds and findings, `--baseline-findings FILE`.

    python benchmarks/bench_lint.py diffusers=/tmp/diffusers/examples trl=/tmp/trl --markdown --baseline 4f3c6d8
"""

import argparse
import ast
import importlib.util
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

from accelerate_inorder_fix.lint import CODES, report


REPO = Path(__file__).resolve().parent.parent


def lint_at(revision: str) -> ModuleType:
    """The lint package as it was at `revision`, loaded by path as a package of its own name (`aif_lint_<rev>`)."""
    root = Path(tempfile.mkdtemp(prefix="bench_lint_"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "accelerate_inorder_fix/lint"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root)
    folder = root / "accelerate_inorder_fix" / "lint"
    name = f"aif_lint_{revision}"
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def measure(path: str, lint: ModuleType) -> tuple[int, float, float, float, list[str]]:
    """(files, CPU s of lint, CPU s of ast.parse alone, wall s of lint, findings as flake8 lines)."""
    files = [p for p, problem in report.python_files([path]) if problem is None]
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    package = lint.helpers.Package(files)  # the files are given together, as `lint PATH` gives them
    lines = []
    for name in files:
        try:
            lines += [report.render_text(name, f) for f in lint.check_file(name, package)]
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
    parser.add_argument("--baseline", metavar="REV", help="also run the lint of git revision REV, side by side")
    parser.add_argument("--baseline-findings", metavar="FILE", help="write the baseline's findings to FILE")
    args = parser.parse_args()
    import accelerate_inorder_fix.lint as current

    baseline = lint_at(args.baseline) if args.baseline else None
    rows, everything, before = [], [], []
    for item in args.codebases:
        name, _, path = item.partition("=")
        files, cpu, parse, wall, lines = measure(path, current)
        counts = Counter(line.split(": ", 1)[1].split(" ", 1)[0] for line in lines)
        rows.append([name, str(files), f"{cpu:.2f}", f"{parse:.2f}", f"{wall:.2f}"] + [str(counts[c]) for c in CODES])
        everything += lines
        if baseline is not None:
            _, old_cpu, _, _, old_lines = measure(path, baseline)
            rows[-1] += [f"{old_cpu:.2f}", str(len(old_lines))]
            before += old_lines
    header = ["codebase", "files", "CPU s", "ast.parse alone, CPU s", "wall s", *CODES]
    header += [f"CPU s at {args.baseline}", f"findings at {args.baseline}"] if baseline is not None else []
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        print("\n".join("| " + " | ".join(row) + " |" for row in rows))
    else:
        print("\n".join("\t".join(row) for row in [header, *rows]))
    if args.findings:
        Path(args.findings).write_text("".join(line + "\n" for line in everything))
    if args.baseline_findings:
        Path(args.baseline_findings).write_text("".join(line + "\n" for line in before))


if __name__ == "__main__":
    main()
