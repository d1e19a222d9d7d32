"""The code's numbers and store keys as the pages state them: the checker of test_docs.py's one-source tests.

A page states a constant as a backticked name with its number (`CALL` = 2.75 T, `PER_REQUEST` (252)); a
store key as a backticked path of the key layout (`h/S/k/<r>`, `q/<r>/<n>`); a request size in words ("252
keys a request"). Each is read here from the code: numbers by importing the package's modules, key layouts
from the f-strings and `"x/"` constants of the modules that talk to the store (read with `ast`).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from accelerate_inorder_fix import bounds


REPO = Path(__file__).resolve().parents[2]
PACKAGE = "accelerate_inorder_fix"
RUNTIME_SKIPPED = ("cli", "lint")  # their constants are the tools', not what the pages state of the runtime

STATED_CONSTANT = re.compile(
    r"`(?:(?P<module>[a-z_][\w.]*)\.)?(?P<name>[A-Z][A-Z0-9_]{2,})`\s*(?:(?:=|is|:|,)\s*|(?P<paren>\(\s*))"
    r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>KiB|MiB|ms|s\b|T\b)?(?(paren)\s*\))"
)
KEY_SPAN = re.compile(r"`((?:accelerate_inorder_fix/)?[a-z]{1,8}/[^`\s]*)`")
PLACEHOLDER = re.compile(r"^(?:<[^>]*>|[A-Za-z]|[A-Za-z][-+]\d)$")  # `<r>`, `S`, `k`, `k-1`
NOT_KEYS = {"debug/info/warning/error/critical/exception/log/warning_once"}  # a list of methods, not a key
# Numbers stated in words, each tied to the code's constant.
WORDED = [
    (re.compile(r"(\d+) keys (?:a|per|in one) (?:request|`multi_get`|`multi_set`)"), "gather.queues.PER_REQUEST", 1),
    (re.compile(r"(\d+) KiB (?:pieces|a piece|a key|each)"), "gather.queues.CHUNK", 1024),
]


def _runtime_modules() -> list[str]:
    root = REPO / PACKAGE
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] in RUNTIME_SKIPPED or parts[-1] == "__main__":
            continue
        names.append(".".join(p for p in parts if p != "__init__"))
    return [n for n in names if n]


def constants() -> dict[str, dict[str, float]]:
    """{NAME: {module: its number}} for every upper-case number or `bounds.Bound` of the runtime's modules."""
    found: dict[str, dict[str, float]] = {}
    for dotted in _runtime_modules():
        module = importlib.import_module(f"{PACKAGE}.{dotted}")
        for name, value in vars(module).items():
            if not re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", name) or getattr(value, "__module__", None) == "typing":
                continue
            if isinstance(value, bounds.Bound):
                value = value.value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                defined_here = name in _assigned(dotted)
                if defined_here:
                    found.setdefault(name, {})[dotted] = float(value)
    return found


def _assigned(dotted: str) -> set[str]:
    path = REPO / PACKAGE / (dotted.replace(".", "/") + ".py")
    if not path.exists():
        path = REPO / PACKAGE / dotted.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    return {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }


def constant_problems(text: str, known: dict[str, dict[str, float]]) -> list[str]:
    """Each `NAME` = number of `text` whose number is not the code's (or whose name the code does not have)."""
    wrong = []
    for match in STATED_CONSTANT.finditer(text):
        name, module, stated = match["name"], match["module"], float(match["number"])
        scale = {"KiB": 1024, "MiB": 1024 * 1024, "ms": 0.001}.get(match["unit"] or "", 1)
        values = known.get(name)
        if values is None:
            continue  # an environment variable, or a name of someone else's (`WORLD_SIZE` is ...)
        if module:
            values = {m: v for m, v in values.items() if m == module or m.endswith("." + module)} or values
        if all(abs(stated * scale - v) > 1e-9 for v in values.values()):
            wrong.append(
                f"`{name}` stated as {match['number']}{match['unit'] or ''}; the code has {sorted(values.values())}"
            )
    for pattern, dotted, scale in WORDED:
        module_name, _, attr = dotted.rpartition(".")
        value = getattr(importlib.import_module(f"{PACKAGE}.{module_name}"), attr)
        wrong += [
            f"{m.group(0)!r}: the code has {value // scale}"
            for m in pattern.finditer(text)
            if int(m[1]) * scale != value
        ]
    return wrong


def key_layouts() -> set[tuple[str, ...]]:
    """The store keys the runtime builds, as segment tuples with "*" for each formatted part."""
    layouts: set[tuple[str, ...]] = set()
    for dotted in _runtime_modules():
        path = REPO / PACKAGE / (dotted.replace(".", "/") + ".py")
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = None
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[a-z]{1,8}/", node.value)
            ):
                text = node.value + "\0"  # a prefix the rank's number or a name is added to
            if text and re.match(r"[a-z]{1,8}/", text) and " " not in text:
                layouts.add(tuple("*" if "\0" in part else part for part in text.split("/")))
    return layouts


def key_problems(text: str, layouts: set[tuple[str, ...]], paths: set[str]) -> list[str]:
    """Each backticked key of `text` that is no layout the code builds (a path of the repository is no key)."""
    wrong = []
    for span in KEY_SPAN.findall(text):
        folder = span.endswith("/") and span.count("/") == 1  # `examples/`, `main/`: a folder
        if folder or span in NOT_KEYS or "." in span.split("/")[-1] or _is_path(span, paths):
            continue
        key = span.removeprefix("accelerate_inorder_fix/").rstrip("/")
        if not key:
            continue
        parts = tuple("*" if PLACEHOLDER.match(p) else p for p in key.split("/"))
        if not any(_fits(parts, layout) for layout in layouts):
            wrong.append(f"`{span}`: no key of that layout in the code")
    return wrong


def _is_path(span: str, paths: set[str]) -> bool:
    first = span.split("/")[0]
    return first in {p.split("/")[0] for p in paths} or (REPO / PACKAGE / first).is_dir() or first in {"torch", "src"}


def _fits(parts: tuple[str, ...], layout: tuple[str, ...]) -> bool:
    """Whether a stated key fits a layout: same length (a stated prefix may stop short), literal parts equal."""
    if len(parts) > len(layout):
        return False
    return all(p == "*" or q == "*" or p == q for p, q in zip(parts, layout))
