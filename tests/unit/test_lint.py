"""Promise: `accelerate-inorder-fix lint` reports an in_order call (AIF001) or a known collective (AIF002) exactly
when only some ranks can reach it, names the condition and its line, and stays silent on everything else."""

import ast
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelerate_inorder_fix.tools import lint


HEADER = """\
import os
import sys
import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import gather as utils_gather
logger = get_logger(__name__)
accelerator = Accelerator()
"""


def findings(body):
    """(line in `body`, code) of each finding, lines counted from 1 at the first line of `body`."""
    tree = ast.parse(HEADER + textwrap.dedent(body))
    offset = HEADER.count("\n")
    return [(f.line - offset, f.code) for f in lint.check_tree(tree)]


def only(body):
    [finding] = lint.check_tree(ast.parse(HEADER + textwrap.dedent(body)))
    return finding


def test_in_order_call_under_is_main_process_names_the_condition_and_its_line():
    finding = only("""
        if accelerator.is_main_process:
            logger.info("only rank 0", in_order=True)
    """)
    assert finding.code == "AIF001" and finding.col == 5
    assert finding.condition == "if accelerator.is_main_process:"
    assert finding.condition_line == HEADER.count("\n") + 2
    assert f"under `if accelerator.is_main_process:` (line {finding.condition_line})" in finding.message
    assert "logger.info(..., in_order=True)" in finding.message


@pytest.mark.parametrize("method", sorted(lint.walker.rank.LOG_METHODS))
def test_every_adapter_method_with_in_order_true_is_AIF001(method):
    assert findings(f"""
        if not accelerator.is_local_main_process:
            logger.{method}("x", in_order=True)
    """) == [(3, "AIF001")]


@pytest.mark.parametrize(
    "body",
    [
        'logger.info("top level", in_order=True)',
        'for epoch in range(3):\n    if epoch % 10 == 0:\n        logger.info("every rank", in_order=True)',
        'if accelerator.is_main_process:\n    logger.info("plain")\n    logger.warning("plain", main_process_only=True)',
        'if accelerator.is_main_process:\n    logger.info("x", in_order=False)',
        'if accelerator.is_main_process:\n    logger.info("x", in_order=flag)',
        'with accelerator.main_process_first():\n    logger.info("every rank runs this", in_order=True)',
        "with accelerator.local_main_process_first():\n    accelerator.wait_for_everyone()",
        'if accelerator.is_main_process:\n    def later():\n        logger.info("runs where called", in_order=True)',
        "if accelerator.is_main_process:\n    f = lambda: accelerator.wait_for_everyone()",
        "if accelerator.num_processes > 1:\n    accelerator.wait_for_everyone()",
    ],
    ids=[
        "top-level",
        "epoch-modulo",
        "plain-logs",
        "in_order-False",
        "in_order-variable",
        "main_process_first",
        "local_main_process_first",
        "nested-def",
        "lambda",
        "num_processes",
    ],
)
def test_calls_every_rank_reaches_are_not_reported(body):
    assert findings(body) == []


@pytest.mark.parametrize(
    "call",
    [
        "accelerator.wait_for_everyone()",
        "accelerator.gather(t)",
        "accelerator.gather_for_metrics(t)",
        "accelerator.reduce(t)",
        "accelerator.pad_across_processes(t)",
        "self.accelerator.gather(t)",
        "utils_gather(t)",
        "dist.barrier()",
        "dist.all_reduce(t)",
        "dist.all_gather(ts, t)",
        "dist.broadcast(t, 0)",
        "dist.reduce(t, 0)",
        "dist.monitored_barrier()",
        "torch.distributed.barrier()",
    ],
)
def test_each_known_collective_is_AIF002(call):
    assert findings(f"if accelerator.is_main_process:\n    {call}") == [(2, "AIF002")]


@pytest.mark.parametrize(
    "call",
    ["torch.gather(t, 0, i)", "t.gather(0, i)", "functools.reduce(f, xs)", "reduce(f, xs)", "np.broadcast(a, b)"]
    + ["asyncio.gather(a)", "pool.barrier()", "accelerator.print(x)", "accelerator.save(m, p)"],
)
def test_look_alike_calls_are_not_collectives(call):
    assert findings(f"if accelerator.is_main_process:\n    {call}") == []


@pytest.mark.parametrize("leave", ["return", "raise ValueError('not main')", "sys.exit(0)"])
def test_the_rest_of_a_function_after_a_rank_dependent_exit_is_rank_dependent(leave):
    finding = only(f"""
        def save():
            if not accelerator.is_main_process:
                {leave}
            accelerator.wait_for_everyone()
    """)
    assert finding.code == "AIF002" and finding.condition.startswith("if not accelerator.is_main_process: ")
    assert "after `if not accelerator.is_main_process: " in finding.message


