"""Gather mode at 8..1,024 simulated ranks, new store protocol vs old: see accelerate_inorder_fix/tools/bench_scale.py."""

from accelerate_inorder_fix.tools.bench_scale import main


if __name__ == "__main__":
    main()
