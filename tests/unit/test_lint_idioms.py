"""Promise: `lint` stays silent where the data keeps every rank on the same calls, gives one finding per
divergent branch saying how the ranks' counts differ, and sees the training frameworks' own idioms: a
collective wrapper behind a check the same on every rank, a rank flag held on `self`, Lightning's, OpenRLHF's,
DeepSpeed's, transformers' and mmengine's collectives and guards, a framework's object passed to a helper, and a
file written for a newer Python."""

import ast
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from accelerate_inorder_fix import lint


def found(source):
    """(line, code) of each finding of a module."""
    return [(f.line, f.code) for f in lint.check_tree(ast.parse(textwrap.dedent(source)))]


def only(source):
    [finding] = lint.check_tree(ast.parse(textwrap.dedent(source)))
    return finding


BROADCAST_PYOBJ = """
import torch.distributed as dist

def broadcast_pyobj(data, rank, src=0):
    if rank == src:
        if len(data) == 0:
            size = torch.tensor([0])
            dist.broadcast(size, src=src)
        else:
            size = torch.tensor([len(data)])
            dist.broadcast(size, src=src)
            dist.broadcast(payload(data), src=src)
        return data
    else:
        size = torch.tensor([0])
        dist.broadcast(size, src=src)
        n = size.item()
        if n == 0:
            return []
        buffer = torch.empty(n)
        dist.broadcast(buffer, src=src)
        return loads(buffer)
"""


def test_a_count_that_depends_on_a_value_a_collective_delivered_is_silent():
    assert found(BROADCAST_PYOBJ) == []


def test_a_test_of_undelivered_data_on_one_side_only_is_still_a_finding():
    finding = only("""
        import torch.distributed as dist
        def f(data, rank):
            if rank == 0:
                if cfg.skip_sync:
                    return
                dist.broadcast(data, src=0)
            else:
                dist.broadcast(buffer, src=0)
    """)
    assert (finding.line, finding.code) == (7, "AIF002")
    assert "ranks 1-3 make 1, rank 0 makes 0" in finding.message


def test_one_finding_per_divergent_branch_saying_which_counts_differ():
    finding = only("""
        import torch.distributed as dist
        def f(t):
            if dist.get_rank() == 0:
                dist.barrier()
                dist.all_reduce(t)
                dist.barrier()
    """)
    assert finding.line == 5
    assert "(and 2 more under it: lines 6, 7)" in finding.message
    assert "`dist.barrier()`: rank 0 makes 2, ranks 1-3 make 0" in finding.message
    assert "`dist.all_reduce()`: rank 0 makes 1, ranks 1-3 make 0" in finding.message


def test_a_collective_wrapper_behind_a_check_the_same_on_every_rank_counts():
    first, second = lint.check_tree(
        ast.parse(
            textwrap.dedent("""
        import torch.distributed as dist
        def barrier():
            if is_distributed():
                dist.barrier()
        def sync():
            if not dist.is_initialized():
                return
            dist.barrier()
        def step(rank):
            if rank == 0:
                barrier()
            if rank == 1:
                sync()
    """)
        )
    )
    assert [(f.line, f.code) for f in (first, second)] == [(12, "AIF002"), (14, "AIF002")]
    assert "`barrier()` calls `dist.barrier()` (line 5, when `is_distributed()`)" in first.message
    assert "`sync()` calls `dist.barrier()` (line 9)" in second.message


def test_a_wrapper_whose_check_reads_a_parameter_or_local_is_not_followed():
    assert (
        found("""
        import torch.distributed as dist
        def barrier(flag):
            if flag:
                dist.barrier()
        def other():
            n = world()
            if n > 1:
                dist.barrier()
        def step(rank):
            if rank == 0:
                barrier(True)
                other()
    """)
        == []
    )


def test_a_rank_flag_bound_to_a_self_attribute_is_a_rank_source():
    finding = only("""
        import torch.distributed as dist
        class Recipe:
            def save(self):
                if self._is_rank_zero:
                    dist.barrier()
            def __init__(self, cfg):
                _, rank = get_world_size_and_rank()
                self._is_rank_zero = rank == 0
    """)
    assert (finding.line, finding.code) == (6, "AIF002")
    assert "`self._is_rank_zero` is bound from `rank == 0` at line 9" in finding.source
    assert "rank 0 makes 1, ranks 1-3 make 0" in finding.message


