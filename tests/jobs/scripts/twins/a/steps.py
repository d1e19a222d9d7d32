"""One of two files of one basename, function and line (tests/jobs/test_barrier_bounds.py): the main process's call."""


def step(r, call):
    r.log.info(f"twins#{call} r{r.index}", in_order=True)
