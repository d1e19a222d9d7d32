"""The store-scale simulator (benchmarks/bench_scale.py, outside the wheel): the CLI points there, the package
never imports it, and the old protocol it keeps is a faithful reference (pure logic)."""

import ast
import dataclasses
import logging
from pathlib import Path

import pytest
from fake_store import FakeStore

from accelerate_inorder_fix.cli import main
from accelerate_inorder_fix.gather import collector as _collector
from accelerate_inorder_fix.gather import copies, queues
from benchmarks import bench_scale


PACKAGE = Path(__file__).resolve().parents[2] / "accelerate_inorder_fix"


@pytest.mark.parametrize("argv", [["bench", "scale", "--ranks", "8"], ["bench", "--scale", "--ranks", "8"]])
def test_cli_bench_scale_says_where_the_simulator_went(capsys, argv):
    assert main.main(argv) == main.EXIT_USAGE
    assert "python benchmarks/bench_scale.py" in capsys.readouterr().err


def test_the_simulator_measures_the_current_protocol_beside_the_old():
    assert list(bench_scale.PROTOCOLS) == ["new", "old"]
    assert not list(PACKAGE.rglob("bench_scale.py"))


def test_the_package_never_imports_the_developer_benchmarks():
    imported = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:  # absolute only
                imported.add(node.module)
    assert "typing" in imported
    assert not [name for name in imported if name.split(".")[0] in ("benchmarks", "bench_records", "bench_scale")]
    assert not list(PACKAGE.rglob("bench_records.py"))


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
        collector.emit_call((bench_scale.SITE, count), bench_scale._record(count, 0))
    assert seen == [f"[RANK {r}] step {c} r{r}" for c in (1, 2) for r in range(world_size)]
    assert store.num_keys() == 0  # the old protocol's main process deleted every record it read
    assert [c for c in store.calls if c[0] == "delete_key"] == [("delete_key", 1)] * 6
    logger.handlers[:] = []


def test_table_puts_the_old_protocol_beside_the_new_for_one_arrival():
    new = {
        "ranks": 8, "arrival": "concurrent", "protocol": "new", "main_ms_per_call": 0.5, "main_cpu_ms_per_call": 0.2,
        "main_store_ms_per_call": 0.1, "rank_us_per_call": 50.0, "records_emitted": 720, "records_expected": 720,
        "posts_late_ms_p90": 0.0, "store_keys_after": 9,
    }  # fmt: skip
    old = dict(new, protocol="old", main_ms_per_call=1.5, rank_us_per_call=40.0)
    floor = dict(new, arrival="preposted", main_ms_per_call=0.25)
    text = bench_scale.table([new, old, floor], "concurrent")
    assert "| 8 | 0.50 | 0.20 | 0.10 | 1.50 | 3.0x | 50 | 40 | 720 / 720 | 0.0 | 9 |" in text
    assert "0.25" not in text


def test_concurrent_arrivals_spread_each_call_over_its_step_the_same_for_every_protocol():
    schedule = bench_scale.Schedule(start=100.0, first=9, step=0.06, spread=0.01, seed=0)
    times = [schedule.at(rank, count) - 100.0 for count in (9, 10) for rank in range(64)]
    assert all(0.0 <= t <= 0.01 for t in times[:64]) and all(0.06 <= t <= 0.07 for t in times[64:])
    assert len(set(times)) == len(times)  # drawn, not all at once
    assert times == [dataclasses.replace(schedule).at(r, c) - 100.0 for c in (9, 10) for r in range(64)]


def test_a_decoder_that_drops_delta_copies_fails_the_count(monkeypatch):
    """The mutation the count exists for: delta copies decoded into nothing emit fewer records, silently."""
    store, world_size = FakeStore(), 4
    real = copies.CopyReader.decode

    def drops_deltas(self, rank, line, current=None):
        decoded = real(self, rank, line, current)
        return (decoded[0], None) if decoded is not None and len(line) == copies.DeltaCopy.LENGTH else decoded

    sink, counter = bench_scale._handlers()
    outboxes = [(r, queues.Outbox(store, r, background=False)) for r in range(1, world_size)]
    collector = _collector.Collector(queues.StoreInbox(store, world_size), world_size, 1.0, pytest.fail)
    try:
        for mutated in (False, True):
            if mutated:
                monkeypatch.setattr(copies.CopyReader, "decode", drops_deltas)
            before = counter.count
            for count in range(1 + 4 * mutated, 5 + 4 * mutated):
                bench_scale._post_calls(outboxes, count, 1)
                collector.emit_call((bench_scale.SITE, count), bench_scale._record(count, 0))
            emitted = counter.count - before
            if not mutated:
                bench_scale.check_delivery("sound", emitted, 4 * world_size, [])
                continue
            with pytest.raises(bench_scale.CountError, match="emitted 4 records, the ranks posted 16"):
                bench_scale.check_delivery("mutated", emitted, 4 * world_size, [])  # only rank 0's came out
    finally:
        sink.close()
        logging.getLogger(bench_scale.LOGGER).handlers[:] = []


def test_per_record_figures_are_measured():
    figures = bench_scale.per_record(number=20)
    names = {"decode_us", "decode_copy_us", "emit_us", "parse_us", "decode_delta_us", "build_us"}
    assert set(figures) == names and all(v > 0 for v in figures.values())


def test_the_store_inbox_and_the_old_one_implement_the_collectors_record_source_protocol():
    assert isinstance(queues.StoreInbox(FakeStore(), 4), _collector.RecordSource)
    assert isinstance(bench_scale.LegacyInbox(FakeStore(), 4), _collector.RecordSource)
    assert not isinstance(object(), _collector.RecordSource)