def test_continue_makes_the_rest_of_the_loop_body_rank_dependent_and_no_more():
    assert findings("""
        for batch in loader:
            if dist.get_rank() != 0:
                continue
            logger.info("rank 0 only", in_order=True)
        logger.info("after the loop: every rank", in_order=True)
    """) == [(5, "AIF001")]


def test_an_exit_in_the_else_branch_counts_and_an_if_without_exit_does_not():
    assert findings("""
        def f():
            if accelerator.is_main_process:
                accelerator.print("x")
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                pass
            else:
                return
            accelerator.wait_for_everyone()
    """) == [(10, "AIF002")]


@pytest.mark.parametrize(
    "decorator",
    [
        "@accelerator.on_main_process",
        "@accelerator.on_local_main_process",
        "@accelerator.on_process(process_index=1)",
        "@accelerator.on_last_process",
        "@rank_zero_only",
    ],
)
def test_a_function_decorated_to_run_on_some_ranks_is_rank_dependent(decorator):
    finding = only(f"""
        {decorator}
        def report():
            logger.info("x", in_order=True)
    """)
    assert finding.code == "AIF001" and f"in a function decorated `{decorator}`" in finding.message


def test_an_undecorated_function_is_not_rank_dependent():
    assert findings("@functools.lru_cache\ndef f():\n    accelerator.wait_for_everyone()") == []


@pytest.mark.parametrize(
    "assignment",
    [
        "rank = dist.get_rank()",
        "rank = accelerator.process_index",
        "rank = int(os.environ['RANK'])",
        "rank = int(os.environ.get('LOCAL_RANK', 0))",
        "rank = int(os.getenv('LOCAL_RANK'))",
        "rank = accelerator.state.local_process_index",
        "main = accelerator.is_main_process\nrank = 0 if main else 1",
    ],
)
def test_a_name_assigned_from_a_rank_expression_is_rank_dependent(assignment):
    body = f"{assignment}\nif rank == 0:\n    dist.barrier()"
    assert findings(body) == [(body.count("\n") + 1, "AIF002")]


def test_a_name_also_bound_to_something_else_is_not_rank_dependent():
    assert (
        findings("""
        rank = dist.get_rank()
        rank = 0
        if rank == 0:
            dist.barrier()
        def f(rank):
            if rank == 0:
                dist.barrier()
    """)
        == []
    )


def test_a_module_level_rank_name_reaches_into_functions_that_do_not_rebind_it():
    assert findings("""
        is_main = accelerator.is_main_process
        def f():
            if is_main:
                accelerator.wait_for_everyone()
    """) == [(5, "AIF002")]


@pytest.mark.parametrize(
    "condition",
    [
        "not accelerator.is_main_process",
        "args.push_to_hub and accelerator.is_main_process",
        "accelerator.is_last_process or args.debug",
        "not (accelerator.is_local_main_process and args.debug)",
        "dist.get_rank() % 2 == 1",
        "0 < accelerator.process_index",
        "get_local_rank() == 0",
    ],
)
def test_negation_and_boolean_combinations_stay_rank_dependent(condition):
    assert findings(f"if {condition}:\n    logger.info('x', in_order=True)") == [(2, "AIF001")]


def test_a_long_condition_is_named_by_its_rank_dependent_part():
    finding = only("""
        if accelerator.sync_gradients and accelerator.is_main_process and global_step % args.checkpointing_steps == 0:
            accelerator.wait_for_everyone()
    """)
    assert finding.condition == "if ... and accelerator.is_main_process and ...:"


@pytest.mark.parametrize(
    "condition",
    [
        "int(os.environ.get('LOCAL_RANK', -1)) != -1",
        "os.environ.get('RANK') is not None",
        "'RANK' in os.environ",
        "dist.get_rank() >= 0",
        "0 <= accelerator.process_index",
        "args.local_rank == 0",
    ],
)
def test_checks_with_the_same_answer_on_every_rank_are_not_rank_dependent(condition):
    assert findings(f"if {condition}:\n    dist.barrier()") == []


def test_balanced_branches_are_not_reported_but_an_unbalanced_else_is():
    assert findings("""
        if accelerator.is_main_process:
            logger.info("rank 0 says", in_order=True)
        else:
            logger.info("the others say", in_order=True)
        if accelerator.is_main_process:
            print("saved")
        else:
            accelerator.wait_for_everyone()
    """) == [(9, "AIF002")]


