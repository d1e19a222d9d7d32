"""The documentation matches the code: the wire format docs/gather-mode.md shows is the one the main process
decodes, and every test the protocol's invariants name exists; README starts with usage and its links resolve;
the demo installs only what `check` needs; the pre-commit hook runs the lint command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from accelerate_inorder_fix.gather import queues, records


REPO = Path(__file__).resolve().parents[2]
GUARD = re.compile(r"(test_\w+\.py)::(test_\w+)")


def test_the_wire_format_shown_is_the_one_decoded():
    text = (REPO / "docs" / "gather-mode.md").read_text()
    section = text[text.index("## Wire format") : text.index("## Security")]
    example = section[section.index("```json") + len("```json") : section.index("```", section.index("```json") + 7)]
    identity, record = records.from_bytes(example.encode())
    assert identity == (("train.py", "training_step", 120), 7)
    assert (record.msg, record.levelno, record.funcName, record.epoch) == ("[RANK 1] step 120", 20, "training_step", 3)
    assert '"v"' not in text  # no other version's format


def test_every_invariant_names_a_test_that_exists():
    named = GUARD.findall(queues.__doc__) + GUARD.findall((REPO / "docs" / "gather-mode.md").read_text())
    assert len(set(named)) >= 10, named
    for filename, test in set(named):
        (path,) = list((REPO / "tests").rglob(filename))
        assert re.search(rf"^def {test}\(", path.read_text(), re.MULTILINE), f"{filename}::{test}"


def test_readme_and_docs_links_resolve():
    """Every relative link of README and docs/ names a file that exists (the docs were split out of README)."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_readme_starts_with_usage():
    """The first 60 lines: install from a clone, the launch that really starts CPU ranks, and `check`."""
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:60])
    for needed in (
        "pip install torch==2.13.0",
        "pip install .",
        "not on PyPI yet",
        "ACCELERATE_INORDER_FIX=0",
        "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu",
        "torchrun --nproc_per_node",
        "accelerate-inorder-fix check",
    ):
        assert needed in head, needed
    assert "bash scripts/demo.sh" in (REPO / "README.md").read_text()
    assert "bash scripts/test.sh" in (REPO / "README.md").read_text()  # CI runs it (.ci/run)


def test_demo_installs_only_what_check_needs():
    """demo.sh: its own venv, torch 2.13.0 before accelerate, no test environment (scripts/setup.sh)."""
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert "setup.sh" not in "\n".join(line for line in demo.splitlines() if not line.startswith("#"))
    assert demo.index("torch==2.13.0") < demo.index('"accelerate==$ACCELERATE"')
    assert "check --nproc 4" in demo


def test_pre_commit_hook_is_the_lint_script_and_installs_nothing():
    """.pre-commit-hooks.yaml: one hook, a script pre-commit runs from its clone (`language: script`: no
    environment built, nothing installed), on Python files."""
    yaml = pytest.importorskip("yaml")
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "accelerate-inorder-lint"
    assert (hook["language"], hook["types"], hook["entry"]) == ("script", ["python"], "scripts/lint-hook")
    assert (REPO / hook["entry"]).stat().st_mode & 0o111  # pre-commit runs it as a program


def test_pre_commit_hook_fails_on_a_finding_without_site_packages(tmp_path):
    """The hook run as pre-commit runs it (file names appended), on a Python with no site-packages at all
    (`-I -S`): nothing of the package, wrapt, torch or accelerate importable, and it still checks."""
    bad, good = tmp_path / "bad.py", tmp_path / "good.py"
    bad.write_text("if accelerator.is_main_process:\n    logger.info('saved', in_order=True)\n")
    good.write_text("logger.info('saved', in_order=True)\n")
    command = [sys.executable, "-I", "-S", str(REPO / "scripts" / "lint-hook")]
    found = subprocess.run([*command, str(bad), str(good)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    clean = subprocess.run([*command, str(good)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert found.returncode == 1 and "bad.py:2:5: AIF001" in found.stdout, found
    assert clean.returncode == 0 and clean.stdout == "", clean
