"""Plot time per in_order call against ranks, for upstream, barrier mode and gather mode.

    accelerate-inorder-fix bench --full --json results.json
    python benchmarks/plot_modes.py results.json benchmarks/modes.png

Reads the `--json` file of one `bench` run (all three variants side by side in each job, slowest
rank, median over rounds) and draws one line per variant, both axes logarithmic. Needs matplotlib.
"""

import json
import sys

import matplotlib


matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


LINES = [("upstream", "upstream in_order"), ("barrier", "barrier mode"), ("gather", "gather mode")]


def main(source: str, target: str) -> None:
    with open(source) as f:
        results = sorted(json.load(f), key=lambda r: r["world_size"])
    ranks = [r["world_size"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in LINES:
        ax.plot(ranks, [r["seconds"][key] * 1e3 for r in results], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("ranks (CPU gloo, 2 cores)")
    ax.set_ylabel("ms per in_order call (slowest rank)")
    ax.set_title(f"in_order call, accelerate {results[0]['accelerate']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