def test_rank_dependent_loops_and_conditional_expressions():
    assert findings("""
        while dist.get_rank() > step:
            dist.barrier()
        for _ in range(accelerator.process_index):
            logger.info("x", in_order=True)
        for _ in range(args.epochs):
            accelerator.wait_for_everyone()
        total = accelerator.gather(t) if accelerator.is_main_process else None
    """) == [(3, "AIF002"), (5, "AIF001"), (8, "AIF002")]


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def _run(paths, fmt="text"):
    out, err = io.StringIO(), io.StringIO()
    code = lint.run([str(p) for p in paths], fmt, out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("comment", "silenced"),
    [("# noqa: AIF001", True), ("# noqa", True), ("# NOQA:AIF0", True), ("# noqa: E501,AIF001", True)]
    + [("# noqa: AIF002", False), ("# not a noqa: AIF001", False)],
)
def test_noqa_silences_the_line_it_is_on(tmp_path, comment, silenced):
    path = _write(
        tmp_path, "t.py", f"if accelerator.is_main_process:\n    logger.info('x', in_order=True)  {comment}\n"
    )
    code, out, _ = _run([path])
    assert (code, out == "") == ((0, True) if silenced else (1, False))


def test_text_output_is_flake8s_and_json_has_one_object_per_finding(tmp_path):
    path = _write(tmp_path, "t.py", "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n")
    line = HEADER.count("\n") + 2
    code, out, err = _run([path])
    assert code == lint.EXIT_FOUND and out.startswith(f"{path}:{line}:5: AIF002 `accelerator.wait_for_everyone()`")
    assert "1 finding(s) in 1 file(s)" in err
    code, out, _ = _run([path], "json")
    assert code == lint.EXIT_FOUND
    [obj] = json.loads(out)
    assert obj["path"] == str(path) and (obj["line"], obj["col"], obj["code"]) == (line, 5, "AIF002")
    assert obj["condition"] == "if accelerator.is_main_process:" and obj["condition_line"] == line - 1


def test_exit_codes_clean_found_and_an_unparsable_file_named_while_the_rest_is_checked(tmp_path):
    clean = _write(tmp_path, "a_clean.py", "accelerator.wait_for_everyone()\n")
    assert _run([clean])[0] == lint.EXIT_CLEAN == 0
    (tmp_path / "b_broken.py").write_text("def broken(:\n")
    _write(tmp_path, "c_found.py", "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n")
    code, out, err = _run([tmp_path])
    assert code == lint.EXIT_UNREADABLE == 2
    assert f"{tmp_path / 'b_broken.py'}:1:" in err and "cannot parse: SyntaxError" in err
    assert "c_found.py" in out and "AIF002" in out and "3 file(s), 1 unreadable" in err
    code, _, err = _run([tmp_path / "missing.py", clean])
    assert code == 2 and "missing.py: cannot read" in err


def test_directories_are_walked_recursively_skipping_hidden_ones(tmp_path):
    body = "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    _write(tmp_path / "pkg" / "sub", "deep.py", body)
    (tmp_path / ".venv").mkdir()
    _write(tmp_path / ".venv", "hidden.py", body)
    code, out, _ = _run([tmp_path])
    assert code == 1 and "deep.py" in out and "hidden.py" not in out


def _cli(args, cwd):
    command = [sys.executable, "-X", "importtime", "-m", "accelerate_inorder_fix", "lint", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_command_runs_and_imports_neither_torch_nor_accelerate(tmp_path):
    _write(tmp_path, "train.py", "if accelerator.is_main_process:\n    logger.info('x', in_order=True)\n")
    repo = Path(__file__).resolve().parents[2]
    proc = _cli([str(tmp_path / "train.py"), "--format", "json"], cwd=repo)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert [f["code"] for f in json.loads(proc.stdout)] == ["AIF001"]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
    }
    assert "accelerate_inorder_fix.tools.lint.walker" in imported  # -X importtime saw the lint load
    assert not {m.split(".")[0] for m in imported} & {"torch", "accelerate"}
    usage = _cli([], cwd=repo)
    assert usage.returncode == 2 and "PATH" in usage.stderr


def test_flake8_runs_the_same_checks_through_the_plugin(tmp_path):
    path = _write(
        tmp_path, "t.py", "if accelerator.is_main_process:\n    dist.barrier()\n    dist.barrier()  # noqa: AIF002\n"
    )
    flake8 = Path(sys.executable).parent / "flake8"
    proc = subprocess.run([str(flake8), "--select", "AIF", str(path)], capture_output=True, text=True, timeout=60)
    line = HEADER.count("\n") + 2
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"{path}:{line}:5: AIF002 `dist.barrier()` is a collective on a rank-dependent "
        f"path: under `if accelerator.is_main_process:` (line {line - 1}); every rank must reach it"
    ]
