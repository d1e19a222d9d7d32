"""The documented bounds of an in_order call: one table that the documents, `status` and the checker share.

Each time is in units of the timeout T (`ACCELERATE_INORDER_TIMEOUT`); each count is in store keys. The
schedule explorer (tests/unit/explorer.py) checks every schedule against these numbers, per rank and per
divergence, so a number changed here is a promise changed everywhere. Stdlib only: the bottom layer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """One promise's number.

    Attributes:
        value: the number, in units of `unit`.
        unit: "T" (the timeout), "keys", or "aborts" (at exit, beyond upstream's in the same run).
        meaning: the promise, in one line.
    """

    value: float
    unit: str
    meaning: str


CHECK_IN = Bound(2.0, "T", "a rank's check-in ends within T, or 2 T at a call that won a wait-for cycle")
CALL = Bound(2.75, "T", "a call on any rank (check-in and turns) waits at most 2.75 T")
DEATH = Bound(1.75, "T", "a rank that dies costs each other rank at most 1.75 T of waiting, in all")
DIVERGENCE = Bound(
    2.0, "T", "a call some rank skips (or a rank late past T) costs each rank at most 2 T, per divergence"
)
MAIN_ONLY = Bound(1.0, "T", "a main-only call before an every-rank call costs one timeout, once")
LATE_AFTER_VERDICT = Bound(0.0, "T", "a rank that comes to a call after its verdict was written waits 0")
DECIDED = Bound(0.0, "T", "once a call's verdict is a skip, no rank waits in it any more")
KEYS_PER_SITE = Bound(1.0, "keys", "store keys per site used: N + 3 (counter, two verdicts, N handoff keys)")
KEYS_PER_RANK = Bound(1.0, "keys", "store keys per rank: its one marker (`w/<r>`)")
GATHER_POST = Bound(
    0.0, "T", "gather mode: a non-main rank's post waits 0 while it holds fewer than GATHER_QUEUE records in the store"
)
GATHER_QUEUE = Bound(
    64.0, "keys", "gather mode: records a rank holds in the store, read or not; past them its post waits"
)
GATHER_FULL = Bound(
    1.0,
    "T",
    "gather mode: a rank holding GATHER_QUEUE records waits at most T for the main process to read, once a stall; "
    "then it prints its records itself until the main process reads again",
)
GATHER_MAIN_ONLY = Bound(1.0, "T", "gather mode: a main-only call costs the main process one timeout per site, in all")
GATHER_DEATH = Bound(
    1.25,
    "T",
    "gather mode: a quiet (stopped or dead) rank costs the main process at most 1.25 T in all, until it is on time again",
)
EXIT_ABORTS = Bound(1.0, "aborts", "at exit, each mode aborts at most once more than upstream in the same runs")

ALL: dict[str, Bound] = {name.lower(): value for name, value in list(globals().items()) if isinstance(value, Bound)}


def keys_per_site(world_size: int) -> int:
    """The store keys one call site may hold at rest, at `world_size` ranks: N + 3."""
    return int(KEYS_PER_SITE.value) * world_size + 3


def store_keys(world_size: int, sites: int) -> int:
    """The store keys barrier mode may hold at rest: N + 3 per site used, and one marker per rank."""
    return keys_per_site(world_size) * sites + int(KEYS_PER_RANK.value) * world_size
