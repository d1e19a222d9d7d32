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


# A `go` hands the turns over through the store and calls no barrier: only without a store do the turns
# run between `wait_for_everyone()` barriers. A sentence that names the check-in (or a `go`), a barrier
# and a verb that runs it, with no "no store" context, says otherwise.
BARRIER_WORDS = re.compile(
    r"wait_for_everyone|upstream'?s (?:own )?barriers|\bthe (?:N )?barriers run\b|\bruns? (?:the )?(?:N )?barriers\b"
)
CHECK_IN_WORDS = re.compile(
    r"\bgo\b|check-in|\bcheck(?:s|ed)? (?:the call |each call |every call )?in\b|after every rank has", re.IGNORECASE
)
RUN_WORDS = re.compile(r"\b(?:calls|runs?|synchroni[sz]es|then)\b")  # verbs: not the noun "call"
NO_STORE = re.compile(
    r"without (?:a|the|any) (?:c10d )?store|\bno (?:c10d )?store\b|no default process group|`\"?plain\"?`",
    re.IGNORECASE,
)


def says_a_go_runs_barriers(sentence):
    """Whether `sentence` says a checked-in call (a `go`) runs/calls/synchronises with upstream's barriers."""
    return bool(
        BARRIER_WORDS.search(sentence)
        and CHECK_IN_WORDS.search(sentence)
        and RUN_WORDS.search(sentence)
        and not NO_STORE.search(sentence)
    )


def _sentences(text):
    """Sentences and clauses (split at `.`, `;` and `:` before a space), paragraph by paragraph, on one line each."""
    for paragraph in re.split(r"\n\s*\n", text):
        yield from re.split(r"(?<=[.;:])\s+", " ".join(paragraph.split()))


@pytest.mark.parametrize(
    ("sentence", "says"),
    [
        (
            "6. Barrier mode synchronises with upstream's own `PartialState().wait_for_everyone()`, after every "
            "rank has checked the call in through the job's store.",
            True,
        ),
        (
            "**Barrier mode** (the default) checks each call in through the store, then calls `wait_for_everyone()`",
            True,
        ),
        ("barrier mode checks in through the c10d store and then calls accelerate's own `wait_for_everyone()`;", True),
        ("each in_order call checks in through the job's c10d store, then runs upstream's barriers only when", True),
        ('Without a store (`"plain"`), the N turns run between upstream\'s `wait_for_everyone()` barriers, as', False),
        (
            "this package, once every rank has checked in, passes the turns point to point through the job's "
            "store, and runs the N barriers only where there is no store.",
            False,
        ),
        (
            "The explorer's `wait_for_everyone()` is a modelled collective, so a `go` call's turns that entered "
            "one would show.",
            False,
        ),
        (
            "on `go` the other ranks take their turns point to point through the store: no barrier, no collective.",
            False,
        ),
    ],
)
def test_the_go_barrier_detector_tells_the_two_apart(sentence, says):
    assert says_a_go_runs_barriers(sentence) is says


def test_no_page_says_a_go_calls_wait_for_everyone():
    """README, every docs/*.md page and `status`'s text: a `go` calls no barrier (only a job without a store does)."""
    from accelerate_inorder_fix.cli import status

    texts = {page.name: page.read_text() for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    texts["status"] = "\n\n".join(status.MODE_MEANS.values())
    wrong = [(name, s) for name, text in texts.items() for s in _sentences(text) if says_a_go_runs_barriers(s)]
    assert wrong == []
