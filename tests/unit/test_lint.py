"""Promise: `accelerate-inorder-fix lint` reports an in_order call (AIF001), a known collective (AIF002) or a call
collective under DeepSpeed or FSDP (AIF003) exactly when only some ranks can reach it and the ranks' paths do not
balance, names the condition and its line, and stays silent on everything else."""

import ast
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from accelerate_inorder_fix import lint


HEADER = """\
import os
import shutil
import sys
import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import gather as utils_gather, DistributedType
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
    assert finding.source == f"`{decorator[1:].split('(')[0].split('.')[-1]}` is a rank decorator"


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
        def f(is_main_process):
            is_main_process = False
            if is_main_process:
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
        "args.local_rank != -1",
        "args.local_rank is None",
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
    assert "c_found.py" in out and "AIF002" in out and "in 2 file(s) checked, 1 not checked" in err
    code, _, err = _run([tmp_path / "missing.py", clean])
    assert code == 2 and "missing.py: cannot read" in err
    assert "in 1 file(s) checked, 1 not checked" in err  # a missing path counts as an unparsable file does


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
    assert "accelerate_inorder_fix.lint.walker" in imported  # -X importtime saw the lint load
    assert not {m.split(".")[0] for m in imported} & {"torch", "accelerate"}
    usage = _cli([], cwd=repo)
    assert usage.returncode == 2 and "PATH" in usage.stderr


def _repo_entry_points(tmp_path):
    """A folder whose one distribution declares pyproject.toml's flake8 entry point: first on the path, it
    stands in for the installed copy's metadata (flake8 loads a distribution's plugins once, the first found)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["flake8.extension"]
    meta = tmp_path / "meta" / "accelerate_inorder_fix-0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate-inorder-fix\nVersion: 0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry.items())
    (meta / "entry_points.txt").write_text(f"[flake8.extension]\n{lines}")
    return meta.parent


def _flake8_aif(tmp_path, path):
    """`flake8 --select AIF path` with this repository's package and entry point."""
    flake8 = Path(sys.executable).parent / "flake8"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(_repo_entry_points(tmp_path)), str(REPO)))}
    command = [str(flake8), "--select", "AIF", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_flake8_runs_the_same_checks_through_the_plugin(tmp_path):
    path = _write(
        tmp_path, "t.py", "if accelerator.is_main_process:\n    dist.barrier()\n    dist.barrier()  # noqa: AIF002\n"
    )
    proc = _flake8_aif(tmp_path, path)
    line = HEADER.count("\n") + 2
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"{path}:{line}:5: AIF002 `dist.barrier()` is a collective on a rank-dependent "
        f"path: under `if accelerator.is_main_process:` (line {line - 1}), where `accelerator.is_main_process` "
        "is a rank attribute; the ranks' counts differ: `dist.barrier()`: rank 0 makes 2, ranks 1-3 make 0; "
        "every rank must reach it"
    ]


# --- Membership, balance, recall, AIF003 and the command's options ---


def test_a_group_collective_under_a_membership_test_is_silent():
    assert (
        findings("""
        def reduce_within(group, t):
            me = dist.get_rank()
            if me in dist.get_process_group_ranks(group):
                dist.all_reduce(t, group=group)
        def only_members(members, grp, t):
            if dist.get_rank() not in members:
                return
            dist.broadcast(t, 0, group=grp)
    """)
        == []
    )


def test_a_world_collective_under_a_membership_test_is_reported():
    assert findings("""
        def f(members, t):
            if dist.get_rank() in members:
                dist.all_reduce(t)
    """) == [(4, "AIF002")]


def test_the_zero_first_pair_of_barriers_is_balanced():
    assert (
        findings("""
        LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
        def rank_zero_goes_first():
            if LOCAL_RANK not in [-1, 0]:
                dist.barrier()
            yield
            if LOCAL_RANK == 0:
                dist.barrier()
        def main_goes_first():
            if not accelerator.is_main_process:
                accelerator.wait_for_everyone()
            prepare_dataset()
            if accelerator.is_main_process:
                accelerator.wait_for_everyone()
    """)
        == []
    )


