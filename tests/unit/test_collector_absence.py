"""Promise: a call some ranks never make costs one timeout for its call site in all, and never splits the
blocks of the calls they do make; a rank that died costs at most 1.25 timeouts in all.

On the in-memory store (`testing.InMemoryStore`), the package's real `Outbox` / `Inbox` / `Collector`, driven by
test_collector.py's `Job`: the main process's calls, and the other ranks' posts between them, in the
order a real job makes them. `MAIN` is a call only the main process makes
(`if accelerator.is_main_process: logger.info(..., in_order=True)`), `SITE` one every rank makes.
"""

import threading

from test_collector import OTHER, SITE, SLACK, Job

from accelerate_inorder_fix.testing import InMemoryStore


MAIN = ("train.py", "step", 30)
LAST = ("train.py", "step", 40)


def _block_whole_and_in_rank_order(job, count, world_size):
    assert job.during(("block", SITE, count)) == [(SITE, count, r) for r in range(world_size)]


def test_main_only_call_next_to_an_every_rank_call_costs_one_timeout_for_its_site_in_all():
    """The others post their every-rank call while the main process waits in its main-only one."""
    timeout, steps = 0.3, 5
    job = Job(4, timeout=timeout)
    waited = 0.0
    for step in range(1, steps + 1):
        posters = [threading.Timer(0.02, job.post, (rank, SITE, step)) for rank in (1, 2, 3)]
        for poster in posters:
            poster.start()
        waited += job.call(step, site=MAIN)
        waited += job.call(step)
        for poster in posters:
            poster.join()
        _block_whole_and_in_rank_order(job, step, 4)
    assert timeout <= waited < timeout + SLACK
    assert len(job.warnings) == 1 and "ranks 1, 2, 3 sent no record within" in job.warnings[0], job.warnings


def test_every_rank_call_after_a_missed_main_only_one_is_waited_for_whole_and_in_rank_order():
    """The every-rank call first, then the main-only one; the others post a little after the main process
    makes the every-rank call (they left the step's collective later): each block whole, in rank order."""
    timeout, steps = 1.0, 4
    job = Job(4, timeout=timeout)
    waited = 0.0
    for step in range(1, steps + 1):
        posters = [threading.Timer(0.01 * (4 - rank), job.post, (rank, SITE, step)) for rank in (1, 2, 3)]
        for poster in posters:
            poster.start()
        waited += job.call(step)
        for poster in posters:
            poster.join()
        _block_whole_and_in_rank_order(job, step, 4)
        waited += job.call(step, site=MAIN)
    assert waited < 1.5 * timeout + SLACK
    assert len(job.warnings) == 1 and "ranks 1, 2, 3 sent no record within" in job.warnings[0], job.warnings


def test_rank_that_went_quiet_costs_one_timeout_in_all_not_one_per_site():
    """Rank 2 stops posting after call 1 (it died): the calls at three other sites wait for it a little
    (its grace, a quarter of the timeout) and then not at all; it is named once."""
    timeout = 1.0
    job = Job(3, timeout=timeout)
    for rank in (1, 2):
        job.post(rank, SITE, 1)
    job.call(1)
    waited = 0.0
    for site in (OTHER, MAIN, LAST):
        job.post(1, site, 1)
        waited += job.call(1, site=site)
        assert job.during(("block", site, 1)) == [(site, 1, 0), (site, 1, 1)]
    assert timeout <= waited < 1.5 * timeout
    assert len(job.warnings) == 1 and "rank 2 sent no record within" in job.warnings[0], job.warnings


def test_rank_absent_at_one_site_is_waited_for_there_again_once_a_record_of_it_for_that_site_arrives():
    job = Job(3, timeout=0.3)
    job.post(1, SITE, 1)
    job.call(1)  # rank 2 misses call 1 at SITE
    job.post(2, OTHER, 1)  # it is alive: a record for another site
    job.post(1, SITE, 2)
    assert job.call(2) < 0.15  # not waited for at SITE
    for count in (1, 2, 3):  # it catches up: two late records, each emitted alone, and one in time
        job.post(2, SITE, count)
    job.post(1, SITE, 3)
    job.call(3)
    assert job.during(("block", SITE, 3)) == [(SITE, 1, 2), (SITE, 2, 2)] + [(SITE, 3, r) for r in range(3)]
    job.post(1, SITE, 4)
    poster = threading.Timer(0.05, job.post, (2, SITE, 4))
    poster.start()
    job.call(4)
    poster.join()
    assert job.during(("block", SITE, 4)) == [(SITE, 4, r) for r in range(3)]
    assert len(job.warnings) == 1


class MillisecondStore(InMemoryStore):
    """c10d's wait rounds its timeout down to whole milliseconds, and 0 ms means no timeout at all."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, keys, timeout=None):
        self.waits.append(timeout.total_seconds())
        return super().wait(keys, timeout)


def test_no_wait_asks_the_store_for_less_than_a_millisecond():
    job = Job(3, timeout=0.3, store=MillisecondStore())
    job.post(1, SITE, 1)
    job.call(1)  # rank 2 goes quiet
    job.collector.quiet[2] = 0.0005  # its grace nearly spent: half a millisecond left
    job.post(1, OTHER, 1)
    job.call(1, site=OTHER)
    assert min(job.store.waits) >= 0.001, job.store.waits
