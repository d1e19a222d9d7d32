"""Promise: in gather mode, an in_order call only the main process makes, in a loop
next to an in_order call every rank makes, costs one timeout for its call site in all, and every
every-rank call's block comes out whole, exactly once and in rank order, never split by another call's
lines; the one warning names only the ranks that missed the main-only call.

One job (4 CPU ranks, accelerate 1.15.0, `ACCELERATE_INORDER_TIMEOUT=2`) runs scripts/main_only_loop.py's
cases, each a loop of two call sites of its own: 5 and 20 steps with a collective per step, the
main-only call before the every-rank one (`steps5`, `steps20`) or after it (`all_first5`, `all_first20`),
and 5 steps without a collective (`free5`). Before this was fixed each main-only call waited a timeout
(5 and 20 per site), and the every-rank blocks came out split (rank 0 alone, the others later).
"""

import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix._diagnostics import WAY_OUT
from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


SCRIPT = SCRIPTS / "main_only_loop.py"
TIMEOUT = 2.0
NPROC = 4
STAGGER = 0.02  # main_only_loop.STAGGER: rank k > 0 waits (NPROC - k) x this before each every-rank call
CASES = {"steps5": 5, "steps20": 20, "all_first5": 5, "all_first20": 20, "free5": 5}
RECORD = re.compile(r"^\[RANK (\d)\] (\w+?)_(main|all)#(\d+) r(\d) @@\S+ by=r(\d)$")
WARNING = re.compile(
    r"in_order call at main_only_loop\.py:(\d+) in \S+ \(call (\d+) from there\): ranks 1, 2, 3 sent no"
)


def _program_order(case, steps):
    """Each step's records as the main process must emit them: its main-only one, the every-rank block."""
    order = []
    for step in range(1, steps + 1):
        main, block = [("main", step, 0)], [("all", step, rank) for rank in range(NPROC)]
        order += block + main if case.startswith("all_first") else main + block
    return order


def _main_only_lines():
    """The script's line numbers of the main-only calls (the sites the warnings must name)."""
    source = SCRIPT.read_text().splitlines()
    return {n for n, line in enumerate(source, 1) if "_main#{step}" in line}


def _result(lines, case, key):
    found = [line.split("=", 1)[1] for line in lines if line.startswith(f"@@RESULT {case} r0 {key}=")]
    assert len(found) == 1, (case, key, found)
    return float(found[0])


def test_main_only_call_costs_one_timeout_per_site_and_every_rank_blocks_stay_whole_and_ordered():
    env = _launch.scenario_env(True, "gather", [accelerate_dir("1.15.0"), str(REPO)])
    env["ACCELERATE_INORDER_TIMEOUT"] = str(TIMEOUT)
    job = _launch.run(_launch.launch_command([str(SCRIPT), ",".join(CASES)], NPROC), env=env, timeout=110, stall=30)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    records = [m.groups() for m in map(RECORD.match, job.lines) if m]
    assert records and all(prefix == rank and by == "0" for prefix, *_, rank, by in records), records[:8]
    assert any(rank == "1" for *_, rank, _by in records)  # another rank's record, printed by the main process
    for case, steps in CASES.items():
        emitted = [(kind, int(step), int(rank)) for _p, c, kind, step, rank, _by in records if c == case]
        # Exactly once each, blocks whole and in rank order, never interleaved with another call's line.
        assert emitted == _program_order(case, steps), (case, emitted)
        # One timeout for the main-only site in all; the every-rank calls are not waited for past it.
        assert _result(job.lines, case, "slow_calls") == 1, case
        assert 0.9 * TIMEOUT <= _result(job.lines, case, "main_calls") <= 1.5 * TIMEOUT, case
        stagger = steps * (NPROC - 1) * STAGGER  # rank 1's wait before each every-rank call
        assert _result(job.lines, case, "in_calls") - stagger <= 1.5 * TIMEOUT, case
        assert {line for line in job.lines if line.startswith(f"@@RESULT {case} ") and "sum=" in line} == {
            f"@@RESULT {case} r{rank} sum=10.0" for rank in range(NPROC)
        }
        assert {line for line in job.lines if line.startswith(f"@@DONE {case} ")} == {
            f"@@DONE {case} r{rank}" for rank in range(NPROC)
        }
    warnings = [line for line in job.stderr.splitlines() if "sent no record" in line]
    assert len(warnings) == len(CASES), warnings  # one per main-only site
    sites = set()
    for line in warnings:
        where = WARNING.search(line)
        assert where and where[2] == "1" and "sent no record within 2 s (ACCELERATE_INORDER_TIMEOUT)" in line, line
        assert "Cost: a wait of 2 s. Next: this call's records of rank 0 were printed without them" in line, line
        assert line.endswith(
            "Rule: an in_order call is collective: every rank must make it. Way out: " + WAY_OUT + "."
        ), line
        sites.add(int(where[1]))
    assert sites == _main_only_lines(), (sites, warnings)
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
