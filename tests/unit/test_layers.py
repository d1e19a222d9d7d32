"""Promise: the package's layers point one way (import-linter's contracts in pyproject.toml hold) and no import
cycle exists anywhere in it, function-local imports included (grimp reads every import statement)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from conftest import REPO


PACKAGE = "accelerate_inorder_fix"


def test_import_linter_contracts_are_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", proc.stdout), proc.stdout


def _graph():
    sys.path.insert(0, str(REPO))  # the repo's package, not an installed copy
    try:
        return grimp.build_graph(PACKAGE, cache_dir=None)
    finally:
        sys.path.remove(str(REPO))


def test_the_graph_sees_function_local_imports():
    # cli.main imports cli.check inside cmd_check: the graph must hold that edge, or the next test proves little.
    graph = _graph()
    assert graph.direct_import_exists(importer=f"{PACKAGE}.cli.main", imported=f"{PACKAGE}.cli.check")


def test_no_import_cycles():
    graph = _graph()
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.append(" -> ".join((module, *back)))
    assert cycles == []


def test_every_module_is_in_the_graph():
    root = REPO / PACKAGE
    files = {
        ".".join((PACKAGE, *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for p in root.rglob("*.py")
    }
    assert files == set(_graph().modules)


def _lint_imports_with(tmp_path, planted):
    """lint-imports on a copy of the package whose lint gains the import `planted` (and a new module beside it)."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / PACKAGE, copy / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy)
    (copy / PACKAGE / "brand_new.py").write_text('"""A module the contracts have never heard of."""\n')
    init = copy / PACKAGE / "lint" / "__init__.py"
    init.write_text(init.read_text() + f"\n{planted}  # noqa\n")
    lint_imports = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(copy)}
    proc = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=copy, env=env, capture_output=True, text=True, timeout=120
    )
    return proc.stdout.replace("\n", " ")


@pytest.mark.parametrize(
    "planted",
    [
        "from .. import _diagnostics",
        "from .. import brand_new",
        "from ..store import teardown",
        "import accelerate_inorder_fix",
    ],
)
def test_the_lint_may_import_no_other_module_of_the_package_a_new_one_included(tmp_path, planted):
    # Any module of the package, the stderr warnings and a module added later included, breaks the contract.
    output = _lint_imports_with(tmp_path, planted)
    assert re.search(
        r"lint (imports nothing from the rest|does not import the package's __init__)[^.]*BROKEN", output
    ), output


def test_the_lint_may_import_the_standard_library(tmp_path):
    # The control of the test above: its copy, a new module and a planted import, breaks only what it plants.
    output = _lint_imports_with(tmp_path, "import os")
    assert re.search(r"lint imports nothing from the rest[^.]*KEPT", output), output
    assert re.search(r"lint does not import the package's __init__ either[^.]*KEPT", output), output
