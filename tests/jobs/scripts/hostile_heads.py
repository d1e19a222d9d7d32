"""A gather-mode job in which one rank writes crafted heads where its records go.

Run on every rank of a real job (`torchrun --nproc_per_node 4 hostile_heads.py`, gather mode). Eight
in_order calls, the same on every rank; at calls 2 to 6 rank 2 writes, in place of its record's head
(`q/2/<n>`, through the package's own `queues.Outbox`, so it lands where its record would), one of
`HEADS`: a piece count with a piece missing, 300,000 and 1,500,000 claimed pieces, a 5,000-digit count,
and no count at all. The test reads the merged stdout:

- each record as `head#<call> r<rank> by=r<rank that printed it>`;
- `@@SECONDS r0 <call> <s>`: how long each in_order call took on the main process;
- `@@RSS r0 <KiB> <KiB>`: the main process's peak resident memory before its calls and after; `@@DONE r<rank>` after an `all_reduce`.
"""

import logging
import resource
import sys
import time


LOGGER = "aif.hostile"
CALLS = 8
HOSTILE = 2


def heads(chunk):
    """Call -> the head rank 2 writes instead of its record's."""
    return {
        2: b"2\n" + b"x" * chunk,  # two pieces claimed, the second never written
        3: b"300000\n" + b"x" * chunk,
        4: b"1500000\n" + b"x" * chunk,
        5: b"9" * 5000 + b"\nx",
        6: b"not a count",
    }


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _write_heads(state):
    from accelerate_inorder_fix.gather import queues

    plan, real_post = heads(queues.CHUNK), queues.Outbox.post

    def post(self, payload):
        head = plan.get(state["call"])
        if head is None:
            return real_post(self, payload)
        self.store.set(queues.record_key(self.rank, self.sent), head)
        self.parts[self.sent] = 1
        self.sent += 1
        return True

    queues.Outbox.post = post


def main():
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.logging import get_logger

    import accelerate_inorder_fix  # noqa: F401  (patches accelerate; the mode comes from the environment)

    state = PartialState(cpu=True)
    index, world = state.process_index, state.num_processes
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s by=r{index}"))
    base = logging.getLogger(LOGGER)
    base.handlers[:], base.propagate = [handler], False
    base.setLevel(logging.INFO)
    log = get_logger(LOGGER)
    calls = {"call": 0}
    if index == HOSTILE:
        _write_heads(calls)
    dist.barrier()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for call in range(1, CALLS + 1):
        calls["call"] = call
        start = time.monotonic()
        log.info(f"head#{call} r{index}", in_order=True)
        if index == 0:
            say(f"@@SECONDS r0 {call} {time.monotonic() - start:.3f}")
    if index == 0:
        say(f"@@RSS r0 {before} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    assert value.item() == world, value
    say(f"@@DONE r{index}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