def test_a_zero_first_pair_missing_its_second_barrier_is_reported():
    assert findings("""
        LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
        def rank_zero_goes_first():
            if LOCAL_RANK not in [-1, 0]:
                dist.barrier()
            yield
    """) == [(5, "AIF002")]


def test_an_early_return_that_makes_the_same_collective_as_the_rest_is_balanced():
    assert (
        findings("""
        def check(members):
            rank = dist.get_rank()
            if rank not in members:
                dist.barrier()
                return
            run_the_members_part()
            dist.barrier()
        def others_leave():
            if dist.get_rank() != 0:
                accelerator.wait_for_everyone()
                return
            write_summary()
            accelerator.wait_for_everyone()
    """)
        == []
    )


def test_balance_is_counted_by_kind_so_another_collective_does_not_balance():
    assert findings("""
        def f(t):
            if dist.get_rank() == 0:
                dist.barrier()
            else:
                dist.all_reduce(t)
    """) == [(4, "AIF002")]


def test_two_ifs_that_split_the_ranks_between_them_are_balanced():
    assert (
        findings("""
        def f():
            main = accelerator.is_main_process
            if main:
                logger.info("saving", in_order=True)
            if not main:
                logger.info("waiting", in_order=True)
    """)
        == []
    )


def test_a_rank_dependent_continue_before_a_collective_is_reported():
    assert findings("""
        def f(loader):
            for batch in loader:
                if not accelerator.is_main_process:
                    continue
                accelerator.wait_for_everyone()
    """) == [(6, "AIF002")]


def test_a_rank_0_raise_before_a_barrier_is_reported():
    assert findings("""
        def sanity_check(loader):
            if dist.get_rank() == 0:
                for batch in loader:
                    print(batch)
                raise AssertionError("done")
            dist.barrier()
    """) == [(7, "AIF002")]


@pytest.mark.parametrize(
    "imports",
    ["import deepspeed.comm as dist", "from deepspeed import comm as dist", "import deepspeed.comm.comm as dist"]
    + ["from torch.distributed import distributed_c10d as dist", "from nanotron import distributed as dist"],
)
def test_modules_known_to_be_torch_distributed_are_read_as_it(imports):
    tree = ast.parse(f"{imports}\nif dist.get_rank() == 0:\n    dist.barrier()\n")
    assert [(f.line, f.code) for f in lint.check_tree(tree)] == [(3, "AIF002")]


@pytest.mark.parametrize("imports", ["import mycomm as dist", "from somewhere import dist", "dist = pick_backend()"])
def test_an_unknown_module_named_dist_is_not_a_collective_library(imports):
    tree = ast.parse(f"{imports}\nif dist.get_rank() == 0:\n    dist.barrier()\n")
    assert lint.check_tree(tree) == []


@pytest.mark.parametrize(
    "call",
    ["dist.all_gather_object(out, x)", "dist.broadcast_object_list(xs, 0)", "dist.reduce_scatter(o, xs)"]
    + ["dist.all_to_all(o, i)", "dist.gather(t, ts, 0)", "accelerator.gather_object(x)"],
)
def test_the_other_collectives_are_AIF002(call):
    assert findings(f"if accelerator.is_main_process:\n    {call}") == [(2, "AIF002")]


def test_a_rank_chosen_by_a_conditional_expression_is_a_rank():
    assert findings("""
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == 0:
            dist.barrier()
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            dist.barrier()
    """) == [(4, "AIF002")]


def test_an_accelerator_held_on_an_attribute_or_passed_in_is_seen():
    assert findings("""
        class Trainer:
            def __init__(self, acc: Accelerator):
                self.acc = acc
                self.mine = Accelerator()
            def step(self, t):
                if self.acc.is_main_process:
                    self.acc.gather(t)
                if self.mine.is_main_process:
                    self.mine.reduce(t)
    """) == [(8, "AIF002"), (10, "AIF002")]


def test_an_object_not_known_as_an_accelerator_has_no_collective_gather():
    assert (
        findings("""
        class Model:
            def step(self, t, index):
                if self.engine.is_main_process:
                    self.table.gather(index)
    """)
        == []
    )


