"""The store-scale simulator (benchmarks/bench_scale.py, outside the wheel): the CLI points there, and the
package never imports it."""

import ast
from pathlib import Path

import pytest

from accelerate_inorder_fix.cli import main
from benchmarks import bench_scale


PACKAGE = Path(__file__).resolve().parents[2] / "accelerate_inorder_fix"


@pytest.mark.parametrize("argv", [["bench", "scale", "--ranks", "8"], ["bench", "--scale", "--ranks", "8"]])
def test_cli_bench_scale_says_where_the_simulator_went(capsys, argv):
    assert main.main(argv) == main.EXIT_USAGE
    assert "python benchmarks/bench_scale.py" in capsys.readouterr().err


def test_the_simulator_lives_outside_the_package():
    assert callable(bench_scale.measure)
    assert not list(PACKAGE.rglob("bench_scale.py"))


def test_the_package_never_imports_the_developer_benchmarks():
    imported = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:  # absolute only
                imported.add(node.module)
    assert "typing" in imported
    assert not [name for name in imported if name.split(".")[0] in ("benchmarks", "bench_records", "bench_scale")]
    assert not list(PACKAGE.rglob("bench_records.py"))
