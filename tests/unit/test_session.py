"""`InOrderSession` on an in-memory store (pure logic): mode agreement, a switch, a forked process, a store
that fails. The same promises on a real job: tests/jobs/test_faults.py (mode disagreement, forked workers),
tests/jobs/test_session_edges.py (a skipped first call, fork before the first call and under the lock, a
switch made on one rank, calls at exit)."""

import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from accelerate_inorder_fix import session as session_module
from accelerate_inorder_fix import testing
from accelerate_inorder_fix._call import InOrderCall, LogArgs
from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.barrier.side import BarrierSide
from accelerate_inorder_fix.barrier.turns import AT_ONCE, PlainBarriers
from accelerate_inorder_fix.config import Settings
from accelerate_inorder_fix.session import InOrderSession
from accelerate_inorder_fix.testing import InMemoryStore


SITE = ("train.py", "step", 7)


MADE = []  # every session a test made: let go of after it (atexit, torch's teardown hook)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test a process as imported (`testing.reset`): nothing said, nothing configured, nothing registered."""
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


def _sessions(store, n=2):
    MADE.extend(InOrderSession(open_store=lambda timeout: (store, None)) for _ in range(n))
    return MADE[-n:]


def test_every_rank_takes_the_main_process_mode_and_a_rank_that_differs_says_so(capsys):
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    assert main.mode(_rank(0), _settings("gather")) == "gather"
    assert rank1.mode(_rank(1), _settings("barrier")) == "gather"
    assert "differs from the main process's; using the main process's mode, gather" in capsys.readouterr().err
    for session in (main, rank1):
        session.close()


def test_a_configure_after_the_agreement_is_a_switch_every_rank_follows_and_the_last_to_close_deletes_the_words():
    """A switch made on every rank is taken by every rank. The job's words (at its start, its first call,
    each switch) outlive every reader but not the job: the last process to close deletes them."""
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    settings = [_settings("barrier"), _settings("barrier")]
    assert [s.mode(_rank(r), settings[r]) for r, s in enumerate((main, rank1))] == ["barrier", "barrier"]
    for own in settings:
        own.configure(mode="gather")
    assert [s.mode(_rank(r), settings[r]) for r, s in enumerate((main, rank1))] == ["gather", "gather"]
    main.close()
    assert {"mode", "mode/1"} <= set(store.data)  # rank 1 has not closed: it may still read them
    rank1.close()
    assert [key for key in store.data if key.startswith("mode")] == []


def test_the_main_process_silent_leaves_a_rank_on_its_own_setting_after_the_timeout(capsys):
    (rank1,) = _sessions(InMemoryStore(), n=1)
    assert rank1.mode(_rank(1), _settings("barrier", timeout=0.05)) == "barrier"
    assert "did not publish its in_order mode within 0.05 s" in capsys.readouterr().err
    rank1.close()


def test_a_store_that_fails_leaves_the_rank_on_its_own_setting_with_one_line(capsys):
    class Broken(InMemoryStore):
        def wait(self, keys, timeout=None):
            raise ConnectionError("the store went away")

    (rank1,) = _sessions(Broken(), n=1)
    assert rank1.mode(_rank(1), _settings("gather")) == "gather"
    assert "could not read the main process's in_order mode" in capsys.readouterr().err
    rank1.close()


def test_no_store_means_plain_barriers_and_gather_falls_back_to_barrier_mode(capsys):
    session = InOrderSession(open_store=lambda timeout: (None, "torch.distributed has no default process group"))
    MADE.append(session)
    settings = _settings("gather")
    assert session.mode(_rank(1), settings) == "barrier"
    assert (
        "gather mode needs a torch.distributed c10d store (torch.distributed has no default" in capsys.readouterr().err
    )
    assert isinstance(session.side(_rank(1), settings, _call()), PlainBarriers)


def test_a_forked_process_is_not_a_rank_it_never_checks_in_nor_posts(capsys):
    store = InMemoryStore()
    (rank1,) = _sessions(store, n=1)
    settings = _settings("barrier")
    rank1.mode(_rank(1), settings)  # opens the store in this process
    rank1.after_fork_in_child()  # what os.fork runs in the child: the connection is its parent's
    assert rank1.forked()
    assert rank1.side(_rank(1), settings, _call()) is AT_ONCE
    assert "a forked process logs its in_order records at once" in capsys.readouterr().err
    assert not [key for key in store.data if key.startswith("b/")]  # it checked nothing in
    rank1.close()


def test_a_forked_process_in_gather_mode_prints_its_record_itself(capsys):
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    settings = _settings("gather")
    main.mode(_rank(0), settings)
    assert rank1.mode(_rank(1), settings) == "gather"
    rank1.after_fork_in_child()
    seen = []
    logger = logging.getLogger("aif.test.session")
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.handlers[:], logger.propagate = [handler], False
    adapter = logging.LoggerAdapter(logger, {})
    rank1.call(_rank(1), settings, _call(adapter=adapter, msg="from the child"))
    assert seen == ["[RANK 1] from the child"]  # a gather-mode record names its rank wherever it is printed
    assert not [key for key in store.data if key.startswith("1/")]  # nothing posted on the parent's connection
    assert "a forked process prints its own in_order records" in capsys.readouterr().err
    for session in (main, rank1):
        session.close()


