"""A user's DDP training job, and how it ends: the exit of a real job, patched or not.

    accelerate launch --multi_gpu --num_processes 4 train_exit.py PATCH END [SWITCH]

- PATCH: `1` imports accelerate_inorder_fix before accelerate (the fix, in the mode
  ACCELERATE_INORDER_MODE names), `0` leaves accelerate as it is (upstream), `nolog` imports the fix
  but makes no in_order call.
- END: how `main()` ends: `end_training` (`accelerator.end_training()`, which destroys the process
  group), `destroy` (`torch.distributed.destroy_process_group()`), or `none` (the group is left to
  interpreter exit, as many scripts do).
- SWITCH: `none`, or a mode (`gather`, `barrier`) that `accelerate_inorder_fix.configure(mode=...)`
  switches to, on every rank, after `SWITCH_AT` more steps in the mode ACCELERATE_INORDER_MODE names.

Everything in `main()`: `Accelerator(cpu=True)`, `prepare`, backward, one in_order loss line per step,
`save_state`, one more in_order line, the ending, then a plain line. Record lines:
`exit#<call> r<rank> ... @@main by=r<writer>` (writer 0 for every rank: gather mode ran), and one
`@@DONE r<rank> cleaner=<0|1> threads=<n>` per rank when `main()` is about to return: whether this
rank's gather queue was cleaned up in the job (its post read the main process's acks and deleted the records
they cover: the store calls a former clean-up thread made), and how many threads of the package are still running.
How the process then exits is the test's business.
"""

import logging
import os
import sys
import tempfile
import threading


PATCH = sys.argv[1]
END = sys.argv[2]
SWITCH = sys.argv[3] if len(sys.argv) > 3 else "none"
# 32 in_order calls in one mode: in gather mode a rank's 17th post reads the main process's ack of its
# first 16 records and deletes them (a rank reads its acks every `queues.ACK_EVERY` = 16 posts; the main
# process acks a rank every 16 records it read), and its 32nd post is the last before the job ends.
STEPS = 31
SWITCH_AT = 8
LOGGER = "aif.exit"

if PATCH in ("1", "nolog"):  # before accelerate, as a user's script does (unpatched: never imported)
    import accelerate_inorder_fix

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.logging import get_logger  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402


def main():
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{rank}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    log = get_logger(LOGGER)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = STEPS + (SWITCH_AT if SWITCH != "none" else 0)
    n = steps * 2 * accelerator.num_processes
    data = torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    call = 0
    for step, (x, y) in enumerate(loader):
        if SWITCH != "none" and step == SWITCH_AT:
            accelerate_inorder_fix.configure(mode=SWITCH)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if PATCH != "nolog":
            log.info(f"exit#{call} r{rank} step={step} loss={loss.item():.4f}", in_order=True)
        call += 1
    with tempfile.TemporaryDirectory() as where:
        accelerator.save_state(os.path.join(where, "state"))
    accelerator.wait_for_everyone()
    if PATCH != "nolog":
        log.info(f"exit#{call} r{rank} saved", in_order=True)
    cleaner = int(_cleaner_started())  # before the session ends with the process group
    if END == "end_training":
        accelerator.end_training()
    elif END == "destroy":
        torch.distributed.destroy_process_group()
    # One write per line: `accelerate launch` runs ranks with `python -u`, where print() writes the
    # newline on its own and ranks' lines could merge on the shared pipe.
    sys.stdout.write(f"@@DONE r{rank} cleaner={cleaner} threads={_our_threads()}\n")
    sys.stdout.flush()


def _cleaner_started():
    """Whether this rank's gather-mode queue was cleaned up: records the main process acked deleted (private
    state: a test probe; gather mode has no thread, a rank's post does it)."""
    if PATCH == "0":
        return False
    from accelerate_inorder_fix import testing

    outbox = getattr(testing.side(), "_outbox", None)
    return outbox is not None and outbox.cleaned > 0


def _our_threads():
    return sum(t.name.startswith("accelerate-inorder-fix") and t.is_alive() for t in threading.enumerate())


if __name__ == "__main__":
    main()
