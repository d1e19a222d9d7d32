"""Recognise the upstream `MultiProcessAdapter.log` bodies this package was tested against.

The fingerprint is taken from the installed source, not from `accelerate.__version__`: a fork or a
vendored copy may carry any version string, and only the code tells what the patch would replace.
Comments, blank lines, indentation and the docstring do not count; every other token does.
"""

import hashlib
import inspect
import io
import textwrap
import tokenize

# fingerprint -> the upstream releases that ship that exact body (checked against every tag).
KNOWN_BODIES = {
    "de4f5bcfc04522c7": "0.20.0-0.30.0",
    "301aa7733fb21c20": "0.30.1-1.12.x",
    "f2af81207b574031": "1.13.0-1.15.x",
}

_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def fingerprint_source(source):
    """Fingerprint the source text of one function definition."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline) if t.type not in _SKIPPED]
    # Drop the docstring: the first token after the signature's closing ':' when it is a string
    # that stands alone as a statement.
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.string in "([{":
            depth += 1
        elif tok.string in ")]}":
            depth -= 1
        elif tok.string == ":" and depth == 0:
            if i + 1 < len(tokens) and tokens[i + 1].type == tokenize.STRING:
                del tokens[i + 1]
            break
    text = " ".join(tok.string for tok in tokens)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def fingerprint(func):
    """Fingerprint a function object, or return None when its source cannot be read."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    try:
        return fingerprint_source(source)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def known_release_line(func):
    """The upstream release line whose `log` body `func` is, or None when it is not one we know."""
    return KNOWN_BODIES.get(fingerprint(func))
