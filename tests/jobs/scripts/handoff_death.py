"""A rank that dies inside its in_order turn, run on every rank of a real job (tests/jobs/test_handoff.py).

    torchrun --nproc_per_node 4 handoff_death.py <dying rank>[,<another dying rank>...] [<late rank>:<seconds>]

Every rank makes three in_order calls (`handoff#<call> r<rank>`). In the third, each dying rank's log
handler kills the process (`os._exit`) as it emits its record: it has the turn, and never hands it
over; the late rank, if any, comes to the third call that many seconds after the others. Each survivor
then prints `@@RESULT r<rank> seconds=<its third call's time>` and `@@DONE r<rank>`.

When a worker dies, torchrun's agent stops the others with SIGTERM and, 30 s later, SIGKILL. A survivor
notes the SIGTERM and finishes its call first, as a training script that checkpoints on SIGTERM does:
what is measured is the call, not the agent. No collective follows a death, so a survivor ends with
`os._exit(0)` (destroying the group would wait for the dead rank).
"""

import logging
import os
import signal
import sys
import time


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class DieInTurn(logging.Filter):
    """The dying rank's handler: the process ends while it emits its record of call 3."""

    def filter(self, record):
        if "#3 " in record.getMessage():
            sys.stdout.flush()
            os._exit(3)
        return True


def main():
    dying = {int(r) for r in sys.argv[1].split(",")}
    late, _, seconds = (sys.argv[2] if len(sys.argv) > 2 else "-1:0").partition(":")
    signal.signal(signal.SIGTERM, lambda *_: None)  # the agent's stop: finish the call first

    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401 -- the test-suite keeps the start-up hook off

    state = PartialState(cpu=True)
    rank = state.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s by=r" + str(rank)))
    if rank in dying:
        handler.addFilter(DieInTurn())
    base = logging.getLogger("aif.handoff")
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger("aif.handoff")
    for call in (1, 2):
        log.info(f"handoff#{call} r{rank}", in_order=True)
    if rank == int(late):
        time.sleep(float(seconds))
    start = time.monotonic()
    log.info(f"handoff#3 r{rank}", in_order=True)
    say(f"@@RESULT r{rank} seconds={time.monotonic() - start:.3f}")
    say(f"@@DONE r{rank}")
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
