"""Promise: settings are parsed strictly; a bad environment value is said once and the default used; a bad
`configure()` call raises and changes nothing (pure logic, in-process)."""

import math
import uuid

import pytest

from accelerate_inorder_fix import config


@pytest.mark.parametrize("word,mode", [("barrier", "barrier"), (" Gather ", "gather"), ("BARRIER", "barrier")])
def test_mode_words_in_any_case(word, mode):
    assert config.parse_mode(word) == mode


@pytest.mark.parametrize("word", ["", "gathr", "barrier,gather", None, 1])
def test_other_mode_words_are_refused(word):
    with pytest.raises(ValueError, match="mode must be one of barrier, gather"):
        config.parse_mode(word)


@pytest.mark.parametrize("value,seconds", [("30", 30.0), (" 0.5 ", 0.5), (2, 2.0), ("1e-3", 0.001)])
def test_timeout_is_a_positive_finite_number(value, seconds):
    assert config.parse_timeout(value) == seconds


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "-inf", math.inf, 0, "abc", "", None, "1 s"])
def test_other_timeouts_are_refused(value):
    with pytest.raises(ValueError, match="timeout must be"):
        config.parse_timeout(value)


def _bad(word):
    """A bad value never seen before in this process: `warn_once` remembers the ones it has said."""
    return f"{word}-{uuid.uuid4().hex[:8]}"


def test_environment_gives_the_settings(monkeypatch):
    settings = config.Settings()
    monkeypatch.setenv(config.MODE_ENV, "GATHER")
    monkeypatch.setenv(config.TIMEOUT_ENV, "2.5")
    assert (settings.mode(), settings.timeout()) == ("gather", 2.5)
    assert (settings.mode_source(), settings.timeout_source()) == (config.MODE_ENV, config.TIMEOUT_ENV)
    monkeypatch.delenv(config.MODE_ENV)
    monkeypatch.setenv(config.TIMEOUT_ENV, "  ")
    assert (settings.mode(), settings.timeout()) == (config.DEFAULT_MODE, config.DEFAULT_TIMEOUT)
    assert (settings.mode_source(), settings.timeout_source()) == ("default", "default")


def test_an_environment_value_is_parsed_once_and_every_change_is_seen(monkeypatch, capsys):
    parsed = []

    def parse(raw):
        parsed.append(raw)
        return config.parse_mode(raw)

    settings = config.Settings()
    read = lambda: settings._from_env(config.MODE_ENV, parse, config.DEFAULT_MODE)  # noqa: E731
    for raw, mode in [("gather", "gather"), ("gather", "gather"), ("barrier", "barrier"), ("GATHER", "gather")]:
        monkeypatch.setenv(config.MODE_ENV, raw)
        assert [read(), read()] == [mode, mode]
    bad = _bad("gathr")
    monkeypatch.setenv(config.MODE_ENV, bad)  # a bad value after a good one: the default, said
    assert read() == config.DEFAULT_MODE
    assert "is not valid" in capsys.readouterr().err
    monkeypatch.setenv(config.MODE_ENV, "GATHER")  # back to a text parsed before: its value again
    assert read() == "gather"
    monkeypatch.delenv(config.MODE_ENV)
    assert read() == config.DEFAULT_MODE
    assert parsed == ["gather", "barrier", "GATHER", bad]  # once a text while it stays


@pytest.mark.parametrize(
    "name,read,default",
    [(config.MODE_ENV, "mode", config.DEFAULT_MODE), (config.TIMEOUT_ENV, "timeout", config.DEFAULT_TIMEOUT)],
)
def test_bad_environment_value_falls_back_with_one_warning(monkeypatch, capsys, name, read, default):
    settings = config.Settings()
    raw = _bad("-3")
    monkeypatch.setenv(name, raw)
    assert [getattr(settings, read)() for _ in range(3)] == [default] * 3
    assert getattr(settings, f"{read}_source")() == "default"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"accelerate-inorder-fix: {name}={raw!r} is not valid (")
    assert lines[0].endswith("; using the default, " + {"mode": "barrier", "timeout": "30"}[read])


