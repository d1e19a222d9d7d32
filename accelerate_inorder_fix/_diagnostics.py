"""The package's warnings: one builder, one channel (stderr), once per problem or rate-limited, never an exception.

Every warning about an in_order call's waits, skips and losses is a `CallWarning`: the call site, the
ranks concerned, what it cost (the wait), what happens next, and the rule the user broke (when there is
one), in the same words in both modes. Barrier mode's own emit (a handler or filter that raises) and a
failed plain barrier are said once per exception type, in plain words: no call site is at hand there. `warn_once` says a problem once per process; `warn_every` says each loss, at
most `BURST` lines a `WINDOW`.

The channel is raw stderr, one write per warning, in both modes. Not `logging`: these warnings are
given from inside a logging call, some (gather mode's main process) while holding the in_order
session's lock. Through `logging` they would run the user's handlers and filters there -- a handler
that logs with `in_order=True` would re-enter the session, a handler lock held by another thread
would stall the block -- and the user's logging configuration could hide them (`dictConfig`'s
`disable_existing_loggers`, a per-rank level of ERROR, `logging.disable`), though each says why a
call cost a timeout. A line on stderr cannot recurse, raise or be filtered; it can be redirected.
Several threads may report the same problem at once; the lock keeps it one line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Optional, Union


PREFIX = "accelerate-inorder-fix: "
COLLECTIVE = "an in_order call is collective: every rank must make it"
TIMEOUT_ENV = "ACCELERATE_INORDER_TIMEOUT"
# What a warning under the COLLECTIVE rule ends with: how to find such calls, and the two fixes.
WAY_OUT = (
    "find such calls before launch with `accelerate-inorder-fix lint <script>`; move each out of its "
    "rank-dependent branch, or drop in_order=True"
)


def site_text(site: Union[tuple[str, str, int], str]) -> str:
    """A call site as the warnings name it, `file:line in function`.

    Args:
        site: `(file name, function, line)`, or a site's name in the store, `file:line:function`.
    """
    if isinstance(site, str):
        place, _, function = site.rpartition(":")
        return f"{place} in {function}" if place else site
    filename, function, line = site
    return f"{filename}:{line} in {function}"


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 1, 2, 3`: how a warning names the ranks concerned."""
    named = sorted(set(ranks))
    return ("rank " if len(named) == 1 else "ranks ") + ", ".join(map(str, named))


@dataclass(frozen=True)
class CallWarning:
    """One warning about an in_order call, rendered to one line in the same shape in both modes.

    `in_order call at <site>: <ranks> <event>. Cost: <cost>. Next: <next>. Rule: <rule>.`

    Args:
        site: the user's call, `file:line in function` (`site_text`), with `(call k from there)` when known
            ("": not known where the warning is given).
        ranks: the ranks concerned (those that missed the call, died, sent junk, ...).
        event: what happened, said of `ranks` (`did not make it within 2 s (ACCELERATE_INORDER_TIMEOUT)`;
            `'s record could not be built`).
        cost: seconds this call waited because of it (0: no wait; None: not measured where it is said).
        next: what happens now (`this call's records are printed unordered on each rank`).
        rule: the rule the user broke (`COLLECTIVE`); empty when the user broke none (a death, a bug).
    """

    site: str
    ranks: tuple[int, ...]
    event: str
    cost: Optional[float]
    next: str
    rule: str = ""

    def render(self) -> str:
        """The warning's one line (without `PREFIX`)."""
        who = ranks_text(self.ranks) if self.ranks else ""
        who += "" if not who or self.event.startswith("'s ") else " "  # "rank 1's record ..."
        if self.cost is None:
            cost = "not measured here"
        elif self.cost > 0:
            cost = f"a wait of {self.cost:g} s"
        else:
            cost = "no wait"
        at = f"at {self.site}" if self.site else "(its site not known here)"
        text = f"in_order call {at}: {who}{self.event}. Cost: {cost}. Next: {self.next}."
        if not self.rule:
            return text
        return f"{text} Rule: {self.rule}." + (f" Way out: {WAY_OUT}." if self.rule == COLLECTIVE else "")


Said = Union[str, CallWarning]


def text_of(said: Said) -> str:
    """The line a warning is written as (without `PREFIX`)."""
    return said.render() if isinstance(said, CallWarning) else said


# A loss (a record that cannot be built, emitted or delivered) or a block's warning is said every time, but
# at most BURST lines a WINDOW: a handler that raises on every record of a tight loop must not flood stderr.
BURST = 20
WINDOW = 60.0


class Diagnostics:
    """Remembers what this process has already said, so each problem is said once (or, for losses, rate-limited)."""

    def __init__(self) -> None:
        self._said: set[Hashable] = set()
        self._lock = threading.Lock()
        self._window_start = -WINDOW
        self._written = 0  # loss lines written in the current window
        self._held = 0  # and not written, since the last one written

    def warn_once(self, said: Said, key: Optional[Hashable] = None) -> bool:
        """Write `said` as one stderr line unless `key` (default: the text) was reported before. True when written."""
        text = text_of(said)
        with self._lock:
            seen = text if key is None else key
            if seen in self._said:
                return False
            self._said.add(seen)
        return _write(text)

    def warn_every(self, said: Said) -> bool:
        """Write `said` as one stderr line each time, at most `BURST` a `WINDOW`; True when written.

        Lines past the burst are counted, not written; the next line written says how many there were,
        and the burst's last line says that more will be counted.
        """
        text, now = text_of(said), time.monotonic()
        with self._lock:
            if now - self._window_start >= WINDOW:
                self._window_start, self._written = now, 0
            if self._written >= BURST:
                self._held += 1
                return False
            self._written += 1
            held, self._held = self._held, 0
            last = self._written == BURST
        if held:
            text += f" (and {held} earlier warning(s) not written: over {BURST} lines in {WINDOW:g} s)"
        if last:
            text += f" (further warnings within {WINDOW:g} s are counted, not written)"
        return _write(text)

    def after_fork_in_child(self) -> None:
        """A lock of the child's own: a parent's thread may have held this one when it forked."""
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget what was said (tests: each starts with a process that has said nothing)."""
        with self._lock:
            self._said.clear()
            self._window_start, self._written, self._held = -WINDOW, 0, 0


def _write(text: str) -> bool:
    """`text` as one line on stderr, after `PREFIX`; False when there is no stderr to write to."""
    stream = sys.stderr
    if stream is None:  # pythonw, or a closed stderr: nothing to write to
        return False
    try:
        stream.write(PREFIX + text + "\n")
        stream.flush()
    except Exception:  # stderr closed or replaced by something that raises: the warning is lost, the call is not
        return False
    return True


DIAGNOSTICS = Diagnostics()
os.register_at_fork(after_in_child=DIAGNOSTICS.after_fork_in_child)


def warn_once(said: Said, key: Optional[Hashable] = None) -> bool:
    """`DIAGNOSTICS.warn_once`: a problem, said once per process (per `key`; default: per text)."""
    return DIAGNOSTICS.warn_once(said, key)


def warn_every(said: Said) -> bool:
    """`DIAGNOSTICS.warn_every`: a loss or a block's warning, said each time it happens (rate-limited)."""
    return DIAGNOSTICS.warn_every(said)