def test_a_self_attribute_bound_otherwise_too_is_not_a_rank_source():
    assert (
        found("""
        import torch.distributed as dist
        class Recipe:
            def __init__(self, rank):
                self._is_rank_zero = rank == 0
            def reset(self):
                self._is_rank_zero = True
            def save(self):
                if self._is_rank_zero:
                    dist.barrier()
    """)
        == []
    )


@pytest.mark.parametrize(
    "setup, call, code",
    [
        ("", "fabric.barrier()", "AIF002"),
        ("", "fabric.all_reduce(t)", "AIF002"),
        ("", "fabric.save(path, state)", "AIF002"),
        ("f = L.Fabric(devices=2)", "f.broadcast(t)", "AIF002"),
        ("", "trainer.strategy.barrier()", "AIF002"),
        ("", "self.strategy.all_reduce(t)", "AIF002"),
        ("s = DeepspeedStrategy(seed=1)", "s.save_model(model, tokenizer, out)", "AIF002"),
        ("model_engine, optimizer, _, _ = deepspeed.initialize(model=m)", "model_engine.save_checkpoint(d)", "AIF002"),
        ("model, optimizer, _, _ = deepspeed.initialize(model=m)", "model.save_checkpoint(d)", "AIF002"),
        ("", "trainer.save_model(out)", "AIF003"),
        ("from mmengine.dist import all_reduce", "all_reduce(t)", "AIF002"),
        ("from mmengine import dist", "dist.barrier()", "AIF002"),
        ("import mmengine.dist as mdist", "mdist.collect_results(parts, n)", "AIF002"),
    ],
)
def test_the_frameworks_collectives(setup, call, code):
    source = (
        f"import deepspeed\nimport lightning as L\n{setup}\ndef f(self, t, rank):\n    if rank == 0:\n        {call}\n"
    )
    assert [f.code for f in lint.check_tree(ast.parse(source))] == [code]


@pytest.mark.parametrize("call", ["model.save_checkpoint(d)", "engine.save(x)", "tool.barrier()", "fabric.print(x)"])
def test_the_same_method_names_on_other_objects_are_silent(call):
    source = f"def f(self, t, rank):\n    if rank == 0:\n        {call}\n"
    assert lint.check_tree(ast.parse(source)) == []


def test_mmengine_master_only_runs_the_function_on_rank_zero():
    finding = only("""
        from mmengine.dist import master_only, barrier
        @master_only
        def dump(results):
            barrier()
    """)
    assert (finding.line, finding.code) == (5, "AIF002") and "@master_only" in finding.message


def test_hf_callbacks_attribute_form_of_is_world_process_zero():
    assert found("""
        import torch.distributed as dist
        class Callback:
            def on_save(self, args, state, control, **kwargs):
                if state.is_world_process_zero:
                    dist.barrier()
            def on_log(self, args, state, control, **kwargs):
                if not self.trainer.state.is_world_process_zero:
                    return
                dist.barrier()
    """) == [(6, "AIF002"), (10, "AIF002")]


