"""On a real job: what a rank's queue in the c10d store holds is data, never code.

A 4-rank gather job (torchrun, CPU gloo, accelerate 1.15.0) in which rank 1 posts, in place of its
record of call 2, a pickle that would create a file when unpickled, and rank 3 posts its record of
call 4 cut in half (`scripts/inject_records.py`). The job must end normally (exit code 0, well within
its time bound, no in_order call waiting out a deadline), no file may appear, each of the two ranks
must be named by exactly one warning, and every other record must be printed exactly once, in rank
order, by the main process, with the origin rank's process id, `extra` values and traceback.
"""

import importlib.util
import os
import pickle
import re

import pytest
from conftest import REPO, SCRIPTS, accelerate_dir

from accelerate_inorder_fix.cli import launch as _launch


pytestmark = pytest.mark.timed


NPROC = 4
TIMEOUT = 15.0  # ACCELERATE_INORDER_TIMEOUT: a call that waited it out would show in @@SECONDS
INJECTED = {(2, 1), (4, 3)}  # (call, rank) whose record was replaced by foreign bytes
RECORD = re.compile(r"^(?:\[RANK \d+\] )?inject#(\d+) r(\d+)\b.* @@origin=(\d+) @@by=(\d+) @@extra=(.*)$")
FOREIGN_WARNING = re.compile(
    r"accelerate-inorder-fix: in_order call at \S+ in \w+ \(call \d+ from there\): rank (\d+) sent something that is "
    "not an in_order record"
)


def _script():
    spec = importlib.util.spec_from_file_location("inject_records", SCRIPTS / "inject_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([accelerate_dir("1.15.0"), str(REPO)]),
        ACCELERATE_INORDER_MODE="gather",
        ACCELERATE_INORDER_TIMEOUT=str(TIMEOUT),
        AIF_PWNED=str(tmp_path / "pwned"),
        OMP_NUM_THREADS="1",
    )
    cmd = _launch.launch_command([str(SCRIPTS / "inject_records.py")], NPROC)
    return _launch.run(cmd, env=env, timeout=80, stall=30)


def test_foreign_bytes_in_a_queue_run_nothing_and_cost_only_their_own_record(tmp_path):
    # The control: the payload rank 1 posts is live. Unpickled, it creates its file.
    control = tmp_path / "control"
    pickle.loads(_script().pickle_payload(str(control)))
    assert control.exists()

    job = _run(tmp_path)
    context = (job, job.lines, job.stderr[-3000:])
    assert job.killed is None and job.returncode == 0 and job.elapsed < 80, context
    assert not (tmp_path / "pwned").exists(), context

    # The injections happened, where planned, and gather mode ran: the main process printed every line.
    injected = sorted(line.split()[1:3] for line in job.lines if line.startswith("@@INJECTED "))
    assert injected == [["pickle", "r1"], ["truncated", "r3"]], context
    pids = {int(line.split()[1][1:]): int(line.split()[2]) for line in job.lines if line.startswith("@@PID ")}
    assert sorted(pids) == list(range(NPROC)), context

    records = [(i, RECORD.match(line)) for i, line in enumerate(job.lines) if RECORD.match(line)]
    got = [(int(m[1]), int(m[2])) for _, m in records]
    want = [(call, rank) for call in range(1, 6) for rank in range(NPROC) if (call, rank) not in INJECTED]
    assert got == want, context  # every other record exactly once, each call's block in rank order
    for _, m in records:
        rank = int(m[2])
        assert (int(m[3]), int(m[4])) == (pids[rank], pids[0]), m[0]  # logged by its rank, printed by main
    for index, m in records:
        call, rank = int(m[1]), int(m[2])
        if call == 1:  # plain data arrives as itself, anything else as its repr (rank 0's never travels)
            quote = "'" if rank else ""
            assert re.fullmatch(
                f"{{'step': 1, 'shape': {quote}\\(2, 3\\){quote}, 'device': {quote}<object object at 0x[0-9a-f]+>{quote}}}",
                m[5],
            ), m[0]
        if call == 3:
            tail = next(line for line in job.lines[index + 1 :] if line.startswith("ValueError"))
            assert job.lines[index + 1].startswith("Traceback") and tail == f"ValueError: boom r{rank}", m[0]
        if call == 4:
            assert "héllo" in m[0]

    # One warning per foreign payload, naming its rank and the call it cost; nothing waited out a deadline.
    warnings = [(int(m[1]), line) for line in job.stderr.splitlines() for m in [FOREIGN_WARNING.search(line)] if m]
    assert [rank for rank, _ in warnings] == [1, 3], context
    # Every call goes through one line of the script's `timed`, so call N is "call N from there".
    assert "inject_records.py" in warnings[0][1] and "(call 2 from there)" in warnings[0][1], warnings
    assert "(call 4 from there)" in warnings[1][1], warnings
    said = job.lines + job.stderr.splitlines()
    assert not [line for line in said if "sent no record" in line or "could not" in line], context
    seconds = [float(line.split()[3]) for line in job.lines if line.startswith("@@SECONDS r0 ")]
    assert len(seconds) == 5 and max(seconds) < TIMEOUT, context
    assert sorted(line.split()[2] for line in job.lines if line.startswith("@@SUM ")) == ["10.0"] * NPROC, context


HEADS_TIMEOUT = 2.0
HEAD_RECORD = re.compile(r"^\[RANK (\d)\] head#(\d) r(\d) by=r(\d)$")


def test_crafted_heads_in_a_queue_cost_only_that_ranks_records_said_once_each():
    """Rank 2 writes five crafted heads (a missing piece, 300,000 and 1,500,000 pieces, a
    5,000-digit count, no count). Each costs rank 2 that call's record, said once; the main process waits for
    none of them, reads no more than an honest record needs, and prints every other record once, in its block."""
    env = _launch.scenario_env(
        True, "gather", [accelerate_dir("1.15.0"), os.environ.get("AIF_PACKAGE_ROOT", str(REPO))]
    )
    env["ACCELERATE_INORDER_TIMEOUT"] = str(HEADS_TIMEOUT)
    job = _launch.run(
        _launch.launch_command([str(SCRIPTS / "hostile_heads.py")], NPROC), env=env, timeout=90, stall=60
    )
    context = (job.killed, job.returncode, job.lines, job.stderr[-3000:])
    assert job.killed is None and job.returncode == 0, context
    assert {line for line in job.lines if line.startswith("@@DONE")} == {f"@@DONE r{r}" for r in range(NPROC)}
    got = [(int(m[2]), int(m[1])) for m in map(HEAD_RECORD.match, job.lines) if m and m[1] == m[3] and m[4] == "0"]
    hostile = range(2, 7)
    assert got == [(call, r) for call in range(1, 9) for r in range(NPROC) if not (r == 2 and call in hostile)], (
        context
    )
    said = [line for line in job.stderr.splitlines() if "rank 2 sent something that is not an in_order record" in line]
    assert [re.search(r"\(call (\d) from there\)", line)[1] for line in said] == ["2", "3", "4", "5", "6"], context
    assert "sent no record" not in job.stderr and "could not" not in job.stderr, context
    seconds = [float(line.split()[3]) for line in job.lines if line.startswith("@@SECONDS r0 ")]
    assert len(seconds) == 8 and max(seconds) < HEADS_TIMEOUT, (seconds, context)
    ((before, after),) = [map(int, line.split()[2:]) for line in job.lines if line.startswith("@@RSS r0 ")]
    assert after - before < 32 * 1024, (before, after)  # KiB: ddf0396's main process grew 120 MiB reading the heads
