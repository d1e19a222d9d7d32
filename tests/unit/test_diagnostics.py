"""The package's one voice for warnings: `CallWarning` names the site, the ranks, the cost, the next
step and the rule; gather mode's absence warning says only what is true of the block; the channel is
stderr, once or rate-limited, never through `logging` and never an exception."""

import io
import logging

import pytest

from accelerate_inorder_fix import _diagnostics
from accelerate_inorder_fix._diagnostics import (
    COLLECTIVE,
    DIAGNOSTICS,
    WAY_OUT,
    CallWarning,
    site_text,
    warn_every,
    warn_once,
)
from accelerate_inorder_fix.gather import collector


SITE = ("train.py", "step", 88)
IDENTITY = (SITE, 3)


@pytest.fixture(autouse=True)
def fresh_diagnostics():
    DIAGNOSTICS.reset()
    yield
    DIAGNOSTICS.reset()


def test_a_call_warning_names_site_ranks_cost_next_step_and_rule_in_that_order():
    line = CallWarning(
        site_text(SITE), (3, 1), "did not make it within 2 s", 2.0, "records are printed unordered", COLLECTIVE
    ).render()
    assert line == (
        "in_order call at train.py:88 in step: ranks 1, 3 did not make it within 2 s. Cost: a wait of 2 s. "
        "Next: records are printed unordered. Rule: an in_order call is collective: every rank must make it. "
        "Way out: find such calls before launch with `accelerate-inorder-fix lint <script>`; move each out of its "
        "rank-dependent branch, or drop in_order=True."
    )


def test_a_call_warning_without_a_broken_rule_has_no_rule_and_says_when_nothing_was_waited():
    line = CallWarning("train.py:88 in step", (2,), "had a handler raise", 0, "the block goes on").render()
    assert line.endswith("rank 2 had a handler raise. Cost: no wait. Next: the block goes on.")
    assert "Rule" not in line
    assert "Cost: not measured here" in CallWarning("x.py:1 in f", (), "lost the store", None, "go on").render()
    assert CallWarning("", (1,), "switched", 2, "refused").render().startswith("in_order call (its site not known")


def test_a_site_reads_the_same_from_its_tuple_and_from_its_name_in_the_store():
    assert site_text(SITE) == site_text("train.py:88:step") == "train.py:88 in step"
    assert site_text(("C:\\w\\t.py", "f", 3)) == site_text("C:\\w\\t.py:3:f") == "C:\\w\\t.py:3 in f"


def test_gather_absence_names_what_was_printed_and_never_claims_records_above_when_none_came():
    some = collector.absence_warning(IDENTITY, [3], {0: None, 1: object(), 2: object()}, 2.0).render()
    assert "ranks 1, 2 were printed without them" in some and "rank 3 sent no record within 2 s" in some
    none = collector.absence_warning(IDENTITY, [1, 2, 3], {0: None}, 2.0).render()
    assert "nothing was printed for this call" in none and "printed without them" not in none
    for line in (some, none):
        assert "above" not in line
        assert line.startswith("in_order call at train.py:88 in step (call 3 from there): ")
        assert "Cost: a wait of 2 s." in line and line.endswith(f"Rule: {COLLECTIVE}. Way out: {WAY_OUT}.")


def test_warnings_go_to_stderr_once_per_key_and_never_through_logging(capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a warning went through logging")

    monkeypatch.setattr(logging.Logger, "handle", boom)
    said = CallWarning("a.py:1 in f", (1,), "did not make it", 1.0, "go on", COLLECTIVE)
    assert warn_once(said, key="k") and not warn_once(said, key="k")
    assert warn_once("plain text") and not warn_once("plain text")
    assert warn_every(said) and warn_every(said)
    lines = capsys.readouterr().err.splitlines()
    assert (
        lines
        == [_diagnostics.PREFIX + said.render(), _diagnostics.PREFIX + "plain text"]
        + [_diagnostics.PREFIX + said.render()] * 2
    )


def test_a_broken_or_missing_stderr_loses_the_warning_not_the_call(monkeypatch):
    class Closed(io.StringIO):
        def write(self, text):
            raise ValueError("I/O operation on closed file")

    monkeypatch.setattr(_diagnostics.sys, "stderr", Closed())
    assert warn_every("lost") is False
    monkeypatch.setattr(_diagnostics.sys, "stderr", None)
    assert warn_once("lost too") is False
