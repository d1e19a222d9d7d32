"""Promise: the guard recognises the three upstream `log` bodies by their code, whatever the release's
version string, and nothing else (pure logic; the installed releases are the inputs)."""

import pytest
from conftest import RELEASES, release_line, run_python

from accelerate_inorder_fix import _upstream as _fingerprint


LINES = {"0.20": "0.20.0-0.30.0", "0.31": "0.30.1-1.12.x", "1.13": "1.13.0-1.15.x"}


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_is_recognised(version):
    proc = run_python(
        "from accelerate_inorder_fix import _upstream as f\n"
        "from accelerate.logging import MultiProcessAdapter as M\n"
        "print(f.known_release_line(M.log))",
        version=version,
    )
    assert proc.stdout.strip() == LINES[release_line(version)], proc.stderr


def test_comments_whitespace_and_docstring_do_not_count():
    a = 'def log(self, x):\n    """Doc."""\n    return x  # why\n'
    b = "def log(self, x):\n\n    '''Another doc.'''\n    return (x)\n"
    c = "def log(self, x):\n    return x\n"
    assert _fingerprint.fingerprint_source(a) == _fingerprint.fingerprint_source(c)
    assert _fingerprint.fingerprint_source(b) != _fingerprint.fingerprint_source(c)  # tokens changed


def test_code_changes_count():
    assert _fingerprint.fingerprint_source("def log(self):\n    return 1\n") != _fingerprint.fingerprint_source(
        "def log(self):\n    return 2\n"
    )


def test_no_source_means_unknown():
    assert _fingerprint.known_release_line(len) is None
