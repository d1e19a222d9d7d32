"""The protocol's documentation matches the code: the wire format docs/gather-mode.md shows is the one
the main process decodes, and every test the protocol's invariants name exists."""

import re
from pathlib import Path

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