@pytest.mark.parametrize(
    "condition",
    ["trainer.is_world_process_zero()", "self.trainer.is_global_zero", "self.global_rank == 0"]
    + ["trainer.is_local_process_zero()", "trainer.global_rank != 0"],
)
def test_trainer_and_lightning_rank_sources_are_ranks(condition):
    assert findings(f"if {condition}:\n    dist.barrier()") == [(2, "AIF002")]


@pytest.mark.parametrize(
    "condition",
    ["self.ranking == 0", "args.lora_rank == 0", "args.rank_dim > 4", "self.ranks[0] == 0", "args.is_mainline"]
    + ["ranker.get_ranking() == 0", "is_main_branch()", "rank_fn(x) == 0"],
)
def test_names_that_only_contain_a_rank_word_are_not_ranks(condition):
    assert findings(f"if {condition}:\n    dist.barrier()") == []


@pytest.mark.parametrize(
    ("call", "backends"),
    [
        ("accelerator.save_state(out)", "DeepSpeed and FSDP"),
        ("accelerator.load_state(out)", "DeepSpeed and FSDP"),
        ("accelerator.get_state_dict(model)", "DeepSpeed ZeRO-3 and FSDP"),
        ("self.accelerator.save_model(model, out)", "DeepSpeed ZeRO-3 and FSDP"),
    ],
)
def test_a_state_call_on_the_main_process_only_is_AIF003_naming_backends_and_fix(call, backends):
    finding = only(f"if accelerator.is_main_process:\n    {call}")
    assert finding.code == "AIF003" and f"is collective under {backends}, on a rank-dependent path" in finding.message
    assert "call it on every rank, and write files on the main process only" in finding.message


def test_a_guard_letting_every_rank_through_under_deepspeed_leaves_only_fsdp():
    finding = only("""
        if accelerator.distributed_type == DistributedType.DEEPSPEED or accelerator.is_main_process:
            accelerator.save_state(out)
    """)
    assert finding.code == "AIF003" and "collective under FSDP," in finding.message
    assert "lets every rank through under DeepSpeed only" in finding.message


def test_a_guard_letting_every_rank_through_under_both_backends_is_silent():
    assert (
        findings("""
        sharded = (DistributedType.DEEPSPEED, DistributedType.FSDP)
        if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP) or accelerator.is_main_process:
            accelerator.save_state(out)
    """)
        == []
    )


def test_state_calls_on_every_rank_with_files_written_on_main_are_silent():
    assert (
        findings("""
        def save(model, out):
            accelerator.save_state(out)
            weights = accelerator.get_state_dict(model)
            if accelerator.is_main_process:
                torch.save(weights, out)
                exporter.save_model(out)
                model.save_state(out)
    """)
        == []
    )


@pytest.mark.parametrize(
    ("select", "ignore", "kept"),
    [
        ("", "", ["AIF001", "AIF002", "AIF003"]),
        ("AIF003", "", ["AIF003"]),
        ("", "AIF001,AIF002", ["AIF003"]),
        ("AIF", "AIF002", ["AIF001", "AIF003"]),
        ("AIF002", "AIF", ["AIF002"]),
        ("E501", "", []),
    ],
)
def test_select_and_ignore_choose_codes_as_flake8_and_ruff_do(tmp_path, select, ignore, kept):
    path = _write(
        tmp_path,
        "t.py",
        "if accelerator.is_main_process:\n    logger.info('x', in_order=True)\n    dist.barrier()\n"
        "    accelerator.save_state('out')\n",
    )
    out, err = io.StringIO(), io.StringIO()
    lint.run([str(path)], "json", out, err, lint.parse_codes(select), lint.parse_codes(ignore))
    assert [f["code"] for f in json.loads(out.getvalue())] == kept
    counts = ", ".join(f"{code} {int(code in kept)}" for code in lint.CODES)
    assert err.getvalue().rstrip().endswith(f"by code: {counts}")


def test_the_command_takes_select_and_ignore_and_rejects_a_bad_code(tmp_path):
    path = _write(tmp_path, "t.py", "if accelerator.is_main_process:\n    accelerator.save_state('o')\n")
    repo = Path(__file__).resolve().parents[2]
    proc = _cli([str(path), "--select", "AIF003"], cwd=repo)
    assert proc.returncode == 1 and "AIF003" in proc.stdout and "by code: AIF001 0, AIF002 0, AIF003 1" in proc.stderr
    assert _cli([str(path), "--ignore", "AIF003"], cwd=repo).returncode == 0
    assert _cli([str(path), "--select", "AIF-3"], cwd=repo).returncode == 2