@pytest.mark.parametrize(
    "name,raw,default",
    [
        (config.MODE_ENV, "gahter", "barrier"),
        (config.TIMEOUT_ENV, "inf", "30"),
        (config.COLLAPSE_ENV, "maybe", "off"),
        (config.SWITCH_ENV, "of", "on"),
        (config.STARTUP_ENV, "disable", "on"),
    ],
)
def test_every_bad_value_is_said_in_one_wording(monkeypatch, capsys, name, raw, default):
    """One fallback wording for every variable, naming the default a user would set."""
    monkeypatch.setenv(name, raw)
    settings = config.Settings()
    settings.mode(), settings.timeout(), settings.collapse()
    config.check_switches()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if name + "=" in line]
    assert line.startswith(f"accelerate-inorder-fix: {name}={raw!r} is not valid ("), line
    assert line.endswith(f"); using the default, {default}"), line


def test_configure_overrides_the_environment(monkeypatch):
    settings = config.Settings()
    monkeypatch.setenv(config.MODE_ENV, "barrier")
    settings.configure(mode="Gather", timeout="4")
    assert (settings.mode(), settings.timeout(), settings.mode_source()) == ("gather", 4.0, "configure()")
    settings.configure(timeout=1)  # None leaves the mode as it is
    assert (settings.mode(), settings.timeout()) == ("gather", 1.0)
    settings.reset()
    assert (settings.mode(), settings.timeout()) == ("barrier", config.DEFAULT_TIMEOUT)


@pytest.mark.parametrize("kwargs", [{"mode": "gather", "timeout": -1}, {"mode": "nope", "timeout": 5}])
def test_bad_configure_raises_and_changes_nothing(kwargs):
    settings = config.Settings()
    settings.configure(mode="barrier", timeout=7)
    with pytest.raises(ValueError):
        settings.configure(**kwargs)
    assert (settings.mode(), settings.timeout()) == ("barrier", 7.0)


def test_public_configure_is_the_process_settings():
    import accelerate_inorder_fix

    assert accelerate_inorder_fix.configure is config.configure
    try:
        accelerate_inorder_fix.configure(mode="gather", timeout=3)
        assert (config.SETTINGS.mode(), config.SETTINGS.timeout()) == ("gather", 3.0)
        with pytest.raises(ValueError):
            accelerate_inorder_fix.configure(mode="barrier", timeout=float("nan"))
        assert (config.SETTINGS.mode(), config.SETTINGS.timeout()) == ("gather", 3.0)
    finally:
        config.SETTINGS.reset()


