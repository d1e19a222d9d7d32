"""How `check` turns a job's output into table words and an exit code (pure logic, no ranks)."""

import argparse

import pytest
from conftest import REPO

from accelerate_inorder_fix.cli import bench, scenarios
from accelerate_inorder_fix.cli import check as _check
from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import main as cli
from accelerate_inorder_fix.cli.launch import Job


def _lines(name, ranks, order=None):
    """Output of a clean run of scenario `default`-like `name` on `ranks` ranks."""
    lines = [f"{name}#1 r{r} at=f:1 @@f:1" for r in (order or range(ranks))]
    lines += [f"{scenarios.RESULT} {name} r{r} sum={ranks * (ranks + 1) / 2}" for r in range(ranks)]
    return lines + [f"{scenarios.DONE} {name} r{r}" for r in range(ranks)]


def test_words_for_each_kind_of_outcome():
    ok = _check.judge("default", 2, Job(_lines("default", 2), "", 0, None, 1.0))
    assert (ok.word, ok.ok) == ("ordered", True)
    reversed_ = _check.judge("default", 2, Job(_lines("default", 2, order=[1, 0]), "", 0, None, 1.0))
    assert (reversed_.word, reversed_.ok) == ("ignored (unordered)", False)
    stuck = _check.judge(
        "default", 3, Job(["default#1 r0 at=f:1 @@f:1", f"{scenarios.DONE} default r0"], "", -9, "stall", 9.0)
    )
    assert stuck.word == "deadlock (ranks 1,2 stuck)" and "output stopped" in stuck.detail
    crashed = _check.judge("default", 2, Job([], "Traceback...\nRuntimeError: gloo broke", 1, None, 3.0))
    assert crashed.word == "crashed (exit 1)" and crashed.detail == "RuntimeError: gloo broke"
    silent = _check.judge("default", 2, Job([], "rendezvous timed out", -9, "timeout", 240.0))
    assert silent.word == "never started" and "rendezvous timed out" in silent.detail


def test_a_deadlock_in_the_patched_job_marks_the_rest_not_reached():
    job = Job(_lines("default", 2) + ["rank_levels#1 r0 at=f:1 @@f:1"], "", -9, "stall", 20.0)
    outcomes = _check.judge_all(["default", "rank_levels", "many"], 2, job)
    assert [o.word for o in outcomes.values()] == ["ordered", "deadlock (all ranks stuck)", "not reached"]


def test_a_patched_job_that_aborts_at_exit_is_not_reported_ordered():
    """Every rank finished every scenario, then a rank aborted at exit: `check` says so."""
    lines = _lines("default", 2) + _lines("all_processes", 2)
    stderr = "terminate called without an active exception\n...\nChildFailedError: ... (SIGABRT)"
    outcomes = _check.judge_all(["default", "all_processes"], 2, Job(lines, stderr, 1, None, 5.0))
    assert [(o.word, o.ok) for o in outcomes.values()] == [("ordered", True), ("crashed at exit (exit 1)", False)]
    assert outcomes["all_processes"].detail == "a rank aborted at interpreter exit (SIGABRT)"
    clean = _check.judge_all(["default", "all_processes"], 2, Job(lines, "", 0, None, 5.0))
    assert [o.word for o in clean.values()] == ["ordered", "ordered"]


def test_exit_code_follows_the_patched_column_only(capsys):
    args = argparse.Namespace(nproc=2, verbose=False)
    bad, good = _check.Outcome("deadlock (all ranks stuck)", "x"), _check.Outcome("ordered", ok=True)
    assert cli._conclude({"default": (bad, good)}, args, 1.0) == cli.EXIT_OK
    assert cli._conclude({"default": (good, bad)}, args, 1.0) == cli.EXIT_FAIL
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL: with the fix, 1 scenario(s) are not ordered: default." in out


