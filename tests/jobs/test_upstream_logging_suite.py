"""Promise: accelerate's own `tests/test_logging.py` passes against the patched package, for every
supported release. Each release's sdist supplies its own test file; 0.21.0 has none, so it gets the
oldest one that exists (0.34.2's), which unpatched 0.21.0 fails (it reported its own file as caller).
"""

import os
import subprocess
import sys
import tarfile

import pytest
from conftest import CACHE, RELEASES, REPO, accelerate_dir


CONFTEST = """
import accelerate.logging, accelerate_inorder_fix
if {patched}:
    accelerate_inorder_fix.patch()
assert accelerate_inorder_fix.is_patched() is {patched}
"""


def _test_file(version, tmp_path):
    """Extract the release's test_logging.py, or the oldest available one, into tmp_path."""
    for candidate in [version, *RELEASES]:
        sdist = CACHE / "sdist" / f"accelerate-{candidate}.tar.gz"
        if not sdist.exists():
            pytest.fail(f"{sdist} missing: run scripts/setup.sh")
        with tarfile.open(sdist) as tar:
            member = f"accelerate-{candidate}/tests/test_logging.py"
            try:
                data = tar.extractfile(member).read()
            except KeyError:
                continue
        (tmp_path / "test_logging.py").write_bytes(data)
        return candidate
    pytest.fail("no release ships tests/test_logging.py")


def _run(version, tmp_path, patched):
    (tmp_path / "conftest.py").write_text(CONFTEST.format(patched=patched))
    env = dict(
        os.environ,
        ACCELERATE_INORDER_FIX="0",  # only the explicit patch() above applies
        PYTHONPATH=os.pathsep.join([accelerate_dir(version), str(REPO)]),
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("version", RELEASES)
def test_accelerate_test_logging_passes_patched(version, tmp_path):
    source = _test_file(version, tmp_path)
    proc = _run(version, tmp_path, patched=True)
    assert proc.returncode == 0, f"accelerate {version} with test_logging.py of {source}:\n{proc.stdout[-3000:]}"
    assert " passed" in proc.stdout


def test_borrowed_test_fails_on_unpatched_0_21(tmp_path):
    """The control: the borrowed test can fail, and does on upstream 0.21.0."""
    _test_file("0.21.0", tmp_path)
    proc = _run("0.21.0", tmp_path, patched=False)
    assert proc.returncode == 1 and "failed" in proc.stdout, proc.stdout[-2000:]