def test_flake8_reports_AIF003_through_the_plugin(tmp_path):
    path = _write(tmp_path, "t.py", "if accelerator.is_main_process:\n    accelerator.save_state('o')\n")
    proc = _flake8_aif(tmp_path, path)
    assert proc.returncode == 1 and ": AIF003 `accelerator.save_state()` is collective under DeepSpeed" in proc.stdout


def test_a_named_fsdp_check_in_the_guard_leaves_only_deepspeed():
    finding = only("""
        is_fsdp = getattr(accelerator.state, "fsdp_plugin", None) is not None
        if accelerator.is_main_process or is_fsdp:
            accelerator.save_state(out)
    """)
    assert "collective under DeepSpeed," in finding.message and "through under FSDP only" in finding.message


def test_the_source_lines_shortcut_finds_what_the_full_walk_finds():
    body = HEADER + textwrap.dedent("""
        LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
        def f(loader, acc: Accelerator):
            with open("x") as handle:
                rank = dist.get_rank() if dist.is_initialized() else 0
            total = acc.gather(t) if acc.is_main_process else None
            if rank == 0:
                logger.info("x", in_order=True)
            for batch in loader:
                if LOCAL_RANK != 0:
                    continue
                dist.barrier()
            try:
                pass
            except ValueError as error:
                if accelerator.is_main_process:
                    accelerator.save_state(out)
    """)
    tree = ast.parse(body)
    full = lint.check_tree(tree)
    assert [f.line - HEADER.count("\n") for f in full] == [6, 8, 12, 17]
    assert lint.check_tree(tree, body.splitlines()) == full


def test_an_error_check_that_raises_inside_one_side_of_a_balanced_branch_is_silent():
    assert (
        findings("""
        def load(shards, full):
            if accelerator.is_main_process:
                for name in shards:
                    if name not in full:
                        raise KeyError(name)
                    dist.broadcast(full[name], src=0)
            else:
                for name in shards:
                    dist.broadcast(empty_like(name), src=0)
    """)
        == []
    )


def test_a_raise_that_ends_the_rank_dependent_block_itself_is_still_a_divergence():
    assert findings("""
        def stop_on_rank_0(flag):
            if dist.get_rank() == 0:
                if flag:
                    print("stopping")
                raise SystemExit("done")
            dist.barrier()
    """) == [(7, "AIF002")]


def test_a_function_defined_inside_a_repeated_loop_does_not_break_the_balancing():
    assert (
        findings("""
        def send(shards):
            if dist.get_rank() == 0:
                for name in shards:
                    def pack(x):
                        return x
                    dist.broadcast(pack(name), src=0)
            else:
                for name in shards:
                    dist.broadcast(name, src=0)
    """)
        == []
    )


@pytest.mark.skipif(sys.version_info < (3, 10), reason="`match` is Python 3.10's")
def test_a_match_whose_every_case_makes_the_collective_balances_the_other_side():
    assert findings("""
        def f(mode):
            if dist.get_rank() == 0:
                match mode:
                    case "fast":
                        dist.barrier()
                    case _:
                        dist.barrier()
            else:
                dist.barrier()
        def g(mode):
            if dist.get_rank() == 0:
                match mode:
                    case "fast":
                        dist.barrier()
            else:
                dist.barrier()
    """) == [(15, "AIF002")]


# The guard styles real codebases use: each is a rank source (`lint.sources`), named in the finding.
OFFSET = HEADER.count("\n")  # the first line of a test's body is OFFSET + 1


def test_a_flag_unpacked_from_a_setup_call_is_a_rank_source_named_with_its_line():
    finding = only("""
        def main():
            global_rank, world_size, is_main_process = setup_distributed_env()
            if is_main_process:
                dist.barrier()
    """)
    line = OFFSET + 3
    assert finding.code == "AIF002" and finding.condition == "if is_main_process:"
    assert finding.source == f"`is_main_process` is bound from `setup_distributed_env()` at line {line}"
    assert finding.source in finding.message


