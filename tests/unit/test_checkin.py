"""Promise: barrier mode's check-in gives every rank of a call the same verdict, bounded by the timeout.

Pure logic on an in-memory store (threads stand for ranks, each with a connection of its own); the
real proof, on real jobs and a real TCPStore, is tests/jobs/test_barrier_checkin.py.
"""

import datetime
import threading
import time

import pytest
from fake_store import FakeStore

from accelerate_inorder_fix.gather import checkin


N = 4
SITE_A = ("train.py", "log_main", 10)
SITE_B = ("train.py", "log_all", 20)


class Connection:
    """One rank's connection to the shared store: its own timeout for blocking `get`, as a TCPStore client."""

    def __init__(self, store):
        self.store = store
        self.timeout = 5.0

    def set_timeout(self, timeout):
        self.timeout = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout

    def get(self, key):
        self.store.wait([key], datetime.timedelta(seconds=self.timeout))
        return self.store.get(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def ranks(store, n=N):
    warnings = []
    return [checkin.CheckIn(Connection(store), r, n, checkin.Janitor(store, warnings.append)) for r in range(n)]


def run(calls):
    """Run {rank: callable} at once, one thread each; {rank: (result, seconds)}."""
    out = {}

    def one(rank, call):
        start = time.monotonic()
        result = call()
        out[rank] = (result, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def settle(results):
    for (verdict, done), _ in results.values():
        done()


@pytest.fixture
def store():
    return FakeStore()


def test_every_rank_checked_in_gives_go_written_by_the_last(store):
    sides = ranks(store)
    out = run({r: (lambda s=s: s.verdict(SITE_A, 1, 5.0)) for r, s in enumerate(sides)})
    verdicts = {r: v for r, ((v, _), _) in out.items()}
    assert {v.go for v in verdicts.values()} == {True}
    assert sum(v.decider >= 0 for v in verdicts.values()) == 1  # one writer: the last to arrive
    assert max(seconds for _, seconds in out.values()) < 2.0


def test_ranks_racing_to_decide_all_follow_one_verdict(store):
    sides = ranks(store)
    out = run({r: (lambda s=s: s.verdict(SITE_A, 1, 0.3)) for r, s in enumerate(sides[:3])})
    verdicts = [v for (v, _), _ in out.values()]
    assert len(set(verdicts)) == 1, verdicts  # one verdict, whoever wrote it
    assert not verdicts[0].go and verdicts[0].missing == (3,) and verdicts[0].decider in (0, 1, 2)
    assert max(seconds for _, seconds in out.values()) < 0.3 + 1.0  # bounded by the timeout


def test_a_late_rank_follows_the_skip_at_once(store):
    sides = ranks(store)
    run({r: (lambda s=s: s.verdict(SITE_A, 1, 0.2)) for r, s in enumerate(sides[:3])})
    start = time.monotonic()
    verdict, _ = sides[3].verdict(SITE_A, 1, 10.0)
    assert not verdict.go and 3 in verdict.missing
    assert time.monotonic() - start < 1.0  # read at once: it does not wait its own timeout


def test_suspects_cost_no_wait_until_they_come_back(store):
    sides = ranks(store)
    first, done = sides[0].verdict(SITE_A, 1, 0.2)  # a main-only call: ranks 1-3 never come
    done()
    assert not first.go and first.missing == (1, 2, 3)
    start = time.monotonic()
    for count in range(2, 12):
        again, done = sides[0].verdict(SITE_A, count, 0.2)
        done()
        assert not again.go and again.missing == (1, 2, 3)
    assert time.monotonic() - start < 0.2  # ten more calls, not one of them waited
    # They come back at call 12 (in time or just late: rank 0 may not wait for them there), and from
    # the call after it on the site waits for them again.
    settle(run({r: (lambda s=s: s.verdict(SITE_A, 12, 5.0)) for r, s in enumerate(sides)}))
    back = run({r: (lambda s=s: s.verdict(SITE_A, 13, 5.0)) for r, s in enumerate(sides)})
    assert {v.go for (v, _), _ in back.values()} == {True}
    settle(back)
    assert not sides[0].sites[SITE_A].suspects


def test_a_wait_for_cycle_is_broken_halfway_by_the_smaller_call(store):
    """The others wait for rank 0 at B from before rank 0 starts waiting at a main-only call A (in a loop),
    so their deadline comes first. Halfway through their wait they give A up for rank 0 (fewer ranks made
    it), rank 0 comes to B, and B goes: nobody waits past the timeout."""
    sides = ranks(store)
    others_waiting = threading.Event()

    def main_process():
        others_waiting.wait(5.0)
        threading.Event().wait(0.1)  # test-side delay: rank 0 reaches A after the others reached B
        a, done = sides[0].verdict(SITE_A, 1, 0.5)
        done()
        for count in range(2, 6):  # the rest of the main-only loop: no waits, and A's first keys go
            sides[0].verdict(SITE_A, count, 0.5)[1]()
        assert sides[0].janitor.idle(5.0)
        return a, sides[0].verdict(SITE_B, 1, 0.5)[0]

    def other(side):
        others_waiting.set()
        return side.verdict(SITE_B, 1, 0.5)[0]

    calls = {0: main_process}
    calls.update({r: (lambda s=s: other(s)) for s, r in zip(sides[1:], (1, 2, 3))})
    out = run(calls)
    a, b = out[0][0]
    assert not a.go and a.missing == (1, 2, 3) and a.decider in (1, 2, 3)  # given up by B's waiters
    assert b.go and all(out[r][0].go for r in (1, 2, 3)), out
    assert max(seconds for r, (_, seconds) in out.items() if r) < 0.5  # B went within the others' timeout


def test_a_rank_waiting_at_the_smaller_call_gives_way_halfway(store):
    """Rank 0 waits at its main-only call A from before the others reach B: halfway through its wait it
    sees them waiting at B (more ranks made it) and gives A up, so it reaches B, loop and work done, in
    the others' time."""
    sides = ranks(store)
    waiting_at_a = threading.Event()

    def main_process():
        a, done = sides[0].verdict(SITE_A, 1, 0.5)
        done()
        for count in range(2, 6):
            sides[0].verdict(SITE_A, count, 0.5)[1]()
        threading.Event().wait(0.1)  # test-side delay: the user's code between the two calls
        return a, sides[0].verdict(SITE_B, 1, 0.5)[0]

    def other(side):
        waiting_at_a.wait(5.0)
        return side.verdict(SITE_B, 1, 0.5)[0]

    calls = {0: main_process}
    calls.update({r: (lambda s=s: other(s)) for s, r in zip(sides[1:], (1, 2, 3))})
    threading.Timer(0.1, waiting_at_a.set).start()  # the others reach B while rank 0 waits at A
    out = run(calls)
    a, b = out[0][0]
    assert not a.go and b.go and all(out[r][0].go for r in (1, 2, 3)), out
    assert a.decider == 0  # rank 0 gave its own call up
    assert out[0][1] < 0.5 + 0.1 + 0.3  # rank 0 gave A up halfway: its two calls within one timeout and a bit


def test_a_call_given_up_meanwhile_gives_nothing_else_up(store):
    """Halfway, rank 0 finds its own call A already given up (by B's waiters, `v` still on its way): it reads
    that verdict and leaves B, the call the others wait at, alone."""
    side = ranks(store)[0]
    a, b = "b/a/1/", "b/b/1/"
    store.add(a + "n", 1 + checkin.GIVE_UP)
    store.add(b + "n", 3)
    store.set(checkin.BUSY + "0", a.encode() + b" 9e9")
    for q in (1, 2, 3):
        store.set(checkin.BUSY + str(q), b.encode() + b" 9e9")
    assert side._give_way(a, 0.5)
    assert store.data[b + "n"] == b"3" and not store.check([b + "v"])


def test_a_give_up_after_every_rank_arrived_reads_go(store):
    """The N-th arrival's `add` came before this give-up's: the call goes, whoever gives up after."""
    side = ranks(store)[0]
    base = "b/x/1/"
    store.add(base + "n", N)
    assert side._give_up(base, (3,), 1.0).go
    assert not store.check([base + "v"])  # nothing written over the last arrival's `go`


def test_keys_of_decided_calls_are_removed(store):
    sides = ranks(store)
    for count in range(1, 41):
        settle(run({r: (lambda s=s, c=count: s.verdict(SITE_B, c, 5.0)) for r, s in enumerate(sides)}))
    for side in sides:
        assert side.janitor.idle(5.0)
    left = sorted(store.data)
    assert all(key.startswith(checkin.BUSY) for key in left), left  # only each rank's one `busy` key
    assert len(left) <= N


@pytest.mark.parametrize(
    "verdict",
    [checkin.Verdict(True), checkin.Verdict(False, 0, (1, 2, 3)), checkin.Verdict(False, 2, ())],
)
def test_verdicts_travel_as_plain_text(verdict):
    blob = verdict.encode()
    assert blob.isascii() and checkin.Verdict.decode(blob) == verdict


@pytest.mark.parametrize("blob", [b"", b"go ", b"go 1", b"\x80\x04K\x01.", b"ok 1 2", b"skip 1 a,b"])
def test_anything_else_in_a_verdict_key_reads_as_skip(blob):
    """A foreign or damaged verdict never sends a rank into a barrier: it reads as `skip` naming nobody."""
    assert checkin.Verdict.decode(blob) == checkin.Verdict(False)