@pytest.mark.parametrize(
    "value,word",
    [(None, "on"), ("", "on"), ("1", "on"), ("0", "off"), (" OFF ", "off"), ("false", "off"), ("no", "off")]
    + [("Force", "force"), ("yes", "on")],
)
def test_switch_words(monkeypatch, value, word):
    if value is None:
        monkeypatch.delenv(config.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(config.SWITCH_ENV, value)
    assert config.switch() == word


@pytest.mark.parametrize(
    "world,local,several",
    [("4", "2", True), ("4", "4", False), (None, "2", False), ("4", None, False), ("x", "2", False)],
)
def test_a_job_spans_hosts_when_the_launcher_says_it_has_more_ranks_than_this_host(monkeypatch, world, local, several):
    for name, value in ((config.WORLD_SIZE_ENV, world), (config.LOCAL_WORLD_SIZE_ENV, local)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert config.spans_hosts() is several


@pytest.mark.parametrize("local_rank,speaks", [(None, True), ("0", True), (" 0 ", True), ("1", False), ("x", True)])
def test_the_local_main_process_speaks_for_its_host(monkeypatch, local_rank, speaks):
    """A process without a (numeric) LOCAL_RANK is taken as the only one on its host: it speaks."""
    if local_rank is None:
        monkeypatch.delenv(config.LOCAL_RANK_ENV, raising=False)
    else:
        monkeypatch.setenv(config.LOCAL_RANK_ENV, local_rank)
    assert config.speaks_for_host() is speaks


def test_another_local_rank_uses_the_default_and_says_nothing(monkeypatch, capsys):
    monkeypatch.setenv(config.LOCAL_RANK_ENV, "3")
    monkeypatch.setenv(config.MODE_ENV, _bad("gathr"))
    monkeypatch.setenv(config.SWITCH_ENV, _bad("of"))
    assert config.Settings().mode() == config.DEFAULT_MODE
    config.check_switches()
    assert capsys.readouterr().err == ""


def test_setting_problems_names_every_bad_variable_and_nothing_else(monkeypatch):
    bad = {config.MODE_ENV: "bogus", config.TIMEOUT_ENV: "-1", config.COLLAPSE_ENV: "maybe", config.SWITCH_ENV: "of"}
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(config.STARTUP_ENV, "OFF")  # a good word
    assert [(name, raw) for name, raw, _ in config.setting_problems()] == [
        (config.MODE_ENV, "bogus"),
        (config.TIMEOUT_ENV, "-1"),
        (config.COLLAPSE_ENV, "maybe"),
        (config.SWITCH_ENV, "of"),
    ]


@pytest.mark.parametrize(
    "value,on",
    [("1", True), (" ON ", True), ("true", True), ("Yes", True), (True, True), (1, True)]
    + [("0", False), ("off", False), ("FALSE", False), ("no", False), (False, False), (0, False)],
)
def test_collapse_words(value, on):
    assert config.parse_collapse(value) is on


@pytest.mark.parametrize("value", ["", "2", "collapse", "of", None, 2, 1.0, [1]])
def test_other_collapse_values_are_refused(value):
    with pytest.raises(ValueError, match="collapse must be on or off"):
        config.parse_collapse(value)


def test_collapse_is_off_by_default_and_on_from_the_environment_or_configure(monkeypatch):
    settings = config.Settings()
    monkeypatch.delenv(config.COLLAPSE_ENV, raising=False)
    assert (settings.collapse(), settings.collapse_source()) == (False, "default")
    monkeypatch.setenv(config.COLLAPSE_ENV, "on")
    assert (settings.collapse(), settings.collapse_source()) == (True, config.COLLAPSE_ENV)
    monkeypatch.setenv(config.COLLAPSE_ENV, "0")  # off, said explicitly: from the variable, not the default
    assert (settings.collapse(), settings.collapse_source()) == (False, config.COLLAPSE_ENV)
    settings.configure(collapse=True)
    assert (settings.collapse(), settings.collapse_source()) == (True, "configure()")
    settings.configure(collapse=False)  # False overrides too: it is not "unset"
    monkeypatch.setenv(config.COLLAPSE_ENV, "1")
    assert (settings.collapse(), settings.collapse_source()) == (False, "configure()")
    settings.reset()
    assert settings.collapse() is True


def test_bad_collapse_in_the_environment_falls_back_to_off_with_one_warning(monkeypatch, capsys):
    settings = config.Settings()
    raw = _bad("maybe")
    monkeypatch.setenv(config.COLLAPSE_ENV, raw)
    assert [settings.collapse() for _ in range(3)] == [False] * 3
    assert settings.collapse_source() == "default"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"accelerate-inorder-fix: {config.COLLAPSE_ENV}={raw!r}"), lines


def test_bad_collapse_in_configure_raises_and_changes_nothing():
    settings = config.Settings()
    settings.configure(mode="gather", collapse=True)
    with pytest.raises(ValueError, match="collapse must be on or off"):
        settings.configure(mode="barrier", collapse="maybe")
    assert (settings.mode(), settings.collapse()) == ("gather", True)


def test_barrier_mode_says_once_that_collapse_applies_to_gather_mode_only(monkeypatch, capsys):
    from accelerate_inorder_fix import _diagnostics

    monkeypatch.setattr(_diagnostics, "DIAGNOSTICS", _diagnostics.Diagnostics())
    monkeypatch.delenv(config.LOCAL_RANK_ENV, raising=False)
    settings = config.Settings()
    monkeypatch.setattr(config, "SETTINGS", settings)
    monkeypatch.delenv(config.COLLAPSE_ENV, raising=False)
    config.note_collapse_in_barrier_mode()
    assert capsys.readouterr().err == ""  # off: nothing to say
    settings.configure(collapse=True)
    for _ in range(3):
        config.note_collapse_in_barrier_mode()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "applies to gather mode only" in lines[0], lines
