"""Every gather-mode line says which rank, and over several hosts which host, it came from (issue 28).

In gather mode the main process prints every rank's record. accelerate 1.13+ tags a message
`[RANK n] ` in `process()`; before 1.13 nothing did, so four ranks logging "shard loaded" gave four
identical lines. Each job runs under a hard timeout; the launcher's exit code is asserted.
"""

import socket

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir, two_nodes

from accelerate_inorder_fix.cli import launch as _launch


SCRIPT = str(SCRIPTS / "rank_tags.py")
BOUND = 60.0  # seconds a job of one in_order call may take on a loaded 2-core machine, start-up included


def _env(version, mode="gather"):
    return _launch.scenario_env(True, mode, [accelerate_dir(version), str(REPO)])


@pytest.mark.parametrize("version", ["0.21.0", "1.12.0", "1.15.0"])
def test_every_gather_line_names_its_rank_exactly_once_and_collapsed_lines_name_every_rank(version):
    """4 ranks log the same message: four lines, each naming its own rank, once. Then, collapse on
    (issue 36): identical records print once, tagged with every rank that sent them, the same tag on
    every release (1.13+ tags a message itself; before, the tag is ours), and carry `ranks`."""
    cmd = _launch.launch_command([SCRIPT, "%(ranks)s|%(message)s", "--collapse"], 4)
    job = _launch.run(cmd, env=_env(version), timeout=120, stall=30)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    assert job.lines == [f"-|[RANK {rank}] shard loaded" for rank in range(4)] + [
        "[0, 1, 2, 3]|[RANK 0-3] shard loaded",
        "[0, 1, 2, 3]|[RANK 0-3] epoch 3 done",
        "[0]|[RANK 0] loss 0.30",
        "[1, 3]|[RANK 1,3] loss 0.31",  # at the place of rank 1, the first that sent it
        "[2]|[RANK 2] loss 0.32",
    ], job.lines
    assert job.elapsed < BOUND, job


def test_over_two_hosts_each_line_names_its_host_and_rank(tmp_path):
    """2 nodes x 2 ranks on a loopback rendezvous, each node's ranks reporting a host name of its own.

    The two "hosts" are one machine: the script replaces `socket.gethostname` (`--fake-hosts`). Whether
    the job spans hosts comes from torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE, as on real nodes.
    With collapse on, identical records print one line per host, with its host tag (issue 36).
    """
    script = [SCRIPT, "%(hostname)s|%(rank)s|%(message)s", "--fake-hosts", "--collapse"]
    job, (node0, node1), errors = two_nodes(script, _env("1.12.0"), tmp_path)
    assert job.killed is None and job.returncode == 0, (job, errors)
    hosts = ["node-0", "node-0", "node-1", "node-1"]
    assert node0 == [f"{host}|{rank}|[{host}] [RANK {rank}] shard loaded" for rank, host in enumerate(hosts)] + [
        "node-0|0|[node-0] [RANK 0-1] shard loaded",
        "node-1|2|[node-1] [RANK 2-3] shard loaded",
        "node-0|0|[node-0] [RANK 0-1] epoch 3 done",
        "node-1|2|[node-1] [RANK 2-3] epoch 3 done",
        "node-0|0|[node-0] [RANK 0] loss 0.30",
        "node-0|1|[node-0] [RANK 1] loss 0.31",  # rank 3 says the same, on another host: its own line
        "node-1|2|[node-1] [RANK 2] loss 0.32",
        "node-1|3|[node-1] [RANK 3] loss 0.31",
    ], node0
    assert node1 == [], node1  # the main process printed every record
    assert job.elapsed < BOUND, job


def test_barrier_mode_records_carry_rank_and_hostname_and_keep_upstreams_message():
    """Barrier mode: each rank prints its own record, its message as upstream made it (no tag on 1.12),
    and `%(rank)s` / `%(hostname)s` work in a format there too. Collapse on changes nothing there: it
    applies to gather mode only, which the host's main process says once."""
    cmd = _launch.launch_command([SCRIPT, "%(rank)s|%(hostname)s|%(message)s", "--collapse"], 4)
    job = _launch.run(cmd, env=_env("1.12.0", "barrier"), timeout=120, stall=30)
    assert job.killed is None and job.returncode == 0, (job, job.stderr[-2000:])
    host = socket.gethostname()
    texts = ["shard loaded", "shard loaded", "epoch 3 done"]
    expected = [f"{rank}|{host}|{text}" for text in texts for rank in range(4)]
    expected += [f"{rank}|{host}|loss {'0.31' if rank % 2 else f'0.3{rank}'}" for rank in range(4)]
    assert job.lines == expected, job.lines  # in rank order, each rank its own line
    assert job.stderr.count("applies to gather mode only") == 1, job.stderr[-2000:]
    assert job.elapsed < BOUND, job
