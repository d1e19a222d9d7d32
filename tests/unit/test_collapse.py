"""Promise: with collapse on, a call's identical records print once, at the first one's place, tagged with
every rank that sent them; records that differ (by a digit, a level, a logger, a host) print per rank
(pure logic: the grouping, the tag, and the collector's printing from a block already collected)."""

import logging
import sys

import pytest

from accelerate_inorder_fix import _origin, config
from accelerate_inorder_fix.gather import collapse, collector, queues, records
from accelerate_inorder_fix.testing import InMemoryStore


LOGGER = "aif.test.collapse"


@pytest.mark.parametrize(
    "ranks,text",
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], "0-7"),
        ([1, 3, 5, 7], "1,3,5,7"),
        ([0, 1, 2, 3, 6], "0-3,6"),
        ([4, 5], "4-5"),
        ([9], "9"),
        ([0, 2, 3, 4, 1000, 1001, 1023], "0,2-4,1000-1001,1023"),
    ],
)
def test_ranks_are_written_as_runs(ranks, text):
    assert _origin.rank_spans(ranks) == text
    assert _origin.span_tag(ranks) == f"[RANK {text}] "


def test_a_span_of_one_rank_is_the_single_rank_tag_upstream_gives():
    """The collapsed tag has the shape of accelerate 1.13+'s `[RANK n] ` (and of ours before 1.13)."""
    assert _origin.span_tag([3]) + "hello" == _origin.RANK_TAG.format(3) + "hello" == "[RANK 3] hello"


def _record(rank, text, level=logging.INFO, name=LOGGER, host=None, args=None):
    """A gather-mode record as the main process holds it: its message tagged by its origin."""
    msg = (f"[{host}] " if host else "") + _origin.span_tag([rank]) + text
    record = logging.LogRecord(name, level, "train.py", 10, msg, args, None)
    record.rank, record.hostname = rank, host or "node-a"
    return record


def _lines(records):
    return [(r.getMessage(), r.ranks) for r in collapse.collapse(list(enumerate(records)))]


def test_identical_records_print_once_at_the_first_ones_place_naming_every_rank():
    texts = ["epoch 3 done", "loss 0.31", "epoch 3 done", "loss 0.32", "epoch 3 done", "epoch 3 done"]
    assert _lines([_record(rank, text) for rank, text in enumerate(texts)]) == [
        ("[RANK 0,2,4-5] epoch 3 done", [0, 2, 4, 5]),
        ("[RANK 1] loss 0.31", [1]),  # numbers are never canonicalised: 0.31 and 0.32 stay two lines
        ("[RANK 3] loss 0.32", [3]),
    ]


def test_the_formatted_message_is_compared_not_its_format():
    """`%d` with 3 on every rank is one line; its args are merged into the collapsed line's text."""
    records = [_record(rank, "epoch %d done", args=(3,)) for rank in range(4)]
    [(text, ranks)] = _lines(records)
    assert (text, ranks) == ("[RANK 0-3] epoch 3 done", [0, 1, 2, 3])


def test_a_different_level_logger_or_traceback_is_a_different_line():
    records = [
        _record(0, "same"),
        _record(1, "same", level=logging.WARNING),
        _record(2, "same", name=LOGGER + ".other"),
        _record(3, "same"),
        _record(4, "same"),
    ]
    records[4].exc_text = "Traceback ...\nValueError: 4"
    assert _lines(records) == [
        ("[RANK 0,3] same", [0, 3]),
        ("[RANK 1] same", [1]),
        ("[RANK 2] same", [2]),
        ("[RANK 4] same", [4]),
    ]


def test_over_several_hosts_one_line_per_host_with_its_host_tag():
    hosts = ["node-0", "node-0", "node-1", "node-1"]
    records = [_record(rank, "shard loaded", host=host) for rank, host in enumerate(hosts)]
    assert _lines(records) == [
        ("[node-0] [RANK 0-1] shard loaded", [0, 1]),
        ("[node-1] [RANK 2-3] shard loaded", [2, 3]),
    ]


