"""Promise: the whole in_order call path -- the session (the mode fixed per job, per-site locks, non-member
children), gather mode's `GatherSide` and barrier mode's `BarrierSide` -- keeps its promises at the numbers of
`accelerate_inorder_fix.bounds` over hundreds of seeded schedules, and each planted product bug is caught.

The real code runs in `explorer_path.py` (simulated processes as threads, one at a time, on `explorer.py`'s
in-memory store and virtual clock: deterministic, no wall clock). The job tests (tests/jobs/test_any_launcher.py,
test_session_edges.py, test_gather_issue44.py) prove the same on real jobs.
"""

import functools

import pytest
from explorer_path import MUTATIONS, PathScript, T, coverage, explore, main, mutated, run

from accelerate_inorder_fix import bounds


SCHEDULES = 300


@functools.lru_cache(maxsize=None)
def schedules():
    """Each seed's violations and coverage, unmutated (run once for the module)."""
    return [(problems, coverage(sim)) for sim, problems in map(explore, range(SCHEDULES))]


def test_hundreds_of_seeded_schedules_keep_every_invariant():
    failures = [(seed, problems) for seed, (problems, _) in enumerate(schedules()) if problems]
    assert not failures, failures[:3]


def test_the_schedules_cover_every_part_of_the_path():
    counts = {}
    for _, kinds in schedules():
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + 1
    for kind in ("note:mode: gather", "note:mode: barrier", "note:threads", "note:launched", "note:switch"):
        assert counts.get(kind, 0) >= 20, kind
    for kind in ("note:main-only", "note:others-only", "note:differs", "start word", "word at first call"):
        assert counts.get(kind, 0) >= 20, kind
    for when in ("before", "after", "held"):
        assert counts.get(f"note:fork: {when}", 0) >= 5, when
    for fault in ("dead: at op", "dead: at op (applied)", "fail: at op", "fail: at op (applied)"):
        assert counts.get(f"note:{fault}", 0) >= 5, fault
    for seen in ("path:gather", "path:barrier", "path:once", "seen: fork while held", "seen: retry settled"):
        assert counts.get(seen, 0) >= 5, seen


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught_by_an_invariant(mutation):
    holding = [seed for seed, (problems, _) in enumerate(schedules()) if not problems]
    with mutated(mutation):
        caught = next((seed for seed in holding if explore(seed)[1]), None)
    assert caught is not None, f"no schedule catches {mutation}"


