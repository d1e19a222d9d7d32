"""What a backticked name in the documentation must resolve to: the checker of test_docs.py's names test.

A span such as `handoff.Handoff`, `store/teardown.py`, `queues.Outbox.post`, `session.SESSION.close` or
`GatherSide` is read as the package's when its first word is a module, class or module-level object of the
package, or a word nobody declared as someone else's (`EXTERNAL`): then every part must exist, read from
the source with `ast` (nothing is imported). Past a class's member the type is not followed (accepted).
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
PACKAGE = "accelerate_inorder_fix"
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
CALL = re.compile(r"^([A-Za-z_]\w*)\(\)$")
CAMEL = re.compile(r"^_?[A-Z][a-z0-9]+[A-Z]\w*$")  # `InOrderSession`, not `GO` or `Path`
FILE = re.compile(r"^[\w./-]*\w\.(py|md|sh|toml|txt|yaml|pth|typed|json)$|^[\w.-]+(/[\w.-]+)+/?$")
# First words that are other people's: torch's, accelerate's, the standard library's, user code's variables.
EXTERNAL = {
    *("a", "accelerate", "accelerator", "adapter", "adapter_class", "args", "ast", "body", "deepspeed", "dist"),
    *("flake8", "functools", "json", "lm", "logger", "logging", "module", "nanotron", "os", "self", "socket"),
    *("sys", "tensor", "time", "torch", "trainer", "transformers", "store", "outbox", "wrapt", "threading"),
    *("DistributedType", "JSONEncoder", "Logger", "LoggerAdapter", "MultiProcessAdapter", "QueueHandler"),
    *("Store", "TCPStore", "TrainingArguments", "PartialState", "AcceleratorState", "FunctionWrapper"),
    *("DistStoreError", "DistNetworkError", "DistError", "LogRecord", "PrefixStore", "HashStore", "ObjectProxy"),
    *("StreamHandler", "DataLoader", "BaseInstrumentor", "Path"),
    *("acc", "fabric", "strategy", "model_engine", "mmengine", "state", "model", "tool"),  # objects `lint` reads
}
# Bare calls of upstream's and of users' code that the package's docstrings name.
EXTERNAL_CALLS = {"wait_for_everyone", "main_process_first", "is_rank_0", "destroy_process_group", "end_training"}
# Files named as examples or as upstream's (accelerate's own tests), not this repository's.
OTHER_FILES = {"bad.py", "good.py", "steps.py", "train.py", "t.py", "sitecustomize.py", "test_logging.py"}
OTHER_FILES |= {"test_sync.py", "test_script.py", "PULL_REQUEST.md", "logging.py", "state.py", "utils.py"}
OTHER_FILES |= {"tests/test_logging.py", "accelerate_inorder_fix/b/"}  # accelerate's test; a store key prefix
TOP_MODULES = ("_accelerate_inorder_fix_startup",)  # beside the package, at the top of site-packages


def _repo_tree():
    """Every file and folder of the repository, less git's, the caches and the venvs (not the project's files)."""
    for folder, subfolders, files in os.walk(REPO):
        here = Path(folder)
        subfolders[:] = [
            name
            for name in subfolders
            if name not in {".git", ".cache"}
            and not name.endswith("_cache")
            and not (here / name / "pyvenv.cfg").exists()
        ]
        yield from (here / name for name in [*subfolders, *files])


class Index:
    """The package's modules, their top-level names, each class's members, read with `ast`."""

    def __init__(self, root: Path = REPO / PACKAGE) -> None:
        self.names: dict[str, set[str]] = {}  # "store.teardown" -> its top-level names
        self.members: dict[str, set[str]] = {}  # class name -> its members (every class of that name)
        self.instances: dict[str, str] = {}  # "SESSION" -> "InOrderSession"
        self.defined: set[str] = set()  # every function and class name anywhere
        self.imported: dict[str, set[str]] = {}  # a module's names bound only by an import (not its own)
        self.packages: set[str] = {""}  # modules that are a package's __init__ (their imports are their API)
        for path in sorted(root.rglob("*.py")):
            dotted = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix("__init__").rstrip(".")
            if path.name == "__init__.py":
                self.packages.add(dotted)
            self._read(dotted, ast.parse(path.read_text()))
        for name in TOP_MODULES:
            self._read(name, ast.parse((REPO / f"{name}.py").read_text()))
        tree = list(_repo_tree())
        self.files = {p.name for p in tree}
        self.paths = {str(p.relative_to(REPO)) for p in tree}

    def _read(self, dotted: str, tree: ast.Module) -> None:
        names = self.names.setdefault(dotted, set())
        imported = self.imported.setdefault(dotted, set())
        for node in tree.body:
            for name in _bound(node):
                names.add(name)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update(_bound(node))
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                if isinstance(func, ast.Name) and isinstance(node.targets[0], ast.Name):
                    self.instances[node.targets[0].id] = func.id
        own = (
            name for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom)) for name in _bound(node)
        )
        imported.difference_update(own)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            if isinstance(node, ast.ClassDef):
                members = self.members.setdefault(node.name, set())
                members.update(name for item in node.body for name in _bound(item))
                members.update(
                    t.attr
                    for sub in ast.walk(node)
                    for t in (sub.targets if isinstance(sub, ast.Assign) else [getattr(sub, "target", None)])
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                )

    def modules_named(self, word: str) -> list[str]:
        return [m for m in self.names if m == word or m.endswith("." + word)]

    def problem(self, span: str, calls: bool = True) -> str | None:
        """Why `span` names nothing of the package, or None (it resolves, or is not the package's).

        Args:
            span: the text between the backticks.
            calls: check a bare call (`cleanup_store()`) too: in the package's docstrings, not in pages
                whose examples call users' functions.
        """
        if FILE.match(span) or span in OTHER_FILES:
            return self._file_problem(span)
        call = CALL.match(span)
        if call:
            name = call.group(1)
            known = name in self.defined or name in EXTERNAL_CALLS or hasattr(builtins, name)
            return None if known or not calls or not _ours_looking(name) else "no such function"
        if CAMEL.match(span):
            known = span in self.members or span in EXTERNAL or hasattr(builtins, span)
            return None if known or any(span in names for names in self.names.values()) else "no such class"
        dotted = DOTTED.match(span)
        return self._dotted_problem(dotted.group(1).split(".")) if dotted else None

    def _file_problem(self, span: str) -> str | None:
        path = span.rstrip("/")
        if span in OTHER_FILES:
            return None
        if "/" not in path:
            return None if path in self.files or path in OTHER_FILES else "no such file"
        if path.split("/")[0] not in {p.split("/")[0] for p in self.paths} | {*self._subpackages()}:
            return None  # a user's or another project's path (`src/`, `~/.cache/...`)
        found = any(p == path or p.endswith("/" + path) for p in self.paths)
        return None if found else "no such file"

    def _subpackages(self) -> set[str]:
        return {m.split(".")[0] for m in self.names if m}

    def _dotted_problem(self, parts: list[str]) -> str | None:
        if parts[0] == PACKAGE:
            return None if self._in_module("", parts[1:]) else f"no {'.'.join(parts[1:])} in the package"
        root = parts[0]
        for module in self.modules_named(root):
            if self._in_module(module, parts[1:]):
                return None
        if self.modules_named(root):
            return f"no {'.'.join(parts[1:])} in module {root}"
        if root in self.instances:
            return None if parts[1] in self.members.get(self.instances[root], set()) else f"{root} has no {parts[1]}"
        if root in self.members:
            return None if parts[1] in self.members[root] else f"class {root} has no {parts[1]}"
        if root in EXTERNAL or root in OTHER_FILES:
            return None
        return f"{root} is no module, class or object of the package (nor declared someone else's)"

    def _in_module(self, module: str, rest: list[str]) -> bool:
        while rest and f"{module}.{rest[0]}".lstrip(".") in self.names:  # a submodule
            module, rest = f"{module}.{rest[0]}".lstrip("."), rest[1:]
        if not rest:
            return True
        if rest[0] not in self.names[module]:
            return False
        if rest[0] in self.imported.get(module, ()) and module not in self.packages:
            return False  # `turns.emit_at_once` where turns only imports it: the page names the wrong module
        cls = self.instances.get(rest[0], rest[0])
        return len(rest) == 1 or cls not in self.members or rest[1] in self.members[cls]


def _bound(node: ast.AST) -> list[str]:
    """The names a top-level (or class-level) statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.If, ast.Try)):
        return [name for item in node.body for name in _bound(item)]
    return []


def _ours_looking(name: str) -> bool:
    """A bare call worth checking: a snake_case name of two words or more (`cleanup_store()`, not `print()`)."""
    return "_" in name.strip("_")


def spans(text: str) -> list[str]:
    return SPAN.findall(text)


def docstrings(path: Path) -> list[str]:
    """The module's, every class's and every function's docstring in the file at `path`."""
    tree = ast.parse(path.read_text())
    nodes = [
        n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    return [doc for doc in (ast.get_docstring(n, clean=False) for n in nodes) if doc]
