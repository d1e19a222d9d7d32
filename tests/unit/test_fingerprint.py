"""Promise: the guard's fingerprint counts the code of a `log` body and nothing else (pure logic, in-process).

Which releases carry which body, checked against each installed release, is tests/jobs/test_fingerprint_releases.py.
"""

from accelerate_inorder_fix import _upstream


def test_comments_whitespace_and_docstring_do_not_count():
    a = 'def log(self, x):\n    """Doc."""\n    return x  # why\n'
    b = "def log(self, x):\n\n    '''Another doc.'''\n    return (x)\n"
    c = "def log(self, x):\n    return x\n"
    assert _upstream.fingerprint_source(a) == _upstream.fingerprint_source(c)
    assert _upstream.fingerprint_source(b) != _upstream.fingerprint_source(c)  # tokens changed


def test_indentation_of_a_method_does_not_count():
    method = "    def log(self, x):\n        return x\n"
    assert _upstream.fingerprint_source(method) == _upstream.fingerprint_source("def log(self, x):\n    return x\n")


def test_code_changes_count():
    one, two = "def log(self):\n    return 1\n", "def log(self):\n    return 2\n"
    assert _upstream.fingerprint_source(one) != _upstream.fingerprint_source(two)


def test_a_string_that_is_not_the_docstring_counts():
    plain = "def log(self):\n    return 1\n"
    assert _upstream.fingerprint_source("def log(self):\n    x = 'a'\n    return 1\n") != _upstream.fingerprint_source(
        plain
    )


def test_no_source_means_unknown():
    assert _upstream.fingerprint(len) is None
    assert _upstream.known_release_line(len) is None


def test_an_unknown_body_is_not_a_release_line():
    def log(self, level, msg, *args, **kwargs):
        return None

    assert _upstream.fingerprint(log) not in _upstream.KNOWN_BODIES
    assert _upstream.known_release_line(log) is None
    assert _upstream.UpstreamBody(release_line=None).known is False
    assert _upstream.UpstreamBody(release_line="1.13.0-1.16.x").known is True