def test_table_lines_up_its_columns_and_says_the_unpatched_one_is_the_same_in_any_mode():
    outcomes = {"default": (_check.Outcome("deadlock (all ranks stuck)"), _check.Outcome("ordered"))}
    rows = _check.table(outcomes, "gather")
    assert rows[0].split() == [
        "scenario",
        "what",
        "it",
        "does",
        "unpatched",
        "(any",
        "mode)",
        "patched",
        "(gather",
        "mode)",
    ]
    assert rows[2].index("deadlock") == rows[0].index("unpatched")
    assert rows[2].rindex("ordered") == rows[0].rindex("patched")


def test_progress_counts_the_jobs_running_and_those_waiting_their_turn_apart():
    assert _check.progress(9, 8, 40, 15.2).startswith(
        "  ... 8 job(s) running (8 at a time), 1 waiting, 40 processes, 15 s"
    )
    assert _check.progress(3, 8, 12, 30.0) == "  ... 3 job(s) running (8 at a time), 12 processes, 30 s so far"
    assert _check.progress(9, 1, 5, 2.0) == "  ... 1 job(s) running (1 at a time), 8 waiting, 5 processes, 2 s so far"


@pytest.mark.parametrize(("nproc", "cores", "jobs"), [(4, 2, 1), (2, 2, 1), (4, 1, 1), (4, 8, 2), (2, 64, 32)])
def test_check_runs_a_core_per_rank_by_default_and_at_least_one_job(nproc, cores, jobs):
    assert _check.default_jobs(nproc, cores) == jobs


def test_jobs_at_once_is_what_was_asked_within_the_jobs_there_are_and_free_memory(monkeypatch):
    monkeypatch.setattr(_check, "_available_memory", lambda: 64 * 2**30)
    assert _check.jobs_at_once(4, 9, 1) == 1
    assert _check.jobs_at_once(4, 9, 3) == 3
    assert _check.jobs_at_once(4, 2, 8) == 2  # never more than there are jobs
    assert _check.jobs_at_once(4, 9, 100) == _check.MAX_PROCESSES_AT_ONCE // 5
    monkeypatch.setattr(_check, "_available_memory", lambda: 3 * _check.MEMORY_PER_PROCESS)  # 2 processes
    assert _check.jobs_at_once(4, 9, 3) == 1


def test_check_takes_its_jobs_at_once_from_the_cores_unless_told(monkeypatch):
    monkeypatch.setattr(_check, "_available_memory", lambda: 64 * 2**30)
    monkeypatch.setattr(_check, "usable_cores", lambda: 2)
    assert _check.Check(4).workers == 1
    assert _check.Check(2, names=["default"]).workers == 1
    assert _check.Check(4, jobs=3).workers == 3
    monkeypatch.setattr(_check, "usable_cores", lambda: 16)
    assert _check.Check(4).workers == 4
    assert _check.Check(4, names=["default"]).workers == 2  # one unpatched job and the patched one


@pytest.mark.parametrize(
    ("value", "words"), [("0", "must be at least 1, not 0"), ("two", "must be a whole number of jobs")]
)
def test_a_bad_jobs_value_is_refused_with_the_checks_usage(capsys, value, words):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--jobs", value])
    assert exit_.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: accelerate-inorder-fix check ") and f"--jobs: {words}" in err, err


def _partial(stderr="", lines=(), seconds=3.02):
    out = ["partial#1 r0 at=f:1 @@f:1", *lines, f"{scenarios.RESULT} partial r0 slowest_call={seconds}"]
    out += [f"{scenarios.RESULT} partial r{r} sum=3.0" for r in range(2)] + [
        f"{scenarios.DONE} partial r{r}" for r in range(2)
    ]
    return _check.judge("partial", 2, Job(out, stderr, 0, None, 5.0))


def test_the_partial_row_says_the_call_was_given_up_after_a_wait_with_a_warning():
    gather = "accelerate-inorder-fix: in_order call at /x/scenarios.py:173 in partial (call 1 from there): rank 1 sent"
    barrier = "accelerate-inorder-fix: in_order call at /x/scenarios.py:173 in partial: rank 1 did not make it"
    for outcome in (_partial(lines=[gather]), _partial(stderr=barrier + "\n")):
        assert (outcome.word, outcome.ok) == ("ordered, given up after 3.0 s with a warning", True)
    assert _partial(seconds=0.01).word == "ordered"  # no wait, no warning (upstream before 1.13: no barrier at all)
    other = gather.replace(" in partial (", " in default (")
    assert _partial(lines=[other]).word == "ordered"


