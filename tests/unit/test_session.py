"""`InOrderSession` on an in-memory store (pure logic): the mode fixed per job from the main process's word,
a session per process group, per-site locks, forked children, a store that fails. The same promises on real
jobs: tests/jobs/test_any_launcher.py (launchers, stores, a second process group, threads, workers)."""

import logging
import threading
from types import SimpleNamespace

import pytest

from accelerate_inorder_fix import session as session_module
from accelerate_inorder_fix import testing
from accelerate_inorder_fix._call import InOrderCall, LogArgs
from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.barrier.side import BarrierSide
from accelerate_inorder_fix.barrier.turns import PlainBarriers
from accelerate_inorder_fix.config import Settings
from accelerate_inorder_fix.gather.collector import GatherSide
from accelerate_inorder_fix.session import WORD_KEY, InOrderSession
from accelerate_inorder_fix.store.connection import Connection
from accelerate_inorder_fix.testing import InMemoryStore


SITE = ("train.py", "step", 7)
OTHER = ("train.py", "step", 9)
MADE = []  # every session a test made: let go of after it (atexit, torch's teardown hook)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    monkeypatch.delenv("ACCELERATE_INORDER_MODE", raising=False)
    testing.reset()
    yield
    while MADE:
        MADE.pop().reset()
    testing.reset()


def _rank(rank, world_size=2):
    return SimpleNamespace(process_index=rank, num_processes=world_size, is_main_process=rank == 0)


def _settings(mode=None, timeout=0.2):
    settings = Settings()
    settings.configure(mode=mode, timeout=timeout)
    return settings


def _call(rank=1, site=SITE, adapter=None, msg="hello", timeout=0.2):
    """One in_order call, as the wrapper makes it (a quiet logger unless `adapter`)."""
    if adapter is None:
        logger = logging.getLogger("aif.test.session.quiet")
        logger.handlers[:], logger.propagate = [logging.NullHandler()], False
        adapter = logging.LoggerAdapter(logger, {})
    return InOrderCall(site, LogArgs(adapter, logging.WARNING, msg, (), {}), Origin(rank, "node", False), timeout)


class Group:
    """A process group's stand-in: `group.now` is the default group (None: destroyed)."""

    def __init__(self):
        self.now = object()


def _sessions(store, n=2, group=None):
    group = group or Group()
    MADE.extend(
        InOrderSession(lambda timeout: (Connection(store, "", timeout), None), lambda: group.now) for _ in range(n)
    )
    return MADE[-n:]


class Recorder:
    """A side that notes each call it takes (and can hold one until told)."""

    def __init__(self, store, rank, world_size, *rest):
        self.store, self.rank, self.calls, self.closed = store, rank, [], 0
        self.hold = {}  # site -> threading.Event the call at that site waits for
        self.before = None  # what `logged_before_the_word` was told

    def call(self, call):
        self.calls.append(call.identity)
        event = self.hold.get(call.site)
        if event is not None:
            assert event.wait(5), "the call at another site never ran meanwhile"

    def close(self):
        self.closed += 1

    def logged_before_the_word(self, counts):
        self.before = dict(counts)


def test_every_rank_takes_the_main_process_mode_and_a_rank_that_differs_says_so_once(capsys):
    main, rank1 = _sessions(InMemoryStore())
    main.side(_rank(0), _settings("gather"), 0.2)
    assert main.mode == "gather"
    rank1.side(_rank(1), _settings("barrier"), 0.2)
    rank1.side(_rank(1), _settings("barrier"), 0.2)
    assert rank1.mode == "gather" and isinstance(rank1.current_side, GatherSide)
    assert capsys.readouterr().err.count("differs from the main process's; using the main process's mode, gather") == 1


def test_a_mode_set_after_the_first_call_is_said_once_and_not_taken(capsys):
    store = InMemoryStore()
    (main,) = _sessions(store, n=1)
    settings = _settings("barrier")
    side = main.side(_rank(0), settings, 0.2)
    settings.configure(mode="gather")
    for _ in range(3):
        assert main.side(_rank(0), settings, 0.2) is side
    assert main.mode == "barrier"
    assert (
        capsys.readouterr().err.count(
            "after this job's mode was fixed, when its process group started (inside Accelerator(): set the mode "
            "before it); it stays barrier"
        )
        == 1
    )