def test_a_record_without_its_own_rank_tag_is_never_grouped():
    """A filter or record factory that rewrote the message: the record goes out as it came."""
    records = [_record(rank, "same") for rank in range(3)]
    records[1].msg = "same"
    records[2].msg = "[RANK 0] same"  # another rank's tag: not this record's
    assert _lines(records) == [("[RANK 0] same", [0]), ("same", [1]), ("[RANK 0] same", [2])]


def test_a_message_that_fails_to_format_is_not_grouped_and_does_not_raise():
    records = [_record(rank, "bad %d", args=("x",)) for rank in range(2)]
    assert [r.ranks for r in collapse.collapse(list(enumerate(records)))] == [[0], [1]]


class _Seen(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append((record.getMessage(), getattr(record, "ranks", None)))


@pytest.mark.parametrize("on", [False, True])
def test_the_collector_collapses_a_block_only_with_the_setting_on(monkeypatch, on):
    monkeypatch.setattr(config.SETTINGS, "_collapse", on)
    seen = _Seen()
    logger = logging.getLogger(LOGGER)
    monkeypatch.setattr(logger, "handlers", [seen])
    monkeypatch.setattr(logger, "propagate", False)
    main = collector.Collector(queues.Inbox(InMemoryStore(), 4), 4)  # every record collected already
    identity = (("train.py", "step", 10), 1)
    texts = ["epoch 3 done", "epoch 3 done", "rank 2 is special", "epoch 3 done"]
    main.pending[identity] = {rank: _record(rank, texts[rank]) for rank in range(1, 4)}
    main.emit_call(identity, _record(0, texts[0]), 1.0)
    if on:
        assert seen.lines == [("[RANK 0-1,3] epoch 3 done", [0, 1, 3]), ("[RANK 2] rank 2 is special", [2])]
    else:
        assert seen.lines == [(f"[RANK {rank}] {text}", None) for rank, text in enumerate(texts)]


def test_the_main_processs_traceback_is_compared_as_the_ranks_render_theirs():
    """`logger.exception(..., in_order=True)` on every rank: the main process's record holds `exc_info`,
    the others' their rendered `exc_text`; the same traceback is one line."""
    try:
        raise ValueError("shard 3 is missing")
    except ValueError:
        exc_info = sys.exc_info()
    main = _record(0, "load failed")
    main.exc_info = exc_info
    others = [_record(rank, "load failed") for rank in (1, 2)]
    for record in others:
        record.exc_text = records._TRACEBACKS.formatException(exc_info)  # as a rank renders it
    lines = collapse.collapse(list(enumerate([main, *others])))
    assert [(r.getMessage(), r.ranks) for r in lines] == [("[RANK 0-2] load failed", [0, 1, 2])]
    assert lines[0].exc_info is exc_info  # the handler renders the first record's own traceback


def test_a_record_a_filter_rewrote_is_grouped_by_its_rewritten_text(monkeypatch):
    """Each rank's tag is added after its logger's filters: a rewritten record is compared as rewritten."""
    from types import SimpleNamespace

    from accelerate_inorder_fix._call import LogArgs

    def hide(record):
        record.msg, record.args = ("loss hidden", ()) if record.args[0] < 3 else (record.msg, record.args)
        return True

    monkeypatch.setattr(records, "upstream_tags", lambda: False)
    logger = logging.getLogger("aif.test.collapse.filtered")
    logger.setLevel(logging.DEBUG)
    logger.addFilter(hide)
    try:
        adapter = SimpleNamespace(isEnabledFor=lambda level: True, process=lambda msg, kw: (msg, kw), logger=logger)
        lines = [
            (
                rank,
                records.capture(
                    LogArgs(adapter, logging.INFO, "loss %d", (rank,), {}), _origin.Origin(rank, "h", False)
                ),
            )
            for rank in range(4)
        ]
    finally:
        logger.removeFilter(hide)
    assert [(r.msg, r.ranks) for r in collapse.collapse(lines)] == [
        ("[RANK 0-2] loss hidden", [0, 1, 2]),
        ("[RANK 3] loss 3", [3]),
    ]
