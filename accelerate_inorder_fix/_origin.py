"""Where an in_order record comes from: its rank and host, as `rank` and `hostname` record attributes.

Both modes set them on every in_order record (`stamp`), so `%(rank)s` and `%(hostname)s` work in a
format whichever mode runs. Gather mode also shows them in the message, since the main process
prints every rank's record (`tag`): the `[RANK n] ` tag accelerate 1.13+ gives in `process()`, added
where upstream did not, led by `[host] ` on a job over several hosts. Barrier mode's messages are
upstream's: each rank prints its own.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, NamedTuple


class Origin(NamedTuple):
    """A rank, its host, and whether the job spans several hosts (`config.spans_hosts`)."""

    rank: int
    hostname: str
    several_hosts: bool

    @classmethod
    def of(cls, rank: int, several_hosts: bool) -> Origin:
        """This process's origin as rank `rank`: its host as `socket.gethostname()` names it now."""
        return cls(rank, socket.gethostname(), several_hosts)

    def tag(self, msg: Any) -> Any:
        """`msg` as gather mode prints it: `[RANK n] msg` (not tagged twice), led by `[host] ` if several."""
        rank_tag = f"[RANK {self.rank}] "
        tagged = msg if isinstance(msg, str) and msg.startswith(rank_tag) else f"{rank_tag}{msg}"
        return f"[{self.hostname}] {tagged}" if self.several_hosts else tagged

    def stamp(self, record: logging.LogRecord) -> None:
        """Set the record's `rank` and `hostname` (the package's: a user's `extra` of these names is replaced)."""
        record.rank = self.rank
        record.hostname = self.hostname
