"""README's quick-start script, as a user writes it: a plain `Accelerator()`, one in_order record per rank.

Each rank also prints what its Accelerator saw, for tests/jobs/test_readme_launch.py:
`@@ACCELERATOR process_index=<i> num_processes=<n> distributed_type=<t>`.

    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 readme_ranks.py
"""

import logging
import sys

from accelerate import Accelerator
from accelerate.logging import get_logger


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    accelerator = Accelerator()
    # One write of the whole line: `print` writes the text and its newline apart, and two ranks sharing the
    # launcher's pipe can interleave between them.
    sys.stdout.write(
        f"@@ACCELERATOR process_index={accelerator.process_index} num_processes={accelerator.num_processes} "
        f"distributed_type={accelerator.distributed_type.value}\n"
    )
    sys.stdout.flush()
    logger = get_logger(__name__)
    logger.info(f"shard {accelerator.process_index} loaded", in_order=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