@pytest.mark.parametrize(
    "body",
    [
        "a, b = setup()\nif b:\n    dist.barrier()",
        "for rank, item in enumerate(items):\n    if rank == 0:\n        dist.barrier()",
        "rank, world = init()\nrank = 0\nif rank == 0:\n    dist.barrier()",
        "rank, world = init()\nif rank == 0:\n    dist.barrier()\nelse:\n    dist.barrier()",
        "(rank, n), world = init()\nif rank == 0:\n    dist.barrier()",
    ],
    ids=["other-names", "loop-target", "rebound", "balanced", "nested-unpacking"],
)
def test_unpacked_names_that_are_not_a_rank_or_balance_are_silent(body):
    assert findings(body) == []


def test_tuple_assignment_binds_element_by_element():
    assert findings("n, is_zero = 8, dist.get_rank() == 0\nif is_zero:\n    dist.barrier()") == [(3, "AIF002")]
    assert findings("is_zero, n = False, dist.get_rank() == 0\nif is_zero:\n    dist.barrier()") == []


@pytest.mark.parametrize(
    ("condition", "source"),
    [
        ("self.rank == 0", "`self.rank` is a rank attribute"),
        ("trainer.data_parallel_rank == 0", "`trainer.data_parallel_rank` is a rank attribute"),
        ("args.local_rank in [-1, 0]", "`args.local_rank` is a rank attribute"),
        ("args.global_rank == 0", "`args.global_rank` is a rank attribute"),
        ("state.is_master", "`state.is_master` is a rank attribute"),
        ("distributed_utils.is_master(cfg)", "`distributed_utils.is_master(cfg)` is a rank predicate"),
        ("is_rank_0()", "`is_rank_0()` is a rank predicate"),
        ("utils.is_main_process()", "`utils.is_main_process()` is a rank predicate"),
        ("not dist_utils.is_rank_zero()", "`dist_utils.is_rank_zero()` is a rank predicate"),
        ("int(os.environ['RANK']) == 0", "`os.environ['RANK']` reads the rank's environment variable"),
    ],
)
def test_rank_attributes_on_any_object_and_rank_predicates_are_rank_sources(condition, source):
    finding = only(f"if {condition}:\n    dist.barrier()")
    assert finding.code == "AIF002" and finding.source == source
    assert f"where {source}" in finding.message


def test_a_rank_attribute_evaluates_per_rank_so_the_zero_first_pair_on_args_balances():
    assert (
        findings("""
        def zero_first(args):
            if args.local_rank not in [-1, 0]:
                dist.barrier()
            yield
            if args.local_rank == 0:
                dist.barrier()
    """)
        == []
    )


def test_a_local_alias_of_a_rank_attribute_is_a_rank_source_and_a_chain_is_told_link_by_link():
    finding = only("""
        RANK = lm.rank
        if RANK == 0:
            dist.barrier()
    """)
    assert finding.source == f"`RANK` is bound from `lm.rank` at line {OFFSET + 2}"
    finding = only("""
        def f(lm):
            rank = lm.rank
            is_zero = rank == 0
            if is_zero:
                dist.barrier()
    """)
    assert finding.source.startswith("`is_zero` is bound from `rank == 0`")
    assert finding.source.endswith("and `rank` is bound from `lm.rank` at line " + str(OFFSET + 3))


@pytest.mark.parametrize(
    ("param", "condition"),
    [
        ("is_main_process: bool", "is_main_process"),
        ("rank", "rank == 0"),
        ("*, local_rank: int = -1", "local_rank > 0"),
    ]
    + [("is_master", "not is_master"), ("is_main", "is_main")],
)
def test_a_parameter_named_as_a_rank_or_main_process_flag_is_a_rank_source(param, condition):
    finding = only(f"""
        def finish(model, out, {param}):
            if {condition}:
                accelerator.wait_for_everyone()
    """)
    name = param.lstrip("*, ").split(":")[0]
    assert finding.source == f"`{name}` is a parameter named for a rank or main-process flag (line {OFFSET + 2})"


