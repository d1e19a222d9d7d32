"""The same checks as a flake8 plugin (entry point `AIF` in `flake8.extension`): `flake8 --select AIF`.

Projects that already run flake8 in pre-commit or CI get AIF001, AIF002 and AIF003 with no new step; flake8 itself
finds the files, reads its configuration and honours `# noqa`. flake8 hands over the parsed tree, so the
plugin is only `walker.check_tree` with flake8's 0-based column.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from .walker import check_tree


class Plugin:
    """flake8's tree plugin protocol: constructed with the module's tree, `run()` yields the findings."""

    name = "accelerate-inorder-fix"
    version = "4"

    def __init__(self, tree: ast.Module, lines: Sequence[str]) -> None:
        self.tree = tree
        self.lines = lines  # flake8 hands over the source lines when asked: they spare a full walk

    def run(self) -> Iterator[tuple[int, int, str, type[Plugin]]]:
        for finding in check_tree(self.tree, self.lines):
            yield finding.line, finding.col - 1, f"{finding.code} {finding.message}", type(self)
