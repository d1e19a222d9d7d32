"""Tooling around the patch: the command line (`cli`), what `status` and `check` report, the real-rank
job launcher (`launch`), the scenarios the ranks run, and the benchmarks. Nothing here runs in a
training job unless a tool starts it.
"""
