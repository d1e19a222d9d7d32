"""The package's one-line warnings on stderr: once per problem and process, never an exception.

A log call must never raise into user code, so every failure the package survives (a handler that
raises, a failed barrier, an unusable store, a bad setting) ends here as one line. Several threads
may report the same problem at once; the lock keeps it one line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Hashable


PREFIX = "accelerate-inorder-fix: "


# A loss (a record that cannot be built, emitted or delivered) is said every time, but at most BURST
# lines a WINDOW: a handler that raises on every record of a tight loop must not flood stderr.
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

    def warn_once(self, key: Hashable, text: str) -> bool:
        """Write `text` as one stderr line unless `key` was reported before. True when written."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
        return _write(text)

    def warn_every(self, text: str) -> bool:
        """Write `text` as one stderr line each time, at most `BURST` a `WINDOW`; True when written.

        Lines past the burst are counted, not written; the next line written says how many there were,
        and the burst's last line says that more will be counted.
        """
        now = time.monotonic()
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
            text += f" (and {held} earlier loss(es) not written: over {BURST} lines in {WINDOW:g} s)"
        if last:
            text += f" (further losses within {WINDOW:g} s are counted, not written)"
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
    except (OSError, ValueError):  # stderr closed under us: the warning is lost, the call is not
        return False
    return True


DIAGNOSTICS = Diagnostics()
os.register_at_fork(after_in_child=DIAGNOSTICS.after_fork_in_child)


def warn_once(key: Hashable, text: str) -> bool:
    """`DIAGNOSTICS.warn_once`: the process's one place for the package's warnings."""
    return DIAGNOSTICS.warn_once(key, text)


def warn_every(text: str) -> bool:
    """`DIAGNOSTICS.warn_every`: a loss, said each time it happens (rate-limited)."""
    return DIAGNOSTICS.warn_every(text)
