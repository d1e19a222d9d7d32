"""What the start-up hook adds to every interpreter start: `python -c pass`, hook present vs. absent.

One environment, with the package installed from a freshly built wheel (or the one given with
`--venv`). Each pair of runs times the interpreter with the hook's `.pth` in place and with it renamed
away, in alternating order (ABBA), so drift in machine load falls on both sides alike. Two measures:

- `python -c pass`: the whole process, wall time and the child's CPU time (user + sys);
- `site.main()`: what `site` does at start-up, timed inside the child (`python -S`, then
  `site.main()` between two clock reads). It is the part the hook can change, with none of the
  process start and exit noise that a shared machine adds to the first measure.

Reported: median of each side and the median of the paired differences (the budget: at most
0.3 ms added), and whether any module of this package was imported at start-up (it must not be: the
`.pth` line only puts a finder on `sys.meta_path`).

    python benchmarks/bench_startup.py                 # builds the wheel into a temporary venv
    python benchmarks/bench_startup.py --venv DIR      # an existing venv with the wheel installed
    python benchmarks/bench_startup.py --pairs 400 --markdown

Needs hatchling in the running interpreter to build the wheel (the test extra has it).
"""

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PTH_NAME = "_accelerate_inorder_fix_startup.pth"
RUN_TIMEOUT = 30


def build_venv(workdir):
    """A venv holding only this package (no dependencies: `python -c pass` never imports them)."""
    dist, venv = workdir / "dist", workdir / "venv"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        timeout=300,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    wheel = next(dist.glob("*.whl"))
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    return venv


def find_pth(python):
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=RUN_TIMEOUT,
    ).stdout.strip()
    path = Path(out) / PTH_NAME
    if not path.is_file():
        sys.exit(f"{path} not found: is accelerate-inorder-fix installed (not editable) in that venv?")
    return path


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(python, env):
    """(wall ms, CPU ms) of one `python -c pass`."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(
        [python, "-c", "pass"],
        env=env,
        check=True,
        timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return (time.perf_counter() - start) * 1000.0, (_children_cpu() - cpu) * 1000.0


SITE_MAIN = (
    "import time, site\nstart = time.perf_counter()\nsite.main()\nprint((time.perf_counter() - start) * 1000.0)\n"
)


def time_site_main(python, env):
    """(ms of `site.main()` timed inside the child, None): the start-up work the hook adds to."""
    out = subprocess.run(
        [python, "-S", "-c", SITE_MAIN],
        env=env,
        check=True,
        timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip()), None


def modules_at_start(python, env):
    """The package's modules present in `sys.modules` after start-up (must be none)."""
    code = "import sys; print(sorted(m for m in sys.modules if 'accelerate_inorder_fix' in m))"
    return subprocess.run(
        [python, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=RUN_TIMEOUT
    ).stdout.strip()


def measure(python, pth, env, pairs, timer=None):
    """[(ms with hook, ms without)] for `pairs` pairs of `timer` (`time_once`); the .pth is always put back."""
    timer = timer or time_once
    away = pth.with_name(pth.name + ".bench-off")
    results = []
    try:
        for i in range(pairs):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            sample = {}
            for side in order:
                if side == "off":
                    pth.rename(away)
                try:
                    sample[side] = timer(python, env)
                finally:
                    if side == "off":
                        away.rename(pth)
            results.append((sample["on"], sample["off"]))
    finally:
        if away.exists() and not pth.exists():
            away.rename(pth)
    return results


def summarise(label, results, which):
    """One row: medians without / with the hook, median and IQR of the paired differences."""
    on = [a[which] for a, _ in results]
    off = [b[which] for _, b in results]
    diffs = sorted(a[which] - b[which] for a, b in results)
    q1, q3 = diffs[len(diffs) // 4], diffs[(3 * len(diffs)) // 4]
    return (label, statistics.median(off), statistics.median(on), statistics.median(diffs), q1, q3, len(results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", help="existing venv with accelerate-inorder-fix installed from the wheel")
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--markdown", action="store_true", help="print the result as a Markdown table")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="aif-bench-") as tmp:
        venv = Path(args.venv) if args.venv else build_venv(Path(tmp))
        python = str(venv / "bin" / "python")
        pth = find_pth(python)
        base = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_INORDER_FIX", "PYTHONPATH")}
        for _ in range(20):  # warm the page cache
            time_once(python, base)
        armed = measure(python, pth, base, args.pairs)
        site_main = measure(python, pth, base, args.pairs, timer=time_site_main)
        rows = [
            summarise("python -c pass, wall", armed, 0),
            summarise("python -c pass, CPU", armed, 1),
            summarise("site.main() in the child, wall", site_main, 0),
        ]
        loaded = modules_at_start(python, base)

    version = sys.version.split()[0]
    print(
        f"# python -c pass, {platform.machine()}, {os.cpu_count()} cores, Python {version}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    if args.markdown:
        print(
            "| case | without hook, median ms | with hook, median ms | added, median of pairs ms | "
            "added, IQR ms | pairs |"
        )
        print("|---|---|---|---|---|---|")
        for label, off, on, diff, q1, q3, n in rows:
            print(f"| {label} | {off:.2f} | {on:.2f} | {diff:+.2f} | {q1:+.2f} .. {q3:+.2f} | {n} |")
    else:
        for label, off, on, diff, q1, q3, n in rows:
            print(
                f"{label:34s} without {off:6.2f} ms  with {on:6.2f} ms  added {diff:+.2f} ms "
                f"(IQR {q1:+.2f} .. {q3:+.2f}, {n} pairs)"
            )
    print(f"modules of the package imported at start-up: {loaded}")


if __name__ == "__main__":
    main()
