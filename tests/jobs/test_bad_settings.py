"""A bad setting is said once per host, by the host's local main process, not once per rank (issue 28).

Each job runs under a hard timeout; the launcher's exit code is asserted. Every rank still runs, with
the default in place of the bad value.
"""

from conftest import REPO, SCRIPTS, accelerate_dir, two_nodes

from accelerate_inorder_fix.cli import launch as _launch


SCRIPT = str(SCRIPTS / "rank_tags.py")
BAD = {"ACCELERATE_INORDER_MODE": "bogus", "ACCELERATE_INORDER_TIMEOUT": "-1", "ACCELERATE_INORDER_COLLAPSE": "maybe"}
SAID = {name: f"accelerate-inorder-fix: {name}={value!r} is not valid" for name, value in BAD.items()}


def _env():
    env = _launch.scenario_env(True, None, [accelerate_dir("1.15.0"), str(REPO)])
    env.update(BAD)
    return env


def _said(stderr):
    return {name: stderr.count(text) for name, text in SAID.items()}


def test_a_bad_setting_is_said_once_on_a_host_of_four_ranks():
    job = _launch.run(_launch.launch_command([SCRIPT, "%(message)s"], 4), env=_env(), timeout=120, stall=30)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert _said(job.stderr) == dict.fromkeys(BAD, 1), job.stderr
    # The default mode (barrier) ran: each rank printed its own record, each once.
    assert sorted(job.lines) == [f"[RANK {rank}] shard loaded" for rank in range(4)], job.lines


def test_a_bad_setting_is_said_once_per_host_on_two_hosts(tmp_path):
    job, nodes, errors = two_nodes([SCRIPT, "%(message)s"], _env(), tmp_path)
    assert job.killed is None and job.returncode == 0, (job, errors)
    assert [_said(err) for err in errors] == [dict.fromkeys(BAD, 1)] * 2, errors
    assert sorted(nodes[0] + nodes[1]) == [f"[RANK {rank}] shard loaded" for rank in range(4)], nodes