@pytest.mark.parametrize("param", ["n", "ranking", "lora_rank", "main", "rank_dim"])
def test_a_parameter_with_another_name_is_not_a_rank_source(param):
    assert findings(f"def f({param}):\n    if {param} == 0:\n        dist.barrier()") == []


def test_the_goes_first_pairs_guarded_by_a_parameter_are_candidates_that_balance():
    """yolov5's `torch_distributed_zero_first(local_rank)` and accelerate's `_goes_first(self, is_main)`, as
    written there: their parameter is a rank source, and the balancing rule silences them."""
    assert (
        findings("""
        def torch_distributed_zero_first(local_rank: int):
            if local_rank not in [-1, 0]:
                dist.barrier(device_ids=[local_rank])
            yield
            if local_rank == 0:
                dist.barrier(device_ids=[0])
        class PartialState:
            def _goes_first(self, is_main: bool):
                if not is_main:
                    self.wait_for_everyone()
                yield
                if is_main:
                    self.wait_for_everyone()
    """)
        == []
    )
    assert findings("""
        def _goes_first(self, is_main: bool):
            if not is_main:
                self.wait_for_everyone()
            yield
    """) == [(4, "AIF002")]


# One call deep: the user's own function that certainly makes a collective counts as that collective.


def test_a_call_under_a_rank_guard_to_a_function_that_saves_state_is_reported_at_the_call():
    finding = only("""
        def checkpoint(args, global_step, accelerator):
            save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
            accelerator.save_state(save_path)
        def main():
            if accelerator.is_main_process:
                checkpoint(args, global_step, accelerator)
    """)
    assert (finding.line - OFFSET, finding.code, finding.callee_line) == (7, "AIF003", OFFSET + 4)
    assert finding.message.startswith(
        f"`checkpoint()` calls `accelerator.save_state()` (line {OFFSET + 4}), which is collective under DeepSpeed and FSDP,"
    )
    assert "under `if accelerator.is_main_process:`" in finding.message


@pytest.mark.parametrize(
    ("helper", "call", "code"),
    [
        ("def sync():\n    dist.barrier()", "sync()", "AIF002"),
        ("def report(msg):\n    logger.info(msg, in_order=True)", "report('x')", "AIF001"),
        ("def sync():\n    with timer():\n        accelerator.wait_for_everyone()", "sync()", "AIF002"),
        ("def sync():\n    try:\n        dist.barrier()\n    finally:\n        pass", "sync()", "AIF002"),
        (
            "class T:\n    def sync(self):\n        dist.barrier()\n    def step(self):\n        if self.rank == 0:\n            self.sync()",
            "",
            "AIF002",
        ),
    ],
    ids=["collective", "in-order", "in-with", "in-try", "method-on-self"],
)
def test_a_helper_that_certainly_makes_a_collective_counts_as_it(helper, call, code):
    body = helper + (f"\nif accelerator.is_main_process:\n    {call}" if call else "")
    assert findings(body) == [(body.count("\n") + 1, code)]


@pytest.mark.parametrize(
    "body",
    [
        "def sync(flag):\n    if flag:\n        dist.barrier()\nif accelerator.is_main_process:\n    sync(True)",
        "def sync(n):\n    if n == 0:\n        return\n    dist.barrier()\nif accelerator.is_main_process:\n    sync(1)",
        "def sync():\n    for _ in range(2):\n        dist.barrier()\nif accelerator.is_main_process:\n    sync()",
        "def inner():\n    dist.barrier()\ndef outer():\n    inner()\nif accelerator.is_main_process:\n    outer()",
        "def sync():\n    dist.barrier()\nif accelerator.is_main_process:\n    sync()\nelse:\n    dist.barrier()",
        "def sync():\n    dist.barrier()\nsync()",
        "def save():\n    torch.save(model, 'x')\nif accelerator.is_main_process:\n    save()",
        "def sync():\n    f = lambda: dist.barrier()\nif accelerator.is_main_process:\n    sync()",
        "def sync(xs):\n    [dist.barrier() for _ in xs]\nif accelerator.is_main_process:\n    sync([])",
        "def sync(x):\n    x and dist.barrier()\nif accelerator.is_main_process:\n    sync(0)",
        "class A:\n    def sync(self):\n        dist.barrier()\nclass B:\n    def sync(self):\n        pass\n"
        + "    def step(self):\n        if self.rank == 0:\n            self.sync()",
    ],
    ids=["behind-a-parameter", "after-an-early-return", "in-a-loop", "two-deep", "balanced", "every-rank"]
    + ["no-collective", "in-a-lambda", "in-a-comprehension", "behind-and", "ambiguous-method"],
)
def test_a_helper_that_may_not_make_the_collective_or_is_balanced_is_silent(body):
    assert findings(body) == []


