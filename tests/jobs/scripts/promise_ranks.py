"""Cases for README's "What the patched `log` promises", run on every rank of a real job (test_contract_promises.py).

    torchrun --nproc_per_node 3 promise_ranks.py raising_filter,raising_handler,stacklevel

Every record line is `case#call r<rank> @@<funcName>:<lineno> by=r<writer>`; after each case a collective
checks that no rank skipped or added a barrier (`@@RESULT case r<rank> sum=..`), then `@@DONE case r<rank>`.
`@@SITE case <funcName>:<lineno>` is the call site a record must report. The package is imported explicitly,
unless `AIF_PATCH=0` (upstream's own behaviour, for comparison).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Optional


LOGGER = "aif.promises"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Rank:
    def __init__(self, index: int, size: int, log: Any, handler: logging.Handler) -> None:
        self.index, self.size, self.log, self.handler = index, size, log, handler

    def result(self, case: str, key: str, value: Any) -> None:
        say(f"@@RESULT {case} r{self.index} {key}={json.dumps(value)}")

    def all_reduce_sum(self) -> float:
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.index + 1)])
        dist.all_reduce(value)
        return float(value.item())


class _Raises(logging.Filter):
    """Raises on one rank's record of call 1 (a user's broken filter)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        if self.text in record.getMessage():
            raise RuntimeError("a user's filter raised")
        return True


def raising_filter(r: Rank) -> None:
    """Rank 1's handler has a filter that raises on its record of call 1: that record is lost, the turn is kept."""
    refuse = _Raises("raising_filter#1 r1")
    r.handler.addFilter(refuse)
    r.log.info(f"raising_filter#1 r{r.index}", in_order=True)
    r.handler.removeFilter(refuse)
    r.log.info(f"raising_filter#2 r{r.index}", in_order=True)


class _Broken(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise OSError("a user's handler raised")


def raising_handler(r: Rank) -> None:
    """A handler whose emit raises, on rank 0 and rank 2, for call 1 (not `handleError`: it raises out of emit)."""
    broken = _Broken()
    if r.index in (0, 2):
        logging.getLogger(LOGGER).addHandler(broken)
    r.log.info(f"raising_handler#1 r{r.index}", in_order=True)
    logging.getLogger(LOGGER).removeHandler(broken)
    r.log.info(f"raising_handler#2 r{r.index}", in_order=True)


def _helper(r: Rank, call: int) -> None:
    """A user's logging helper: its caller, not the helper, is the call site.

    accelerate counts `stacklevel` from its own `log` (its default, 2, is the caller of `warning`), so the
    helper's caller is 3.
    """
    r.log.warning(f"stacklevel#{call} r{r.index}", in_order=True, stacklevel=3)


def stacklevel(r: Rank) -> None:
    """`stacklevel` from a helper, and upstream's default spelled out: every rank's record names this function."""
    frame = sys._getframe()
    say(f"@@SITE stacklevel {frame.f_code.co_name}:{frame.f_lineno + 1}")
    _helper(r, 1)
    say(f"@@SITE stacklevel {frame.f_code.co_name}:{frame.f_lineno + 1}")
    r.log.info(f"stacklevel#2 r{r.index}", in_order=True, stacklevel=2)


class _Dies(logging.Filter):
    """Kills its own rank while it emits its record: the rank dies in its turn, mid-call."""

    def filter(self, record: logging.LogRecord) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return True


def killed_in_turn(r: Rank) -> Optional[str]:
    """Rank 1 dies in its turn of an in_order call; the others' calls must end, and one line names it."""
    r.log.info(f"killed_in_turn#0 r{r.index}", in_order=True)
    r.all_reduce_sum()
    if r.index == 1:
        logging.getLogger(LOGGER).addFilter(_Dies())
    start = time.monotonic()
    r.log.info(f"killed_in_turn#1 r{r.index}", in_order=True)
    r.result("killed_in_turn", "seconds", round(time.monotonic() - start, 3))
    say(f"@@DONE killed_in_turn r{r.index}")
    sys.stdout.flush()
    os._exit(0)  # the process group is broken: no collective, no orderly teardown can follow


def host_dies_in_turn(r: Rank) -> Optional[str]:
    """Rank 0, the store's host under env://, dies in its turn of an in_order call: the store goes with it."""
    r.log.info(f"host_dies_in_turn#0 r{r.index}", in_order=True)
    r.all_reduce_sum()
    if r.index == 0:
        logging.getLogger(LOGGER).addFilter(_Dies())
    start = time.monotonic()
    r.log.info(f"host_dies_in_turn#1 r{r.index}", in_order=True)
    r.result("host_dies_in_turn", "seconds", round(time.monotonic() - start, 3))
    say(f"@@DONE host_dies_in_turn r{r.index}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the process group is broken: no collective, no orderly teardown can follow


def main_leaves_first(r: Rank) -> Optional[str]:
    """Three calls on every rank; then rank 0 (the store's host under env://) leaves at once, the others a second
    later, each by a plain exit (its atexit handlers run): nothing may ask the store, gone, for anything."""
    for call in range(3):
        r.log.info(f"main_leaves_first#{call} r{r.index}", in_order=True)
    r.all_reduce_sum()
    say(f"@@DONE main_leaves_first r{r.index}")
    sys.stdout.flush()
    if r.index == 0:
        os._exit(0)  # the store's server goes with it
    time.sleep(1.0)
    sys.exit(0)


CASES: dict[str, Callable[[Rank], Optional[str]]] = {
    f.__name__: f
    for f in (raising_filter, raising_handler, stacklevel, killed_in_turn, host_dies_in_turn, main_leaves_first)
}


def main(names: list[str]) -> None:
    from accelerate import PartialState
    from accelerate.logging import get_logger

    if os.environ.get("AIF_PATCH") != "0":
        import accelerate_inorder_fix  # noqa: F401  (patches by being imported)

    state = PartialState(cpu=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s:%(lineno)d by=r{state.process_index}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    base.propagate = False
    r = Rank(state.process_index, state.num_processes, get_logger(LOGGER), handler)
    for name in names:
        CASES[name](r)
        r.result(name, "sum", r.all_reduce_sum())
        say(f"@@DONE {name} r{r.index}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","))
