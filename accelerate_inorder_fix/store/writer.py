"""The one background store writer: work that must not sit on a logging call's path, on a thread.

Deleting what the main process has read costs a store round trip per record; done inside a post,
the post that cleans up (one in 32, as gather mode's queues once did) would take many times as long as the others. So such work is handed
to a daemon thread, which runs it on a store connection of its own (`connection.own_connection`).

`stop` ends the thread for good and joins it. The session calls it before the process group is
destroyed (`teardown`) and at exit. A thread still inside a store call when the interpreter finalizes
dies there: on taking the GIL back after the call, CPython ends the thread (`pthread_exit`), the forced
unwind meets the destructor of pybind11's `gil_scoped_release` (noexcept), and the process aborts
("terminate called without an active exception", SIGABRT).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .._diagnostics import warn_once


class BackgroundWriter:
    """A daemon thread that runs `work(up_to)` for the highest `up_to` asked for, whenever asked.

    Args:
        work (`Callable[[int], None]`): the store work; it should look at `stopping` between store calls.
        name (`str`): the thread's name, and what a warning about a failure calls it.
    """

    def __init__(self, work: Callable[[int], None], name: str) -> None:
        self._work = work
        self._name = name
        self._changed = threading.Condition()
        self._wanted = 0  # run the work up to this: asked for
        self._done = 0  # and done
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    @property
    def stopping(self) -> bool:
        """True once `stop` was called: no work starts, and work under way ends after its current store call."""
        return self._stopping

    def request(self, up_to: int) -> None:
        """Ask for the work up to `up_to`; never waits (starts the thread the first time)."""
        with self._changed:
            if self._stopping:  # the job is ending: what is left in the store goes with it
                return
            self._wanted = max(self._wanted, up_to)
            self._changed.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every requested piece of work has run; True if it has."""
        with self._changed:
            return self._changed.wait_for(lambda: self._done >= self._wanted, timeout)

    def stop(self, timeout: float) -> bool:
        """End the thread for good and wait up to `timeout` s for it; True when it is not running.

        The thread finishes the store call it is in (bounded by its connection's timeout) and starts
        no other.
        """
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or self._wanted > self._done)
                if self._stopping:
                    return
                up_to = self._wanted
            try:
                self._work(up_to)
            except (RuntimeError, OSError):  # the store is busy or gone: what was not done goes next time
                pass
            except Exception as exc:  # not expected; the thread must outlive it, or the store would grow
                warn_once(f"{self._name} failed, retried later: {exc!r}", key=(self._name, type(exc)))
            with self._changed:
                self._done = up_to
                self._changed.notify_all()
