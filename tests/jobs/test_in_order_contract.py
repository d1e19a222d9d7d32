"""Promise: with the patch, every in_order scenario is ordered, complete and hang-free on every
supported release, at 2 and 4 ranks; without it, the same runs reproduce upstream's bugs.

Real jobs: `torchrun --nproc_per_node N` on CPU gloo, one job per (release, world size) for the
patched runs and one job per scenario for the unpatched ones (a deadlock must not hide the others).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import RELEASES, accelerate_dir, release_line

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import scenarios


NAMES = list(scenarios.SCENARIOS)
STUCK = {"deadlock", "desync"}  # a skipped barrier shows as one or the other, depending on timing

# Upstream's behaviour per release line (see README): scenario -> the verdicts it can give.
UNPATCHED_BUGS = {
    "0.20": {
        "default": STUCK,
        "all_processes": {"unordered"},
        "rank_levels": STUCK,
        "disabled_odd": STUCK,
        "exception": STUCK,
        "many": STUCK,
        "caller": {"caller"},
    },
    "0.31": {
        "default": STUCK,
        "all_processes": {"unordered"},
        "rank_levels": STUCK,
        "disabled_odd": STUCK,
        "exception": STUCK,
        "many": STUCK,
    },
    "1.13": {"rank_levels": STUCK, "disabled_odd": STUCK},
}
# The newest release of each log body runs at 4 ranks; the others at 2 to keep CI short.
UNPATCHED_NPROC = {"0.21.0": 4, "1.12.0": 4, "1.16.0": 4, "0.34.2": 2, "1.13.0": 2, "1.15.0": 2}


def _verdicts(job, nproc, names):
    said = job.lines + job.stderr.splitlines()  # the package's warnings are on stderr
    return {name: scenarios.check(name, nproc, said) for name in names}


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("version", RELEASES)
def test_patched_scenarios_are_ordered(version, nproc):
    job = _launch.run_scenarios(
        NAMES, nproc, patched=True, pythonpath=[accelerate_dir(version)], timeout=240, stall=None
    )
    assert job.killed is None, f"patched job hung: {job}\n{job.stderr[-2000:]}"
    bad = {name: v for name, v in _verdicts(job, nproc, NAMES).items() if v[0] != "ordered"}
    assert not bad, f"{version} x{nproc}: {bad}"
    assert job.returncode == 0, job.stderr[-3000:]
    # Barrier mode: each rank writes its own records.
    assert all(by == rank for name in NAMES for (_, rank), by in scenarios.writers(job.lines, name).items())


@pytest.mark.parametrize("version", RELEASES)
def test_unpatched_release_shows_the_bug(version):
    """One job per buggy scenario (a deadlock must not hide the others), three at a time: a
    deadlocked job only waits, so running them side by side costs little."""
    bugs = UNPATCHED_BUGS[release_line(version)]
    nproc = UNPATCHED_NPROC[version]

    def run(name):
        return _launch.run_scenarios(
            [name], nproc, patched=False, pythonpath=[accelerate_dir(version)], timeout=120, stall=8
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = dict(zip(bugs, pool.map(run, bugs)))
    verdicts = {name: scenarios.check(name, nproc, job.lines) for name, job in jobs.items()}
    unexpected = {name: v for name, v in verdicts.items() if v[0] not in bugs[name]}
    assert not unexpected, f"{version}: {unexpected}"


def test_logger_created_before_the_patch_is_covered():
    """The package imported after `get_logger()` already returned: the old logger is fixed too."""
    version = "1.12.0"  # `default` deadlocks there without the patch
    job = _launch.run_scenarios(
        ["default", "rank_levels"], 4, patched="late", pythonpath=[accelerate_dir(version)], timeout=180, stall=None
    )
    assert job.killed is None, job
    assert _verdicts(job, 4, ["default", "rank_levels"]) == {
        "default": ("ordered", ""),
        "rank_levels": ("ordered", ""),
    }


@pytest.mark.parametrize("mode", ["barrier", "gather"])
def test_core_scenarios_ordered_at_8_ranks(mode):
    """The usual 8-GPU node, as 8 CPU ranks: every core scenario ordered and complete, in both modes."""
    job = _launch.run_scenarios(
        NAMES, 8, patched=True, mode=mode, pythonpath=[accelerate_dir("1.15.0")], timeout=300, stall=90
    )
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-3000:])
    assert job.elapsed < 240, job
    bad = {name: v for name, v in _verdicts(job, 8, NAMES).items() if v[0] != "ordered"}
    assert not bad, bad
    for name in NAMES:
        for (call, rank), by in scenarios.writers(job.lines, name).items():
            in_order = not (name == "caller" and call == 2)  # caller's call 2 is a plain call
            assert by == (0 if mode == "gather" and in_order else rank), (name, call, rank, by)
