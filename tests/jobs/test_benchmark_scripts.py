"""Promise: every benchmark script that launches no ranks runs end to end at its smallest sizes.

A smoke test each (seconds, never figures: those come from the benchmarks themselves): the script as a
user runs it, in a process of its own under `launch.run` (its whole tree killed at the deadline),
exit code 0 and the shape of what it prints. The scripts that launch ranks or build a wheel are
smoke-tested in tests/jobs/test_benchmarks.py. Both need an accelerate release (the job tier's set-up),
so neither is in the unit tier.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import LATEST, REPO, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


BENCHMARKS = REPO / "benchmarks"
DEADLINE = 180.0  # seconds: a generous hard bound on a loaded 2-core machine, never a figure
ROW = re.compile(r"^\|( [^|]+ \|)+$")  # one Markdown table row


def _run(script, *args, timeout=DEADLINE):
    """`python benchmarks/<script> args` from the repository root, against the latest accelerate."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([accelerate_dir(LATEST), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    job = _launch.run([sys.executable, str(BENCHMARKS / script), *args], env=env, timeout=timeout, cwd=str(REPO))
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    return job


def _table(lines, header):
    """The Markdown table whose header row starts with `header`: its data rows, split into cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    assert re.match(r"^\|(-*:?-+:?\|)+$", lines[start + 1]), lines[start : start + 2]
    rows = []
    for line in lines[start + 2 :]:
        if not ROW.match(line):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_every_benchmark_script_has_a_smoke_test():
    here = Path(__file__).read_text() + (REPO / "tests" / "jobs" / "test_benchmarks.py").read_text()
    scripts = sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name != "__init__.py")
    assert "bench_scale.py" in scripts
    assert [name for name in scripts if f'"{name}"' not in here] == []


def test_bench_scale_delivers_every_record_and_leaves_no_key_at_three_ranks(tmp_path):
    out = tmp_path / "scale.json"
    small = ["--ranks", "3", "--calls", "1", "--rounds", "1", "--procs", "1", "--threads", "1"]
    job = _run("bench_scale.py", *small, "--json", str(out))
    rows = _table(job.lines, "| ranks |")
    assert [row[0] for row in rows] == ["3"] and rows[0][3] == "6 / 6" and rows[0][4] == "0", rows
    results = json.loads(out.read_text())["results"]
    assert results[0]["records_emitted"] == results[0]["records_expected"] == 6, results
    again = _run("bench_scale.py", "--from-json", str(out))  # the table of an earlier run, no measuring
    assert _table(again.lines, "| ranks |") == rows


def test_bench_cut_prints_a_row_per_record_each_cut_to_the_limit_on_both_sides():
    job = _run("bench_cut.py", "--rounds", "1")
    rows = _table(job.lines, "| record |")
    assert [row[0] for row in rows] == ["mb1", "mb9", "mb20", "emoji"], rows
    for name, *_, sent in rows[1:]:  # the cut records: at most the limit on the wire, on either side
        assert all(int(size) <= 4 * 1024 * 1024 for size in sent.split(" / ")), (name, sent)


def test_bench_records_prints_a_row_per_record_kind(tmp_path):
    out = tmp_path / "records.json"
    job = _run("bench_records.py", "--records", "100", "--rounds", "1", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    rows = [line for line in job.lines if ROW.match(line) and not line.startswith("|--")]
    assert len(rows) == 1 + len(results) >= 2, job.lines  # the header, then one row per kind


def test_bench_read_prints_each_piece_of_a_records_cost_and_its_split_floor_rebuilds_the_same_record():
    job = _run("bench_read.py", "--records", "50", "--rounds", "1")  # it asserts the two decodings agree
    rows = _table(job.lines, "| per record")
    assert [row[0] for row in rows[:3]] == ["read", "parse", "split"] and len(rows) == 6, job.lines
    assert all(float(row[1]) > 0 for row in rows), rows


def test_bench_call_cpu_prints_both_figures_of_the_package_it_measured():
    job = _run("bench_call_cpu.py")
    figures = json.loads(job.lines[-1])
    assert figures["plain_us"] > 0 and figures["in_order_1proc_us"] > 0, figures
    assert Path(figures["package"]) == REPO / "accelerate_inorder_fix", figures


def test_bench_lint_tables_a_codebase(tmp_path):
    (tmp_path / "train.py").write_text("if state.is_main_process:\n    dist.barrier()\n")
    job = _run("bench_lint.py", f"tiny={tmp_path}", "--markdown")
    rows = _table(job.lines, "| codebase |")
    assert [row[:2] for row in rows] == [["tiny", "1"]], rows


def test_plot_modes_draws_the_recorded_modes(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "modes.png"
    _run("plot_modes.py", str(BENCHMARKS / "RESULTS-modes.json"), str(target))
    assert target.read_bytes().startswith(b"\x89PNG"), target


def test_bench_collapse_prints_collapse_off_and_on_for_each_size():
    job = _run("bench_collapse.py", "--ranks", "2,8", "--pairs", "1", "--records", "16")
    rows = _table(job.lines, "| ranks |")
    assert [row[0] for row in rows] == ["2", "8"]
    assert all(float(cell) > 0 for row in rows for cell in row[1:]), rows


def test_bench_store_ops_tables_each_kind_of_store_request():
    port = _launch.free_port()
    job = _run("bench_store_ops.py", "--ops", "200", "--repeats", "1", "--port", str(port))
    rows = _table(job.lines, "| request |")
    assert len(rows) == 9 and any(row[0].startswith("delete_key") for row in rows), rows
    assert all(len(row) == 4 and float(row[2]) > 0 and float(row[3]) > 0 for row in rows), rows  # client CPU, wall
