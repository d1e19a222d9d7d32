"""Gather mode: each rank's in_order record goes through the job's c10d store to the main process.

`session` owns the per-process state (`GATHER`); `collector` is the main process's block assembly;
`transport` the store protocol; `records` the wire format.
"""

from .session import GATHER, GatherSession


__all__ = ["GATHER", "GatherSession"]
