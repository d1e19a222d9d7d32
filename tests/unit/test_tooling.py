"""Promise: the project's tooling is consistent: the CI workflow is valid for GitHub (its builtin schema ships inside
check-jsonschema, so this runs offline) and takes its releases from scripts/releases.txt; the pre-commit hooks run
the ruff that the test extra pins; LICENSE is the Apache-2.0 text that pyproject.toml declares."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RELEASES, REPO


WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"


def test_ci_workflow_is_valid_for_github():
    checker = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


def test_ci_runs_the_lint_the_unit_tier_and_each_release_from_the_one_list():
    text = WORKFLOW.read_text()
    for step in (
        "ruff check .",
        "ruff format --check .",
        "lint-imports",
        "mypy",
        "pytest tests/unit",
        "pytest tests/jobs",
    ):
        assert step in text, step
    assert "scripts/releases.txt" in text and "fromJSON(needs.lint-unit.outputs.releases)" in text
    assert not any(release in text for release in RELEASES)  # no second copy of the list
    assert "bash scripts/setup.sh" in text  # torch==2.13.0 goes in first, there


def _pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the package and its tests import on 3.9 (vermin)
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_pre_commit_runs_the_pinned_ruff():
    pin = next(d for d in _pyproject()["project"]["optional-dependencies"]["test"] if d.startswith("ruff"))
    config = (REPO / ".pre-commit-config.yaml").read_text()
    assert "repo: https://github.com/astral-sh/ruff-pre-commit" in config
    assert re.search(r"rev: v(\S+)", config).group(1) == pin.split("==")[1]
    assert "id: ruff\n" in config and "id: ruff-format" in config


def test_license_is_the_apache_2_text():
    text = (REPO / "LICENSE").read_text()
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(re.findall(r"^\s+\d+\. \w", text, flags=re.M)) == 9  # the nine sections


def test_typed_public_api():
    import typing

    import accelerate_inorder_fix as fix
    from accelerate_inorder_fix import hook_status as startup
    from accelerate_inorder_fix.cli import main as cli

    assert (REPO / "accelerate_inorder_fix" / "py.typed").is_file()
    for func in (fix.patch, fix.unpatch, fix.is_patched, fix.configure, startup.status, cli.main):
        hints = typing.get_type_hints(func)
        assert "return" in hints, func.__qualname__
        assert set(hints) - {"return"} == set(func.__code__.co_varnames[: func.__code__.co_argcount]), func
