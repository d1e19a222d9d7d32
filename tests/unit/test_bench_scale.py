"""`bench scale`: how the CLI reaches it, and that its old protocol is a faithful reference (pure logic)."""

import logging

import pytest
from fake_store import FakeStore

from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.tools import bench_scale, cli


@pytest.mark.parametrize("argv", [["bench", "scale", "--ranks", "8"], ["bench", "--scale", "--ranks", "8"]])
def test_cli_bench_scale_reaches_the_scale_benchmark(monkeypatch, argv):
    seen = []
    monkeypatch.setattr(bench_scale, "main", lambda args: seen.append(args) or {"results": []})
    assert cli.main(argv) == cli.EXIT_OK
    assert seen == [["--ranks", "8"]]


def test_legacy_protocol_gives_the_same_blocks_one_round_trip_per_step_per_rank():
    store, world_size, seen = FakeStore(), 4, []
    logger = logging.getLogger(bench_scale.LOGGER)
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.handlers[:] = [handler]
    collector = _collector.Collector(bench_scale.LegacyInbox(store, world_size), world_size, 1.0, pytest.fail)
    outboxes = [(r, bench_scale.LegacyOutbox(store, r)) for r in range(1, world_size)]
    bench_scale._post_calls(outboxes, 1, 2)
    for count in (1, 2):
        collector.block((bench_scale.SITE, count), bench_scale._record(count, 0))
    assert seen == [f"step {c} r{r}" for c in (1, 2) for r in range(world_size)]
    assert store.num_keys() == 0  # the old protocol's main process deleted every record it read
    assert [c for c in store.calls if c[0] == "delete_key"] == [("delete_key", 1)] * 6
    logger.handlers[:] = []


def test_table_puts_the_old_protocol_beside_the_new():
    new = {"ranks": 8, "main_ms_per_call": 0.5, "main_store_ms_per_call": 0.1, "rank_us_per_call": 50.0}
    old = dict(new, main_ms_per_call=1.5, rank_us_per_call=40.0)
    text = bench_scale.table({"results": [dict(new, store_keys_after=9, store_keys_by_round=[9, 9])], "old": [old]})
    assert "| 8 | 0.50 | 0.10 | 1.50 | 3.0x | 50 | 40 | 9 | 9, 9 |" in text


def test_per_record_figures_are_measured():
    figures = bench_scale.per_record(number=20)
    assert set(figures) == {"decode_us", "decode_copy_us", "emit_us"} and all(v > 0 for v in figures.values())
