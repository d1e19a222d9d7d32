"""Promise: past a call's deadline the main process reads a lagging rank's backlog only boundedly: no
call takes longer than the timeout plus its grace (`collector.GRACE`), however many records wait.

On the in-memory store (`testing.InMemoryStore`) given a round trip of its own (`RoundTripStore`: each store call
costs `ROUND_TRIP`, as a TCPStore's does), the package's real `Outbox` / `Inbox` / `Collector`, driven
by test_collector.py's `Job`. Before this was fixed, the main process went on reading the backlog past
the deadline until it found the rank's record of the call: 20,000 records took it 14.7-18.4 s at T = 3 s
on a real job.
"""

import time

from test_collector import OTHER, SITE, SLACK, Job

from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.testing import InMemoryStore


ROUND_TRIP = 0.0005  # seconds a store call costs: a TCPStore's on loopback, under load
BACKLOG = 20_000


class RoundTripStore(InMemoryStore):
    """A `InMemoryStore` whose every call costs `round_trip` seconds, once it is set."""

    round_trip = 0.0

    def _log(self, method, keys=1):
        super()._log(method, keys)
        if self.round_trip:
            time.sleep(self.round_trip)  # the cost of a network round trip, not a synchronisation


def test_a_backlog_of_20000_records_costs_no_call_more_than_the_timeout_and_its_grace():
    """Rank 1 posts 20,000 records of a call site the main process never calls from, then its records of
    five every-rank calls: each of the main process's five calls ends within the bound."""
    timeout = 0.3
    job = Job(2, timeout=timeout, store=RoundTripStore())
    for count in range(1, BACKLOG + 1):
        job.post(1, OTHER, count)
    for count in range(1, 6):
        job.post(1, SITE, count)
    job.store.round_trip = ROUND_TRIP
    took = [job.call(count) for count in range(1, 6)]
    bound = timeout * (1 + _collector.GRACE)
    assert max(took) < bound + SLACK, took  # f0a0bfc: the first call read all 20,000 (10 s and more)
    assert all((SITE, count, 0) in job.during(("block", SITE, count)) for count in range(1, 6))
    assert any("rank 1 sent no record" in w for w in job.warnings), job.warnings  # the lag is named
    job.store.round_trip = 0.0
    job.flush()  # at exit every record comes out, exactly once
    emitted = [(site, count, rank) for _, site, count, rank in job.handler.seen if rank == 1]
    assert sorted(emitted) == sorted(
        [(OTHER, c, 1) for c in range(1, BACKLOG + 1)] + [(SITE, c, 1) for c in range(1, 6)]
    )
