"""A gather-mode job in which two ranks write foreign bytes into their own record queues.

Run on every rank of a real job (`torchrun --nproc_per_node 4 inject_records.py`, gather mode). Five
in_order calls, the same on every rank. At call 2 rank 1 posts, instead of its record, a pickle that
would create the file `$AIF_PWNED` if unpickled; at call 4 the last rank posts its record cut in half.
Both go through the package's own `queues.Outbox.post`, so they land exactly where the rank's record
of that call would, whatever the key scheme. The test reads the merged stdout:

- `@@PID r<rank> <pid>` once per rank, `@@INJECTED <kind> r<rank>` when a payload was replaced;
- each record as `<message> @@origin=<pid of the rank that logged> @@by=<pid that printed it> ...`;
- `@@SECONDS r0 <call> <s>`: how long each in_order call took on the main process.
"""

import logging
import os
import pathlib
import pickle
import sys
import time


LOGGER = "aif.inject"
CALLS = 5
INJECT = {2: (1, "pickle"), 4: (-1, "truncated")}  # call: (rank, kind); -1 is the last rank


class CreatesFile:
    """Unpickling this calls `Path.touch(path)`: any code could run the same way."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def pickle_payload(path):
    """The bytes an attacker would post: unpickled, they create `path`."""
    return pickle.dumps(((("x.py", "f", 1), 1), {"msg": CreatesFile(path)}), protocol=4)


def _say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Show(logging.Formatter):
    """The message, who logged it and who printed it, the `extra` values, and any traceback."""

    def format(self, record):
        extra = {key: getattr(record, key) for key in ("step", "shape", "device") if hasattr(record, key)}
        line = f"{record.getMessage()} @@origin={record.process} @@by={os.getpid()} @@extra={extra!r}"
        if record.exc_info and not record.exc_text:  # the main process's own record: rendered here
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        return line


def add_attributes(record):
    """A logger filter adding attributes to call 1's record, on its own rank (as user code does).

    accelerate's adapter replaces a call's `extra=` with its own (empty) one, so filters and record
    factories are how records get attributes in accelerate jobs.
    """
    if "inject#1 " in str(record.msg):
        record.step, record.shape, record.device = 1, (2, 3), object()
    return True


def _inject_into_posts(rank, size):
    """Replace this rank's posts at the calls of `INJECT` with foreign bytes, through the real Outbox."""
    from accelerate_inorder_fix.gather import queues

    plan = {call: kind for call, (who, kind) in INJECT.items() if who % size == rank}
    real_post = queues.Outbox.post
    state = {"call": 0}

    def post(self, payload):
        kind = plan.get(state["call"])
        if kind == "pickle":
            payload = pickle_payload(os.environ["AIF_PWNED"])
        elif kind == "truncated":
            payload = payload[: len(payload) // 2]
        if kind:  # written to the rank's own keys as its record would be (`q/<rank>/<n>`)
            _say(f"@@INJECTED {kind} r{rank} call={state['call']} bytes={len(payload)}")
        return real_post(self, payload)

    queues.Outbox.post = post
    return state


def main():
    import accelerate_inorder_fix

    accelerate_inorder_fix.configure(mode="gather")
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    state = PartialState(cpu=True)
    rank, size = state.process_index, state.num_processes
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Show())
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    base.propagate = False
    base.addFilter(add_attributes)
    log = get_logger(LOGGER)
    _say(f"@@PID r{rank} {os.getpid()}")
    calls = _inject_into_posts(rank, size)

    def timed(call, fn, *args, **kwargs):
        calls["call"] = call
        start = time.monotonic()
        fn(*args, in_order=True, **kwargs)
        if rank == 0:
            _say(f"@@SECONDS r0 {call} {time.monotonic() - start:.3f}")

    timed(1, log.info, "inject#1 r%d", rank)
    timed(2, log.info, "inject#2 r%d", rank)
    try:
        raise ValueError(f"boom r{rank}")
    except ValueError:
        timed(3, log.exception, "inject#3 r%d", rank)
    timed(4, log.warning, "inject#4 r%d héllo", rank)
    timed(5, log.info, "inject#5 r%d", rank)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    _say(f"@@SUM r{rank} {total.item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