def test_the_main_process_silent_costs_a_rank_the_calls_timeout_and_its_record_is_logged_at_once(capsys):
    main, rank1 = _sessions(InMemoryStore())
    seen = []
    logger = logging.getLogger("aif.test.session.seen")
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.handlers[:], logger.propagate = [handler], False
    rank1.call(_rank(1), _settings(), _call(adapter=logging.LoggerAdapter(logger, {}), msg="alone", timeout=0.05))
    assert seen == ["alone"] and rank1.mode is None
    assert "rank 1: no word from the main process within 0.05 s" in capsys.readouterr().err
    main.side(_rank(0), _settings("gather"), 0.2)  # the main process comes: the next call joins its session
    assert rank1.side(_rank(1), _settings(), 0.2) is not None and rank1.mode == "gather"


def test_a_call_logged_at_once_for_want_of_the_main_s_word_is_numbered_all_the_same(monkeypatch, capsys):
    """The main process's call there is numbered: so is this rank's, or each later record of the rank would go
    into the block of the main's previous call (found by explorer_path: a connection failing at the word); and
    the side is told of it, so that the main's own call there is given up rather than paired with a later one."""
    monkeypatch.setattr(session_module, "BarrierSide", Recorder)
    main, rank1 = _sessions(InMemoryStore())
    rank1.call(_rank(1), _settings(), _call(1, timeout=0.05))  # no word yet: logged at once
    assert rank1.current_side is None and "no word from the main process" in capsys.readouterr().err
    for _ in range(2):
        main.call(_rank(0), _settings(), _call(0))
    rank1.call(_rank(1), _settings(), _call(1))
    assert main.current_side.calls == [(SITE, 1), (SITE, 2)] and rank1.current_side.calls == [(SITE, 2)]
    assert main.current_side.before is None and rank1.current_side.before == {SITE: 1}


def test_a_store_that_fails_leaves_the_call_logged_at_once_with_one_line(capsys):
    class Failing(InMemoryStore):
        def check(self, keys):
            raise RuntimeError("store is gone")

    (rank1,) = _sessions(Failing(), n=1)
    assert rank1.side(_rank(1), _settings(), 0.2) is None
    assert "could not read the main process's in_order mode (RuntimeError('store is gone'))" in capsys.readouterr().err


def test_no_process_group_means_plain_barriers_and_one_process_means_at_once():
    session = InOrderSession(lambda timeout: (None, "no store"), lambda: None)
    MADE.append(session)
    assert isinstance(session.side(_rank(1), _settings("gather"), 0.2), PlainBarriers)
    assert session.side(_rank(0, world_size=1), _settings(), 0.2) is None


def test_a_child_forked_while_the_group_exists_is_not_a_rank_and_one_forked_before_is(monkeypatch):
    store, group = InMemoryStore(), Group()
    main, rank1 = _sessions(store, group=group)
    main.side(_rank(0), _settings(), 0.2)
    rank1.side(_rank(1), _settings(), 0.2)
    rank1.after_fork_in_child()  # what os.fork runs in a DataLoader worker: the group exists
    assert not rank1.member and rank1.side(_rank(1), _settings(), 0.2) is None
    group.now = None
    (launched,) = _sessions(store, n=1, group=group)
    launched.after_fork_in_child()  # a launcher's rank, forked before its group exists
    assert launched.member


def test_call_counts_are_per_site_and_give_each_call_its_identity(monkeypatch):
    monkeypatch.setattr(session_module, "BarrierSide", Recorder)
    main, _ = _sessions(InMemoryStore())
    for site in (SITE, SITE, OTHER, SITE):
        main.call(_rank(0), _settings(), _call(0, site))
    assert main.current_side.calls == [(SITE, 1), (SITE, 2), (OTHER, 1), (SITE, 3)]