def test_noqa_silences_a_helper_call_and_a_parameter_guard(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        def sync():
            dist.barrier()
        def step(rank):
            if rank == 0:
                sync()  # noqa: AIF002
            if rank == 1:
                dist.barrier()  # noqa: AIF002
    """,
    )
    assert _run([path])[0] == 0


def _package(tmp_path, helper_import):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text("def checkpoint(accelerator, out):\n    accelerator.save_state(out)\n")
    train = _write(
        pkg,
        "train.py",
        f"""
        {helper_import}
        def main(out):
            if accelerator.is_main_process:
                checkpoint(accelerator, out)
    """,
    )
    return pkg, train


@pytest.mark.parametrize(
    "helper_import", ["from .utils import checkpoint", "from pkg.utils import checkpoint", "from . import utils"]
)
def test_a_helper_from_a_file_given_together_is_followed_and_a_file_alone_is_not(tmp_path, helper_import):
    pkg, train = _package(tmp_path, helper_import)
    if helper_import.endswith("import utils"):
        train.write_text(train.read_text().replace("checkpoint(accelerator", "utils.checkpoint(accelerator"))
    code, out, _ = _run([pkg], "json")
    [finding] = json.loads(out)
    assert code == 1 and finding["path"] == str(train) and finding["code"] == "AIF003"
    assert "calls `accelerator.save_state()` (utils.py:2)" in finding["message"] and finding["callee_line"] == 2
    assert _run([train])[:2] == (0, "")  # alone, the helper it imports is not read


def test_a_chain_from_a_parameter_names_both_links():
    finding = only("""
        def f(rank):
            is_zero = rank == 0
            if is_zero:
                dist.barrier()
    """)
    assert finding.source == (
        f"`is_zero` is bound from `rank == 0` at line {OFFSET + 3}, "
        f"and `rank` is a parameter named for a rank or main-process flag (line {OFFSET + 2})"
    )


def test_a_relative_import_from_above_the_root_is_not_followed_and_does_not_crash(tmp_path):
    pkg, train = _package(tmp_path, "from " + "." * 64 + "utils import checkpoint")
    assert _run([pkg])[:2] == (0, "")


def _pythons():
    """This interpreter and every other Python 3.9 to 3.13 found that runs: `python3.X` on PATH, or pyenv's."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = {sys.executable}
    for minor in range(9, 14):
        named = [shutil.which(f"python3.{minor}"), *sorted(str(p) for p in pyenv.glob(f"3.{minor}.*/bin/python3"))]
        for python in filter(None, named):
            if subprocess.run([python, "-c", ""], capture_output=True, timeout=60).returncode == 0:
                found.add(python)
                break
    return sorted(found)


@pytest.mark.parametrize("python", _pythons())
@pytest.mark.parametrize("how", ["module", "script"])
def test_lint_command_runs_with_nothing_installed(tmp_path, python, how):
    """`python -m accelerate_inorder_fix lint` and the `accelerate-inorder-fix lint` entry point, on a Python
    with no site-packages (`-S`: no wrapt, accelerate or torch) and only this clone on its path, still check."""
    bad = tmp_path / "bad.py"
    bad.write_text("if accelerator.is_main_process:\n    logger.info('saved', in_order=True)\n")
    if how == "module":
        command = [python, "-S", "-m", "accelerate_inorder_fix"]
    else:  # what the console script does, its own path in sys.argv[0]
        entry = "import sys; from accelerate_inorder_fix.cli.main import main; sys.exit(main())"
        command = [python, "-S", "-c", f"import sys; sys.argv[0] = '/venv/bin/accelerate-inorder-fix'; {entry}"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [*command, "lint", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.returncode == 1 and "bad.py:2:5: AIF001" in done.stdout, done
