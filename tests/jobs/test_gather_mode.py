"""Gather mode, proven on real multi-rank jobs; each job runs under a hard timeout.

- every core scenario is ordered in gather mode (main process's output), on several releases;
- a subset call (one rank skips an in_order call): no hang, a warning naming that rank, and the next
  collective and in_order call work; barrier mode, run the same way, gives that call up after the
  timeout (its check-in) and names the rank;
- a rank that leaves (exit 0 under torchrun) or is killed (SIGKILL, no agent to tear the job down);
- two simulated nodes: all four ranks' records, in order, in node 0's output only.
"""

import os
import socket
import subprocess
import sys

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch
from accelerate_inorder_fix.cli import scenarios


sys.path.insert(0, str(SCRIPTS))
import fault_scenarios  # noqa: E402  (tests/jobs/scripts: the fault scenarios, for the tests only)


FAULT_TIMEOUT = 3.0  # ACCELERATE_INORDER_TIMEOUT in the fault jobs: short, so the tests are too (and `timed`)
# ACCELERATE_INORDER_TIMEOUT in the jobs where every rank calls: a rank whose record or empty marker does not
# come costs the main process this much, and `scenarios.check` fails on the warning naming it and on the slow call.
CORE_TIMEOUT = 10.0
CORE = list(scenarios.SCENARIOS)


def _fault_env():
    return dict(os.environ, ACCELERATE_INORDER_TIMEOUT=str(FAULT_TIMEOUT))


def _pythonpath(version):
    return [accelerate_dir(version), str(REPO)]


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("version", ["0.21.0", "1.12.0", "1.15.0"])
def test_core_scenarios_ordered_in_gather_mode(version, nproc):
    env = dict(os.environ, ACCELERATE_INORDER_TIMEOUT=str(CORE_TIMEOUT))
    job = _launch.run_scenarios(
        CORE, nproc, True, mode="gather", pythonpath=_pythonpath(version), timeout=150, stall=30, base_env=env
    )
    said = job.lines + job.stderr.splitlines()  # the package's warnings are on stderr
    verdicts = {name: scenarios.check(name, nproc, said) for name in CORE}
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert all(v == ("ordered", "") for v in verdicts.values()), verdicts
    assert_gather_ran(job, CORE)


def assert_gather_ran(job, names):
    """Every in_order record was written by the main process (rank 0): gather mode ran, not barrier."""
    writers = {(name, *key): by for name in names for key, by in scenarios.writers(job.lines, name).items()}
    # `caller` call 2 is a plain (not in_order) call: each rank prints its own.
    writers = {key: by for key, by in writers.items() if key[:2] != ("caller", 2)}
    assert writers and set(writers.values()) == {0}, writers


def _fault_job(name, mode, version="1.15.0", nproc=4, timeout=90, stall=20):
    return _launch.run_scenarios(
        [name],
        nproc,
        True,
        mode=mode,
        pythonpath=_pythonpath(version),
        timeout=timeout,
        stall=stall,
        base_env=_fault_env(),
        script=fault_scenarios.SCRIPT,
    )


@pytest.mark.timed
@pytest.mark.parametrize("version", ["1.15.0"])
def test_subset_call_warns_and_keeps_working(version):
    job = _fault_job("subset", "gather", version)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert fault_scenarios.check_fault("subset", 4, job.lines, FAULT_TIMEOUT, job.stderr) == ("ordered", ""), job.lines
    assert_gather_ran(job, ["subset"])


@pytest.mark.timed
def test_subset_call_in_barrier_mode_costs_one_timeout_and_is_named():
    """The same job in barrier mode: the check-in gives up call 1 after the timeout (it deadlocked before
    the check-in: tests/jobs/test_barrier_checkin.py shows that), names rank 3, and call 2 is ordered."""
    job = _fault_job("subset", "barrier", timeout=60, stall=12)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert scenarios.done_ranks(job.lines, "subset") == {0, 1, 2, 3}
    assert {line.split("=")[1] for line in job.lines if line.startswith("@@RESULT subset") and "sum=" in line} == {
        "10.0"
    }
    records = [(call, rank) for call, rank, *_ in scenarios.parse(job.lines, "subset")]
    assert sorted(r for r in records if r[0] == 1) == [(1, 0), (1, 1), (1, 2)]  # each once, unordered
    assert [r for r in records if r[0] == 2] == [(2, 0), (2, 1), (2, 2), (2, 3)]
    named = [line for line in job.stderr.splitlines() if "did not make it" in line]
    assert len(named) == 1 and "rank 3 did not make it" in named[0], job.stderr[-2000:]


@pytest.mark.timed
def test_rank_that_exits_early():
    job = _fault_job("early_exit", "gather")
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert fault_scenarios.check_fault("early_exit", 4, job.lines, FAULT_TIMEOUT, job.stderr) == ("ordered", ""), (
        job.lines
    )
    assert_gather_ran(job, ["early_exit"])


@pytest.mark.timed
def test_rank_that_is_killed():
    env = _launch.scenario_env(True, "gather", _pythonpath("1.15.0"), dict(_fault_env(), AIF_CRASH="kill"))
    cmd = [sys.executable, str(SCRIPTS / "spawn_ranks.py"), "4", fault_scenarios.SCRIPT, "early_exit"]
    job = _launch.run(cmd, env=env, timeout=90, stall=20)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert fault_scenarios.check_fault("early_exit", 4, job.lines, FAULT_TIMEOUT, job.stderr) == ("ordered", ""), (
        job.lines
    )
    assert_gather_ran(job, ["early_exit"])


def test_two_nodes_all_records_in_node_0(tmp_path):
    """2 nodes x 2 ranks on a loopback rendezvous, each node's stdout in a file of its own."""
    names = ["default", "exception", "many"]
    port = _launch.free_port()
    nodes = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            _launch.SCENARIO_SCRIPT,
            ",".join(names),
        ]
        nodes.append(f"{subprocess.list2cmdline(cmd)} > {tmp_path}/node{node}.out")
    script = f"{nodes[0]} & a=$!; {nodes[1]} & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))"
    env = _launch.scenario_env(True, "gather", _pythonpath("1.15.0"))
    job = _launch.run(["bash", "-c", script], env=env, timeout=120)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    node0 = (tmp_path / "node0.out").read_text().splitlines()
    node1 = (tmp_path / "node1.out").read_text().splitlines()
    # A hang is killed at the hard deadline and fails the assertion above, as does a non-zero exit.
    # Node 1's ranks report completion in its own file; every record must be in node 0's.
    merged = node0 + [line for line in node1 if line.startswith("@@")] + job.stderr.splitlines()  # + warnings
    assert {name: scenarios.check(name, 4, merged) for name in names} == dict.fromkeys(names, ("ordered", ""))
    writers = {by for name in names for by in scenarios.writers(node0, name).values()}
    assert writers == {0}, writers
    # Over two hosts, every line gather mode prints leads with its host: here both "hosts" are
    # this machine, so each record names it.
    host = f"[{socket.gethostname()}] [RANK "
    records = [line for line in node0 if "#" in line and "@@" in line]
    assert records and all(line.startswith(host) for line in records), records[:4]
    # Node 1 keeps its plain `main_process_only=False` lines; no in_order record is printed there.
    assert not [record for name in names for record in scenarios.parse(node1, name)], node1