def test_a_new_process_group_is_a_new_session_under_a_new_prefix_and_the_old_ones_keys_go(monkeypatch):
    monkeypatch.setattr(session_module, "BarrierSide", Recorder)
    store, group = InMemoryStore(), Group()
    main, rank1 = _sessions(store, group=group)
    sides = []
    for _ in range(2):
        for session, rank in ((main, 0), (rank1, 1)):
            session.call(_rank(rank), _settings(), _call(rank))
        sides.append((main.current_side, rank1.current_side))
        assert sides[-1][0].store.prefix == sides[-1][1].store.prefix  # both ranks on this group's keys
        for session in (main, rank1):
            session.end()  # the hook on destroy_process_group
        assert WORD_KEY not in store.data and all(side.closed == 1 for side in sides[-1])
        group.now = object()  # init_process_group again
    assert sides[0][0].store.prefix != sides[1][0].store.prefix
    assert sides[1][0].calls == [(SITE, 1)]  # counted afresh


def test_calls_at_different_sites_from_two_threads_run_at_once(monkeypatch):
    """A call waiting at one site (for the other ranks) does not hold up another thread's call at another."""
    monkeypatch.setattr(session_module, "BarrierSide", Recorder)
    (main,) = _sessions(InMemoryStore(), n=1)
    main.side(_rank(0), _settings(), 0.2)
    held = main.current_side.hold[SITE] = threading.Event()
    thread = threading.Thread(target=main.call, args=(_rank(0), _settings(), _call(0, SITE)))
    thread.start()
    main.call(_rank(0), _settings(), _call(0, OTHER))  # would wait for the lock the held call holds
    held.set()
    thread.join(5)
    assert sorted(main.current_side.calls) == [(SITE, 1), (OTHER, 1)]


def test_after_close_a_call_logs_at_once_and_the_main_deletes_its_word():
    store = InMemoryStore()
    main, _ = _sessions(store)
    main.side(_rank(0), _settings(), 0.2)
    assert WORD_KEY in store.data
    main.close()
    assert WORD_KEY not in store.data and main.side(_rank(0), _settings(), 0.2) is None


def test_the_barrier_side_is_built_from_the_store_rank_and_size():
    main, _ = _sessions(InMemoryStore())
    assert isinstance(main.side(_rank(0), _settings(), 0.2), BarrierSide)


def test_a_barrier_mode_session_says_once_that_collapse_applies_to_gather_mode_only(capsys):
    main, _ = _sessions(InMemoryStore())
    settings = _settings("barrier")
    main.side(_rank(0), settings, 0.2)
    assert capsys.readouterr().err == ""  # off: nothing to say
    settings.configure(collapse=True)
    for _ in range(3):
        main.end()
        main.side(_rank(0), settings, 0.2)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "applies to gather mode only" in lines[0], lines


@pytest.mark.parametrize(
    "blob",
    [
        b"gather",
        b"gather abc def",
        b"\xff\xfe 0123456789ab",
        b"bogus 0123456789ab",
        b"gather 0123",
        b"",
        b"x" * 10_000,
    ],
)
def test_a_word_that_is_not_one_is_one_warning_and_the_call_logged_at_once(blob, capsys):
    """Whatever the main process's key holds, a rank's call never raises: it logs at once and says so once."""
    store = InMemoryStore()
    (rank1,) = _sessions(store, n=1)
    store.set(WORD_KEY, blob)
    seen = []
    logger = logging.getLogger("aif.test.session.badword")
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.handlers[:], logger.propagate = [handler], False
    for n in range(3):
        rank1.call(_rank(1), _settings(), _call(adapter=logging.LoggerAdapter(logger, {}), msg=f"m{n}"))
    assert seen == ["m0", "m1", "m2"] and rank1.mode is None
    assert capsys.readouterr().err.count("in_order word in the job's store is not one") == 1


def test_the_word_read_is_the_word_written():
    assert session_module.read_word(b"gather 0123456789ab") == ("gather", "0123456789ab")
    assert session_module.read_word(b"barrier 0123456789ab") == ("barrier", "0123456789ab")
