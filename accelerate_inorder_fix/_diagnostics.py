"""The package's one-line warnings on stderr: once per problem and process, never an exception.

A log call must never raise into user code, so every failure the package survives (a handler that
raises, a failed barrier, an unusable store, a bad setting) ends here as one line. Several threads
may report the same problem at once; the lock keeps it one line.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Hashable


PREFIX = "accelerate-inorder-fix: "


class Diagnostics:
    """Remembers what this process has already said, so each problem is said once."""

    def __init__(self) -> None:
        self._said: set[Hashable] = set()
        self._lock = threading.Lock()

    def warn_once(self, key: Hashable, text: str) -> bool:
        """Write `text` as one stderr line unless `key` was reported before. True when written."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
        stream = sys.stderr
        if stream is None:  # pythonw, or a closed stderr: nothing to write to
            return False
        try:
            stream.write(PREFIX + text + "\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed under us: the warning is lost, the call is not
            return False
        return True

    def after_fork_in_child(self) -> None:
        """A lock of the child's own: a parent's thread may have held this one when it forked."""
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget what was said (tests: each starts with a process that has said nothing)."""
        with self._lock:
            self._said.clear()


DIAGNOSTICS = Diagnostics()
os.register_at_fork(after_in_child=DIAGNOSTICS.after_fork_in_child)


def warn_once(key: Hashable, text: str) -> bool:
    """`DIAGNOSTICS.warn_once`: the process's one place for the package's warnings."""
    return DIAGNOSTICS.warn_once(key, text)