def test_call_counts_are_per_site_and_mode_and_give_each_call_its_identity():
    """Counted once, by the session, for both modes: each mode numbers its own calls at a site (the
    check-in's keys and gather's blocks each start at call 1)."""
    (session,) = _sessions(InMemoryStore(), n=1)
    settings = _settings("barrier")
    other = ("train.py", "step", 9)
    calls = [_call(site=site) for site in (SITE, SITE, other, SITE)]
    for call in calls:
        assert isinstance(session.side(_rank(1, world_size=1), settings, call), BarrierSide)
    assert [call.count for call in calls] == [1, 2, 1, 3]
    assert [session._count("gather", SITE), session._count("barrier", SITE)] == [1, 4]
    session.close()


def test_a_switch_made_on_one_rank_alone_is_refused_with_one_line_and_one_made_by_the_main_process_is_taken(capsys):
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    settings = [_settings("barrier", timeout=0.2), _settings("barrier", timeout=0.2)]
    assert [s.mode(_rank(r), settings[r]) for r, s in enumerate((main, rank1))] == ["barrier", "barrier"]
    settings[1].configure(mode="gather")  # rank 1 alone
    assert rank1.mode(_rank(1), settings[1]) == "barrier"
    assert rank1.mode(_rank(1), settings[1]) == "barrier"  # refused once, not waited for again
    err = capsys.readouterr().err
    assert (
        err.count(
            "rank 1 switched to gather mode (configure(mode=...) or ACCELERATE_INORDER_MODE) and the main process did not"
        )
        == 1
    )
    assert "keeps the job's in_order mode, barrier" in err
    settings[0].configure(mode="gather")
    settings[1].configure(mode="gather")
    assert main.mode(_rank(0), settings[0]) == "gather"  # the main process's first switch: its word mode/1
    assert rank1.mode(_rank(1), settings[1]) == "gather"  # the refused switch was not counted: rank 1 reads mode/1
    for session in (main, rank1):
        session.close()


def test_switches_on_every_rank_meet_at_the_same_word_whoever_comes_first():
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    settings = [_settings("barrier", timeout=2.0), _settings("barrier", timeout=2.0)]
    assert [s.mode(_rank(r), settings[r]) for r, s in enumerate((main, rank1))] == ["barrier", "barrier"]
    for own in settings:
        own.configure(mode="gather")
    later = threading.Timer(0.2, lambda: main.mode(_rank(0), settings[0]))
    later.start()  # the main process switches after rank 1 began waiting for its word
    start = time.monotonic()
    assert rank1.mode(_rank(1), settings[1]) == "gather"
    assert time.monotonic() - start < 1.0
    later.join()
    for session in (main, rank1):
        session.close()


def test_after_close_a_call_logs_at_once_without_barriers(capsys):
    (rank1,) = _sessions(InMemoryStore(), n=1)
    settings = _settings("barrier", timeout=0.05)
    rank1.mode(_rank(1), settings)
    rank1.close()
    assert rank1.side(_rank(1), settings, _call()) is AT_ONCE  # f0a0bfc: "plain", real barriers
    assert "in_order calls after this process's exit began are logged at once" in capsys.readouterr().err


def test_a_child_forked_while_a_thread_holds_the_lock_or_before_any_call_is_not_a_rank_and_never_blocks():
    """Forked before the first call (no store yet) and while another thread is inside an in_order call."""
    (session,) = _sessions(InMemoryStore(), n=1)
    settings = _settings("barrier")
    holding, release = threading.Event(), threading.Event()

    def inside_a_call():
        with session.lock:
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=inside_a_call)
    thread.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: a bounded try, then out without running the parent's test machinery
        signal.alarm(5)
        ok = session.forked() and session.mode(_rank(1), settings) == "barrier"
        ok = ok and session.side(_rank(1), settings, _call()) is AT_ONCE
        os._exit(0 if ok else 1)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # f0a0bfc: SIGALRM (blocked on the lock), or checked in
    assert not session.forked()


def test_the_word_written_when_the_process_group_started_spares_the_first_post_its_wait(capsys):
    """The main process skips (or is late to) its first call: a rank whose setting has not changed since the
    process group started takes the word the main process wrote then, without waiting; if the main process
    then changed its mode alone, the rank follows it from its next call, and says so."""
    store = InMemoryStore()
    main, rank1 = _sessions(store)
    settings = [_settings("gather", timeout=2.0), _settings("gather", timeout=2.0)]
    store.set(
        session_module.mode.switch_key(session_module.mode.STARTED), b"gather"
    )  # what `mode.publish_started` writes on the main process
    rank1._started = ("gather", settings[1].mode_generation)
    start = time.monotonic()
    assert rank1.mode(_rank(1), settings[1]) == "gather"
    assert time.monotonic() - start < 0.5  # f0a0bfc: the whole timeout, waiting for the main process's first call
    settings[0].configure(mode="barrier")  # the main process alone, before its first call
    main._started = ("gather", 0)
    assert main.mode(_rank(0), settings[0]) == "barrier"
    assert rank1.mode(_rank(1), settings[1]) == "barrier"
    assert "the main process changed its in_order mode from gather to barrier alone" in capsys.readouterr().err
    for session in (main, rank1):
        session.close()
