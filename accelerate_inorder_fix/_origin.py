"""Where an in_order record comes from: its rank and host, as `rank` and `hostname` record attributes.

Both modes set them on every in_order record (`stamp`), so `%(rank)s` and `%(hostname)s` work in a
format whichever mode runs. Gather mode also shows them in the message, since the main process
prints every rank's record (`gather.records.capture`): the `[RANK n] ` tag accelerate 1.13+ gives in `process()`, added
where upstream did not, led by `[host] ` on a job over several hosts. Barrier mode's messages are
upstream's: each rank prints its own.

With collapse on (`config`), one gather-mode line may stand for several ranks: `span_tag` writes its
tag the same way, `[RANK 0-3,6] `, on every release (before 1.13 the single-rank tag is ours too).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import NamedTuple


RANK_TAG = "[RANK {}] "  # the tag accelerate 1.13+ puts before a message, for one rank or a span of ranks


def rank_spans(ranks: Sequence[int]) -> str:
    """`ranks` (ascending, distinct) as runs: `0-7`, `1,3,5,7`, `0-3,6`; a run of two is `4-5`."""
    runs: list[str] = []
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(runs)


def span_tag(ranks: Sequence[int]) -> str:
    """The tag of a line that stands for every rank in `ranks`: `[RANK 0-3,6] `."""
    return RANK_TAG.format(rank_spans(ranks))


class Origin(NamedTuple):
    """A rank, its host, and whether the job spans several hosts (`config.spans_hosts`)."""

    rank: int
    hostname: str
    several_hosts: bool

    @classmethod
    def of(cls, rank: int, several_hosts: bool) -> Origin:
        """This process's origin as rank `rank`: its host as `socket.gethostname()` names it now."""
        return cls(rank, socket.gethostname(), several_hosts)

    def stamp(self, record: logging.LogRecord) -> None:
        """Set the record's `rank` and `hostname` (the package's: a user's `extra` of these names is replaced)."""
        record.rank = self.rank
        record.hostname = self.hostname