def test_a_failing_seed_is_printed_with_the_command_that_replays_it(capsys):
    assert main(["--schedules", "10", "--mutate", "block-in-reverse"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "FAILED" in line)
    assert "(replay: python tests/unit/explorer_path.py --seed" in line and "coverage (10 schedules):" in out
    seed = int(line.split()[1])
    assert main(["--seed", str(seed), "--mutate", "block-in-reverse", "-v"]) == 1
    replay = capsys.readouterr().out
    assert line in replay and "actor 0 (0, 'main')" in replay
    assert main(["--seed", str(seed)]) == 0


def test_a_schedule_is_a_function_of_its_seed():
    first, second = explore(93)[0], explore(93)[0]
    assert first.emitted == second.emitted and first.calls == second.calls


def job(n, steps, mode="gather", start_word=True, delay=0.2, site="A"):
    """Every rank calls at `site` each step, after `delay` T; the main process's word at its group's start or not."""
    actions = {}
    for r in range(n):
        start = [("start",) if r == 0 else ("joined",)] if start_word else []
        actions[r] = start + [("delay", delay * T), ("call", site)] * steps + [("exit",)]
    actors = {r: (r, "main") for r in range(n)}
    return PathScript(n, actors, actions, dict.fromkeys(range(n), mode), start_word, notes=[f"mode: {mode}"])


def main_stream(sim):
    return [text.split("] ")[-1] for actor, text, _ in sim.emitted if sim.path.actors[actor][0] == 0]


@pytest.mark.parametrize("n", [2, 4])
def test_a_non_main_post_never_waits_with_the_word_at_start_even_before_the_main_s_first_call(n):
    script = job(n, 3)
    script.actions[0].insert(1, ("delay", 0.9 * T))  # the main process's first call comes last
    sim, problems = run(script)
    assert not problems, problems
    posts = [c for c in sim.calls if c[0] != 0]
    assert len(posts) == 3 * (n - 1) and all(end == start for *_, start, end in posts)
    assert {path for _, _, path, _, _ in sim.calls} == {"gather"}
    assert len(main_stream(sim)) == 3 * n  # every record, by the main process


@pytest.mark.parametrize("mode", ["gather", "barrier"])
def test_without_the_word_at_start_a_first_call_waits_for_the_main_s_word_within_the_call_bound(mode):
    script = job(2, 3, mode, start_word=False)
    script.actions[0].insert(0, ("delay", 0.9 * T))
    sim, problems = run(script)
    assert not problems, problems
    first = next(c for c in sim.calls if c[0] == 1)
    assert 0.5 * T < first[4] - first[3] <= bounds.CALL.value * T
    assert {path for _, _, path, _, _ in sim.calls} == {mode}


@pytest.mark.parametrize("mode", ["gather", "barrier"])
@pytest.mark.parametrize("ranks", [[1], [0, 1, 2]])
def test_a_mode_set_after_the_first_call_is_said_once_and_not_taken(mode, ranks):
    script = job(3, 4, mode)
    for r in ranks:
        script.actions[r].insert(4, ("configure", "barrier" if mode == "gather" else "gather"))
    sim, problems = run(script)
    assert not problems, problems
    assert {path for _, _, path, _, _ in sim.calls} == {mode} and len(sim.calls) == 12
    late = [sim.path.actors[a][0] for a, text in sim.warnings if "after this job's mode was fixed" in text]
    assert sorted(late) == ranks


def test_a_rank_whose_setting_differs_takes_the_main_s_mode_and_says_so_once():
    script = job(3, 3, "barrier", start_word=False)
    script.modes[2] = "gather"
    sim, problems = run(script)
    assert not problems, problems
    assert {path for _, _, path, _, _ in sim.calls} == {"barrier"}
    assert [a for a, text in sim.warnings if "differs from the main process's" in text] == [2]


@pytest.mark.parametrize("mode", ["gather", "barrier"])
@pytest.mark.parametrize("when", ["before", "held"])
def test_a_child_forked_in_the_group_logs_at_once_touches_no_store_and_never_blocks(mode, when):
    script = job(2, 3, mode)
    child = 2
    script.actors[child] = (1, "child")
    script.actions[child] = [("forked",), ("call", "A"), ("call", "A")]
    if when == "held":
        script.actors[3] = (1, "second")
        script.actions[3] = [("fork", child, "held"), ("exit",)]
    else:
        script.actions[1].insert(1, ("fork", child, "now"))
    sim, problems = run(script)
    assert not problems, problems  # no store operation, no wait, no hang
    assert when != "held" or any(e[0] == "fork while held" for e in sim.events)
    assert [a for a, text, _ in sim.emitted if "call 2.A" in text] == [child, child]


@pytest.mark.parametrize("mode", ["gather", "barrier"])
def test_ranks_forked_by_a_launcher_before_the_group_are_ranks(mode):
    script = job(3, 3, mode)
    for r in range(3):
        script.actions[r].insert(0, ("launched",))
    script.notes.append("launched")
    sim, problems = run(script)
    assert not problems, problems
    assert {path for _, _, path, _, _ in sim.calls} == {mode}
    if mode == "gather":
        assert main_stream(sim) == [f"call {r}.A {k}" for k in (1, 2, 3) for r in range(3)]


@pytest.mark.parametrize("mode", ["gather", "barrier"])
def test_two_threads_per_rank_at_different_sites_keep_every_block_whole_and_in_rank_order(mode):
    """A thread at B on every rank while the main thread calls at A (threads whose ranks interleave differently)."""
    script = job(3, 4, mode)
    for r in range(3):
        script.actors[3 + r] = (r, "second")
        script.actions[3 + r] = [("joined",)] * (r > 0) + [("delay", 0.1 * T), ("call", "B")] * 3 + [("exit",)]
    sim, problems = run(script)
    assert not problems, problems
    order = [text.split("] ")[-1] for _, text, _ in sim.emitted if ".B " in text]
    assert order == [f"call {3 + r}.B {k}" for k in (1, 2, 3) for r in range(3)]


def test_a_site_whose_main_call_waits_behind_another_thread_s_calls_keeps_its_blocks():
    """Gather mode: the main thread's main-only call M, then its calls at A (rank 1 slow there) hold the side's
    lock over 2 T while the main process's other thread waits to call at B: B's records are kept for that call,
    not printed as an others-only site's (found by the explorer, seed 146)."""
    script = job(2, 0, start_word=True)
    script.actions[0][1:1] = [("call", "M")] + [("call", "A")] * 3
    script.actions[1][1:1] = [("delay", 0.9 * T), ("call", "A")] * 3
    script.notes.append("main-only")
    for r in range(2):
        script.actors[2 + r] = (r, "second")
        script.actions[2 + r] = [("joined",)] * r + [("delay", 0.05 * T), ("call", "B")] * 2 + [("exit",)]
    sim, problems = run(script)
    assert not problems, problems
    b = next(c for c in sim.calls if c[0] == 2)
    assert b[4] - b[3] > 2 * T  # the scenario: the B call waited behind the main thread's calls
    assert not any("made it and the main process has not" in text for _, text in sim.warnings)
    assert main_stream(sim)[-4:] == ["call 2.B 1", "call 3.B 1", "call 2.B 2", "call 3.B 2"]


@pytest.mark.parametrize("main_only", [False, True])
def test_a_rank_dead_from_its_first_post_costs_the_main_process_at_most_the_death_bound(main_only):
    """No ordinary delays: every wait of the main process is for the dead rank (or the main-only site's once)."""
    script = job(3, 10, delay=0.0)
    script.die_at[2] = 2  # its first post (after the word's one get)
    if main_only:
        script.notes.append("main-only")
        for k in range(10, 0, -1):
            script.actions[0].insert(1 + 2 * k, ("call", "M"))
    sim, problems = run(script)
    assert not problems, problems
    waited = sum(end - start for actor, _, _, start, end in sim.calls if actor == 0)
    budget = bounds.GATHER_DEATH.value + main_only * bounds.GATHER_MAIN_ONLY.value
    assert sim.dead == {2} and waited <= budget * T + 1e-9, waited / T
    assert len(main_stream(sim)) == 20 + 10 * main_only


@pytest.mark.parametrize("applied", [False, True])
def test_a_post_whose_connection_fails_comes_out_once(applied):
    """Rank 1's first post (its second store operation: the word's one get, then the post's compare_set):
    the connection fails before the server sees it, or after the server applied it (the reply lost). The rank
    asks again on a fresh connection (`Connection.fresh`): `compare_set(key, "", head)` answers the head when
    the first landed, so the record goes to the main process once, and is not printed on the rank too."""
    script = job(2, 3)
    script.fail_at[1] = 2
    if applied:
        script.applied.add(1)
    sim, problems = run(script)
    assert not problems, problems
    assert sim.failed == {1} and any("a fresh connection settled it" in text for _, text in sim.warnings)
    assert main_stream(sim) == [f"call {r}.A {k}" for k in (1, 2, 3) for r in range(2)]
    with mutated("fresh-retry-removed"):
        assert any("emitted 2 times" in p for p in run(script)[1]) == applied


def test_a_rank_that_could_not_read_the_word_logs_that_call_at_once_and_keeps_the_main_s_numbers():
    """Rank 1's connection fails at its first store operation (the word's get): that call is logged at once
    on the rank, and its later records come out in their own blocks, not one call early."""
    script = job(2, 3)
    script.fail_at[1] = 1
    sim, problems = run(script)
    assert not problems, problems
    assert [text for actor, text, _ in sim.emitted if actor == 1] == ["call 1.A 1"]
    assert main_stream(sim) == ["call 0.A 1", "call 0.A 2", "call 1.A 2", "call 0.A 3", "call 1.A 3"]
