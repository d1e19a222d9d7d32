"""A user's training loop that logs in_order every step; it never imports accelerate_inorder_fix.

Trains a small model twice in one job, from the same seed: once without any logging, once logging
`in_order` at every step (rank 0 at INFO, the other ranks at WARNING, so an INFO call prints on rank 0
only: the call upstream deadlocks on). Every rank then prints whether its trained weights are
bit-identical between the two runs. Record lines follow tests/jobs/scripts/fault_ranks.py's format:
`case#step r<rank> ... @@func by=r<writer>`.
"""

import hashlib
import logging
import sys

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import set_seed


STEPS = 8
LOGGER = "aif.train"


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(accelerator, log):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(
        torch.randn(STEPS * 4 * accelerator.num_processes, 8), torch.randn(STEPS * 4 * accelerator.num_processes, 1)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rank = accelerator.process_index
    for step, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if log is not None:
            log.info(f"train#{step} r{rank} loss={loss.item():.6f}", in_order=True)
            if accelerator.sync_gradients:
                log.warning(f"sync#{step} r{rank}", in_order=True)
    weights = accelerator.unwrap_model(model).state_dict()
    return {name: tensor.detach().clone() for name, tensor in weights.items()}


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    rank = accelerator.process_index
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(message)s @@%(funcName)s by=r{rank}"))
    base = logging.getLogger(LOGGER)
    base.addHandler(handler)
    base.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    base.propagate = False
    quiet = train(accelerator, None)
    logged = train(accelerator, get_logger(LOGGER))
    same = quiet.keys() == logged.keys() and all(torch.equal(quiet[k], logged[k]) for k in quiet)
    digest = hashlib.sha256(b"".join(logged[k].numpy().tobytes() for k in sorted(logged))).hexdigest()[:16]
    accelerator.wait_for_everyone()
    say(f"@@WEIGHTS r{rank} identical={same} sha={digest}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
