"""Gather mode at 8..1,024 simulated ranks, the current store protocol beside the old one.

The benchmark itself is the package's (`accelerate_inorder_fix/tools/bench_scale.py`, what
`accelerate-inorder-fix bench scale` runs on a user's machine); this script adds the protocol gather
mode had before batching, kept here for the side-by-side and never shipped: the installed package
does not carry it, and nothing in the package imports this file.

    python benchmarks/bench_scale.py --ranks 8,64,256,1024 --json FILE
"""

from __future__ import annotations

import datetime
from typing import Any

from accelerate_inorder_fix.gather import records, transport
from accelerate_inorder_fix.tools import bench_scale


class LegacyOutbox:
    """The rank side before batching: append to its queue, never clean (the main process deleted)."""

    def __init__(self, store: Any, rank: int, cleanup_store: Any = None) -> None:  # never cleans
        self.store = store
        self.rank = rank
        self.sent = 0

    def post(self, payload: bytes, document: Any = None) -> bool:
        self.store.set(transport.key(self.rank, self.sent), payload)
        self.sent += 1
        return True


class LegacyInbox:
    """The main process's side before batching: per rank a wait or check, a get and a delete.

    Implements the collector's `Inbox` protocol (`accelerate_inorder_fix.gather.collector.Inbox`).
    """

    def __init__(self, store: Any, world_size: int) -> None:
        self.store = store
        self.cursor = [0] * world_size

    def _next_key(self, rank: int) -> str:
        return transport.key(rank, self.cursor[rank])

    def wait(self, ranks: list[int], seconds: float) -> bool:
        try:
            self.store.wait([self._next_key(r) for r in ranks], datetime.timedelta(seconds=seconds))
        except RuntimeError:
            return False
        return True

    def ready(self, rank: int) -> bool:
        return bool(self.store.check([self._next_key(rank)]))

    def take(self, rank: int) -> Any:
        name = self._next_key(rank)
        payload = self.store.get(name)
        self.store.delete_key(name)
        self.cursor[rank] += 1
        return records.decode(payload)

    def take_many(self, ranks: list[int]) -> list[Any]:
        return [self.take(rank) for rank in ranks]  # exactly the old loop: one rank after another

    def take_copied(self, ranks: list[int], current: Any, into: Any) -> list[Any]:
        return []  # no shared slots then

    def settle(self) -> None:
        pass

    def seal(self, rank: int) -> list[Any]:
        return []


PROTOCOLS = {**bench_scale.PROTOCOLS, "old": (LegacyInbox, LegacyOutbox)}


def main(argv: Any = None) -> Any:
    return bench_scale.main(argv, PROTOCOLS)


if __name__ == "__main__":
    main()
