"""One of two files of one basename, function and line (tests/jobs/test_barrier_bounds.py): every rank's call."""


def step(r, call):
    r.log.info(f"twins#{100 + call} r{r.index}", in_order=True)
