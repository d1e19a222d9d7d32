"""Promise: a patched record is the record upstream would produce on its working path: message via
upstream's own `process()` ([RANK n] on 1.13+), %-args, extra handling, exception text, stack_info;
and the caller file/line/function are the user's call site for every logging method, with a
user-supplied stacklevel respected. Upstream reports accelerate's own file as the caller on
0.20-0.30.0 (every method) and for `warning_once` (every release); there the patch deliberately
differs, in the caller fields only."""

import json
import os

import pytest
from conftest import RELEASES, release_line, run_script


PROBE = os.path.join(os.path.dirname(__file__), "scripts", "record_probe.py")
CALLER_FIELDS = ("pathname", "lineno", "funcName", "stack_info")
WARNING_ONCE = 7  # index of the warning_once call in record_probe.calls


@pytest.mark.parametrize("version", RELEASES)
def test_patched_records_match_upstream(version):
    proc = run_script(PROBE, version=version, env={"ACCELERATE_INORDER_FIX": "0"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for in_order in (True, False):
        upstream, patched = result[f"upstream-{in_order}"], result[f"patched-{in_order}"]
        assert len(patched) == len(upstream) == 9
        for index, (up, fix) in enumerate(zip(upstream, patched)):
            assert fix["pathname"] == result["file"], fix
            assert fix["funcName"] == "calls", fix
            if release_line(version) == "0.20" or index == WARNING_ONCE:
                up = {k: v for k, v in up.items() if k not in CALLER_FIELDS}
                fix = {k: v for k, v in fix.items() if k not in CALLER_FIELDS}
            assert fix == up
    if release_line(version) == "1.13":
        assert result["patched-True"][1]["message"] == "[RANK 0] info TAG"