def test_an_accelerator_passed_to_a_helper_makes_its_parameter_one():
    finding = only("""
        from accelerate import Accelerator
        accelerator = Accelerator()
        def checkpoint(acc, path):
            acc.save_state(path)
        def train(out):
            if accelerator.is_main_process:
                checkpoint(accelerator, out)
    """)
    assert (finding.line, finding.code) == (8, "AIF003")
    assert "`checkpoint()` calls `acc.save_state()` (line 5)" in finding.message
    assert (
        found("""
        def checkpoint(acc, path):
            acc.save_state(path)
        def train(rank, exporter, out):
            if rank == 0:
                checkpoint(exporter, out)
    """)
        == []
    )


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="`type X = ...` parses from Python 3.12")
def test_newer_syntax_names_the_python_the_file_needs_and_the_rest_is_checked(tmp_path):
    new = tmp_path / "new.py"
    new.write_text("import os\ntype Vector = list[float]\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n")
    command = [sys.executable, str(REPO / "scripts" / "lint-hook"), str(new), str(bad)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "bad.py:3:5: AIF002" in proc.stdout
    assert (
        "new.py:2:6: cannot parse: the file needs Python 3.12 or newer (a `type` statement), "
        f"this is Python {sys.version_info[0]}.{sys.version_info[1]}" in (proc.stderr)
    )
    assert "1 finding(s) in 1 file(s) checked, 1 not checked" in proc.stderr and "the rest checked" in proc.stderr


def test_flake8_gives_the_same_findings_as_the_command(tmp_path):
    path = tmp_path / "recipe.py"
    path.write_text(
        textwrap.dedent("""
        import torch.distributed as dist
        class Recipe:
            def __init__(self, rank):
                self._is_rank_zero = rank == 0
            def save(self, state):
                if state.is_world_process_zero:
                    dist.barrier()
                if self._is_rank_zero:
                    dist.barrier()
                    dist.barrier()
        """)
    )
    flake8 = subprocess.run(
        [sys.executable, "-m", "flake8", "--select", "AIF", str(path)], capture_output=True, text=True, timeout=60
    )
    command = subprocess.run(
        [sys.executable, "-m", "accelerate_inorder_fix", "lint", str(path)], capture_output=True, text=True, timeout=60
    )
    assert command.returncode == 1 and len(command.stdout.splitlines()) == 2
    assert flake8.stdout.splitlines() == command.stdout.splitlines(), flake8.stderr


def test_a_value_only_read_to_build_a_collectives_argument_is_not_delivered():
    finding = only("""
        import torch.distributed as dist
        def train(loss, args, step, out):
            videos[0] = torch.empty(1)
            dist.broadcast(videos[0], src=0)
            average = accelerator.gather(loss.repeat(args.batch_size)).mean()
            if accelerator.is_main_process:
                if step % args.checkpointing_steps == 0:
                    accelerator.save_state(out)
    """)
    assert (finding.line, finding.code) == (9, "AIF003")


SERVER_WORKER = """
import torch
import torch.distributed as dist

def deploy(model, serve):
    if dist.get_rank() == 0:
        serve()
        dist.broadcast(torch.tensor([1]), src=0)
    else:
        {other}
    dist.barrier()
{extra}
"""


@pytest.mark.parametrize(
    "other, extra",
    [
        ("model.generate_other_ranks()", ""),  # a method defined in another file
        ("self_serve()", "from .worker import self_serve"),  # the user's own module
        ("worker_loop()", "def worker_loop():\n    while True:\n        dist.broadcast(m, src=0)\n"),
    ],
)
def test_a_rank_split_whose_other_side_calls_what_lint_cannot_count_is_silent(other, extra):
    """The server/worker split: rank 0 sends commands, the others receive them in a loop lint cannot count."""
    assert found(SERVER_WORKER.format(other=other, extra=extra)) == []


@pytest.mark.parametrize(
    "other, extra",
    [
        ("pass", ""),
        ("logger.info('waiting')", ""),
        ("time.sleep(1)", "import time"),
        ("idle()", "def idle():\n    return 0\n"),  # a function of this file that makes no collective
    ],
)
def test_a_rank_split_whose_other_side_makes_no_collective_is_still_a_finding(other, extra):
    assert found(SERVER_WORKER.format(other=other, extra=extra)) == [(8, "AIF002")]


@pytest.mark.parametrize("under", ["", "if not os.path.isdir(d):"])
def test_rank_0_raising_before_the_others_barrier_is_a_finding_at_any_depth(under):
    """One rule for error paths: a `raise` right under a rank test is those ranks leaving, at the top of a
    function or under a test every rank evaluates alike (Megatron-DeepSpeed's retro_dataset.py)."""
    indent = "    " if under else ""
    body = textwrap.indent("if dist.get_rank() == 0:\n    raise Exception(d)\ndist.barrier()\nexit()\n", indent)
    source = "import os\nimport torch.distributed as dist\ndef check(d):\n" + textwrap.indent(
        (under + "\n" if under else "") + body, "    "
    )
    assert found(source) == [(7 if under else 6, "AIF002")]


def test_a_raise_under_a_test_every_rank_evaluates_alike_is_an_error_check_at_any_depth():
    """The other half of the rule: a `raise` right under a test the same on every rank is an error check (a
    crash), not a path to balance, at the top of a function or inside a rank's branch."""
    source = """
        import torch.distributed as dist
        def load(shards, full):
            if dist.get_rank() == 0:
                for name in shards:
                    if name not in full:
                        raise KeyError(name)
                    dist.broadcast(full[name], src=0)
            else:
                for name in shards:
                    dist.broadcast(empty_like(name), src=0)
            if not full:
                raise ValueError("empty")
            dist.barrier()
    """
    assert found(source) == []


@pytest.mark.parametrize(
    "setup",
    [
        # NeMo's deploy_inframework_hf_triton.py: a default, then another constant under a rank test
        "start = True\nif dist.is_initialized():\n    if dist.get_rank() > 0:\n        start = False",
        # nanoGPT's train.py: from the rank on one side, a constant on the other
        "if ddp:\n    start = int(os.environ['RANK']) == 0\nelse:\n    start = True",
    ],
)
def test_a_flag_rank_dependent_through_two_bindings_is_a_rank_source(setup):
    source = "import os\nimport torch.distributed as dist\n" + setup + "\nif start:\n    dist.barrier()\n"
    [(line, code)] = found(source)
    assert (code, source.splitlines()[line - 1].strip()) == ("AIF002", "dist.barrier()")


@pytest.mark.parametrize(
    "setup",
    [
        "start = True\nif args.serve:\n    start = False",  # no rank test
        "start = dist.get_rank() == 0\nstart = True",  # the constant overwrites the rank, on every rank
        "if ddp:\n    start = int(os.environ['RANK']) == 0\nelse:\n    start = probe()",  # not a constant
    ],
)
def test_a_flag_bound_otherwise_is_not_a_rank_source(setup):
    source = "import os\nimport torch.distributed as dist\n" + setup + "\nif start:\n    dist.barrier()\n"
    assert found(source) == []


@pytest.mark.parametrize(
    "guard",
    ["args.should_save", "self.args.should_save", "training_args.should_save", "get_fs_local_rank() == 0"]
    + ["mpu.is_last_rank()"],
)
def test_the_training_arguments_should_save_olmo_and_megatron_rank_sources(guard):
    [finding] = lint.check_tree(ast.parse(f"import torch.distributed as dist\nif {guard}:\n    dist.barrier()\n"))
    assert (finding.line, finding.code) == (3, "AIF002")


@pytest.mark.parametrize("guard", ["self.should_save", "config.should_save", "should_save"])
def test_should_save_on_another_object_is_not_a_rank_source(guard):
    assert found(f"import torch.distributed as dist\nif {guard}:\n    dist.barrier()\n") == []


def test_a_branch_on_a_value_just_broadcast_where_the_receivers_test_the_delivered_copy_is_silent():
    """The sender broadcasts the size and then tests its own data; the receivers test the size delivered."""
    assert (
        found("""
        import torch
        import torch.distributed as dist
        def send(data, rank):
            if rank == 0:
                dist.broadcast(torch.tensor([len(data)]), src=0)
                if len(data) == 0:
                    return
                dist.broadcast(payload(data), src=0)
            else:
                size = torch.tensor([0])
                dist.broadcast(size, src=0)
                if size.item() == 0:
                    return
                dist.broadcast(torch.empty(size.item()), src=0)
    """)
        == []
    )


def test_a_branch_on_a_value_not_broadcast_is_still_a_finding():
    """The receivers never learn the sender's test: its second broadcast has no partner."""
    [(line, code)] = found("""
        import torch
        import torch.distributed as dist
        def send(data, rank):
            if rank == 0:
                dist.broadcast(torch.tensor([len(data)]), src=0)
                if len(data) == 0:
                    return
                dist.broadcast(payload(data), src=0)
            else:
                size = torch.tensor([0])
                dist.broadcast(size, src=0)
    """)
    assert code == "AIF002"