def test_bad_arguments_of_a_command_print_that_commands_usage(capsys):
    for argv, usage in ((["lint", "x.py", "--bogus"], "lint"), (["status", "--bogus"], "status")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith(f"usage: accelerate-inorder-fix {usage} ") and "unrecognized arguments: --bogus" in err


def test_bench_names_itself_and_a_short_run_points_to_the_recorded_one():
    assert bench._parser().prog == "accelerate-inorder-fix bench"
    note = bench.noise_note(3)
    assert "short run (3 rounds) is noise" in note and f"--full` ({bench.RECORDED_ARGS})" in note
    # --full is the command behind the recorded table.
    assert f"bench {bench.RECORDED_ARGS}`" in (REPO / "benchmarks" / "RESULTS.md").read_text()
    assert bench._parser().parse_args(["--full"]).full


def test_the_users_force_reaches_the_patched_ranks_only(monkeypatch):
    monkeypatch.setenv("ACCELERATE_INORDER_FIX", "force")
    assert _launch.scenario_env(True, "gather", base={})["ACCELERATE_INORDER_FIX"] == "force"
    assert _launch.scenario_env(True, "gather", base={})["ACCELERATE_INORDER_MODE"] == "gather"
    assert _launch.scenario_env(False, base={})["ACCELERATE_INORDER_FIX"] == "0"


def test_bench_calls_the_benchmarks_main_with_the_rest_of_the_line(monkeypatch, capsys):
    def fake_main(argv):  # like the real benchmark: prints its table, returns its raw results
        print("bench table", argv)
        return [{"mode": "gather"}]

    monkeypatch.setattr(bench, "main", fake_main)
    assert cli.main(["bench", "--nproc", "2"]) == cli.EXIT_OK
    assert cli.main(["bench", "--", "--help"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "bench table ['--nproc', '2']" in out and "bench table ['--help']" in out


def test_a_rank_reported_missing_fails_the_scenario_though_every_record_came():
    """Every rank calls in these scenarios: a "sent no record" warning means a rank's record or empty
    marker did not come in time (records that arrive later still make the scenario look complete)."""
    warning = (
        "accelerate-inorder-fix: in_order call at /x/scenarios.py:80 in default (call 1 from there): "
        "rank 1 sent no record within 30 s (ACCELERATE_INORDER_TIMEOUT). Cost: a wait of 30 s. Next: ..."
    )
    lines = _lines("default", 2)
    assert scenarios.check("default", 2, lines) == ("ordered", "")
    verdict, detail = scenarios.check("default", 2, [*lines[:1], warning, *lines[1:]])
    assert verdict == "warning" and "rank 1 sent no record" in detail
    outcome = _check.judge("default", 2, Job([*lines[:1], warning, *lines[1:]], "", 0, None, 1.0))
    assert (outcome.word, outcome.ok) == ("a rank reported missing", False)
    # A warning about another scenario's call fails that scenario, not this one.
    other = warning.replace(" in default (", " in many (")
    assert scenarios.check("default", 2, [*lines, other]) == ("ordered", "")


def test_a_call_slower_than_its_bound_fails_the_scenario():
    bound = scenarios.call_bound(2)
    assert bound < 10  # well below gather mode's default timeout (30 s): a missing marker costs that much
    timed = [f"{scenarios.RESULT} default r{r} slowest_call={seconds}" for r, seconds in ((0, 0.2), (1, 0.1))]
    assert scenarios.check("default", 2, _lines("default", 2) + timed) == ("ordered", "")
    timed[0] = f"{scenarios.RESULT} default r0 slowest_call={bound + 0.5}"
    verdict, detail = scenarios.check("default", 2, _lines("default", 2) + timed)
    assert verdict == "slow" and "0:" in detail, detail
    assert _check.judge("default", 2, Job(_lines("default", 2) + timed, "", 0, None, 1.0)).word == "call too slow"
