"""Promise: the guard recognises the three upstream `log` bodies by their code, whatever the release's
version string (each installed release in a process of its own; the pure parts are tests/unit/test_fingerprint.py)."""

import pytest
from conftest import RELEASES, release_line, run_python


LINES = {"0.20": "0.20.0-0.30.0", "0.31": "0.30.1-1.12.x", "1.13": "1.13.0-1.16.x"}


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_is_recognised(version):
    proc = run_python(
        "from accelerate_inorder_fix import _upstream as f\n"
        "from accelerate.logging import MultiProcessAdapter as M\n"
        "print(f.known_release_line(M.log))",
        version=version,
    )
    assert proc.stdout.strip() == LINES[release_line(version)], proc.stderr
