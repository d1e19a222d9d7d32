"""Settings: every environment variable the package reads is spelled here, and only here.

Users set:

- `ACCELERATE_INORDER_FIX`: `0`/`off`/`false`/`no` turns the automatic patch off (start-up hook and
  `import accelerate_inorder_fix`); `force` also patches a `log` body this package does not know; unset,
  `1`/`on`/`true`/`yes` mean on. An explicit `patch()` call always patches.
- `ACCELERATE_INORDER_FIX_STARTUP`: `0`/`off`/`false`/`no` leaves only the start-up hook unarmed;
  unset, `1`/`on`/`true`/`yes` mean on. Any other word of these two means on, with one warning.
- `ACCELERATE_INORDER_MODE`: `barrier` (default) or `gather`, in any case; the main process's fixes the
  job's mode when its process group starts.
- `ACCELERATE_INORDER_TIMEOUT`: seconds (a finite number > 0, default 30) the main process waits for a
  rank's record in gather mode, a rank's check-in in barrier mode, and a rank's wait for the main
  process's mode at its first in_order call: T, the unit of every bound in `bounds.py` (docs/promises.md
  shows them). `inf` is refused: every wait has a bound.
- `ACCELERATE_INORDER_COLLAPSE`: `1`/`on`/`true`/`yes` (any case) turns collapse on: in gather mode,
  identical records of one call from several ranks print once, tagged with every rank that sent them
  (`gather.collapse`); `0`/`off`/`false`/`no` or unset: off (the default). Barrier mode ignores it and
  says so once.

A bad value never passes silently: it is said once per host, on stderr, by the host's local main
process (`speaks_for_host`): which variable, which value, and what is used instead. Every process
uses the default all the same. `configure()` raises `ValueError` for the same values, and
`accelerate-inorder-fix status` exits 2 naming them (`setting_problems`).

Internal variables (the tools' job markers and scenario switches) share the prefix `AIF_`.

Read from the launcher: `WORLD_SIZE` and `LOCAL_WORLD_SIZE` (torchrun, `accelerate launch`), to know
whether a job spans several hosts (`spans_hosts`); `LOCAL_RANK`, to know which process speaks for its
host (`speaks_for_host`).
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable, Optional

# The start-up hook reads the switch without importing this package (wrapt, accelerate); its words
# live in that tiny top-level module and are shared from there.
from _accelerate_inorder_fix_startup import OFF_WORDS, STARTUP_ENV, SWITCH_ENV, switch

from ._diagnostics import warn_once


__all__ = [
    "COLLAPSE_ENV",
    "DEFAULT_MODE",
    "DEFAULT_TIMEOUT",
    "MODES",
    "MODE_ENV",
    "SETTINGS",
    "STARTUP_ENV",
    "SWITCH_ENV",
    "TIMEOUT_ENV",
    "Settings",
    "check_switches",
    "configure",
    "fallback",
    "setting_problems",
    "spans_hosts",
    "speaks_for_host",
    "parse_collapse",
    "parse_mode",
    "parse_timeout",
    "switch",
]

MODE_ENV = "ACCELERATE_INORDER_MODE"
TIMEOUT_ENV = "ACCELERATE_INORDER_TIMEOUT"
COLLAPSE_ENV = "ACCELERATE_INORDER_COLLAPSE"
# Internal: the tools mark every process of a job they start, and tell scenario ranks what to do.
JOB_MARKER_ENV = "AIF_JOB_ID"
CHECK_MARKER_ENV = "AIF_CHECK_ID"
SCENARIO_PATCH_ENV = "AIF_PATCH"
SCENARIO_CRASH_ENV = "AIF_CRASH"

# The words the start-up module reads as "on" (it reads anything but OFF_WORDS so, and "force" too
# for the switch); any other word is a typo, reported by `check_switches`.
ON_WORDS = ("", "1", "on", "true", "yes")
SWITCH_WORDS = {SWITCH_ENV: (*OFF_WORDS, *ON_WORDS, "force"), STARTUP_ENV: (*OFF_WORDS, *ON_WORDS)}

# Set by torchrun (and so by `accelerate launch`) in every rank.
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
LOCAL_RANK_ENV = "LOCAL_RANK"

MODES = ("barrier", "gather")
DEFAULT_MODE = "barrier"
DEFAULT_TIMEOUT = 30.0


def parse_mode(value: object) -> str:
    """The mode word `value` names ('barrier' or 'gather', any case, spaces ignored), or ValueError."""
    word = str(value).strip().lower()
    if word not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (any case), not {value!r}")
    return word


# The switch's words, without the empty one (an unset variable is the default, not "on").
COLLAPSE_WORDS = {**{word: True for word in ON_WORDS if word}, **dict.fromkeys(OFF_WORDS, False)}


def parse_collapse(value: object) -> bool:
    """`value` as collapse on or off: a bool, or one of `COLLAPSE_WORDS` (any case, spaces ignored); else ValueError."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if word not in COLLAPSE_WORDS:
        raise ValueError(f"collapse must be on or off (True/False, 1/0, on/off, true/false, yes/no), not {value!r}")
    return COLLAPSE_WORDS[word]


def parse_timeout(value: object) -> float:
    """`value` as a finite number of seconds > 0, or ValueError.

    Infinity is refused: every gather wait has a bound, so a job never hangs on a rank that is gone.
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds, not {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"timeout must be a finite number of seconds greater than 0, not {value!r}")
    return seconds


class Settings:
    """The mode, timeout and collapse in effect: `configure()` overrides, else the environment, else defaults.

    The environment is read at every use (a launcher may set it late, a script may change it between
    calls); a value is parsed once, while the variable keeps the same text (`_parsed`). A bad value is
    reported once per process and variable, and the default is used.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mode: Optional[str] = None
        self._timeout: Optional[float] = None
        self._collapse: Optional[bool] = None
        self._parsed: dict[str, tuple[str, Any]] = {}  # variable -> (its last valid text, that parsed)

    def _from_env(self, name: str, parse: Callable[[str], Any], default: Any) -> Any:
        raw = os.environ.get(name)
        if raw is None:
            return default
        parsed = self._parsed.get(name)
        if parsed is not None and parsed[0] == raw:
            return parsed[1]
        if not raw.strip():
            return default
        try:
            value = parse(raw)
        except ValueError as exc:
            _say_bad_setting(name, raw, str(exc))
            return default
        self._parsed[name] = (raw, value)
        return value

    def mode(self) -> str:
        """'barrier' or 'gather'."""
        return self._mode or self._from_env(MODE_ENV, parse_mode, DEFAULT_MODE)

    def timeout(self) -> float:
        """Seconds any in_order wait may last, in both modes (the mode agreement, the check-in, the collection)."""
        return self._timeout or self._from_env(TIMEOUT_ENV, parse_timeout, DEFAULT_TIMEOUT)

    def collapse(self) -> bool:
        """Whether gather mode prints a call's identical records once, tagged with their ranks."""
        collapse = self._collapse
        return self._from_env(COLLAPSE_ENV, parse_collapse, False) if collapse is None else collapse

    def _source(self, override: object, name: str, parse: Callable[[str], Any]) -> str:
        """Where a setting comes from: 'configure()', the variable's name, or 'default'."""
        if override is not None:
            return "configure()"
        raw = os.environ.get(name, "")
        if not raw.strip():
            return "default"
        try:
            parse(raw)
        except ValueError:
            return "default"
        return name

    def mode_source(self) -> str:
        return self._source(self._mode, MODE_ENV, parse_mode)

    def timeout_source(self) -> str:
        return self._source(self._timeout, TIMEOUT_ENV, parse_timeout)

    def collapse_source(self) -> str:
        return self._source(self._collapse, COLLAPSE_ENV, parse_collapse)

    def configure(
        self, mode: Optional[str] = None, timeout: Optional[float] = None, collapse: Optional[bool] = None
    ) -> None:
        """Validate every value first, then apply them together (a bad call changes nothing)."""
        new_mode = parse_mode(mode) if mode is not None else None
        new_timeout = parse_timeout(timeout) if timeout is not None else None
        new_collapse = parse_collapse(collapse) if collapse is not None else None
        with self._lock:
            if new_collapse is not None:
                self._collapse = new_collapse
            if new_mode is not None:
                self._mode = new_mode
            if new_timeout is not None:
                self._timeout = new_timeout

    def reset(self) -> None:
        """Forget `configure()` overrides (`testing.reset`)."""
        with self._lock:
            self._mode = self._timeout = self._collapse = None


SETTINGS = Settings()


def spans_hosts() -> bool:
    """True when the launcher says the job has more ranks than this host (`WORLD_SIZE` > `LOCAL_WORLD_SIZE`).

    torchrun sets both in every rank; a job started otherwise (no `LOCAL_WORLD_SIZE`) counts as one host.
    """
    try:
        return int(os.environ[WORLD_SIZE_ENV]) > int(os.environ[LOCAL_WORLD_SIZE_ENV])
    except (KeyError, ValueError):
        return False


def check_switches() -> None:
    """Report, once per process, a word in `ACCELERATE_INORDER_FIX(_STARTUP)` that means nothing.

    The start-up hook reads these with the least code possible and takes an unknown word as "on";
    the package, once imported, says so rather than let a typo (`of`, `disable`) pass silently.
    """
    for name, raw, problem in _switch_problems():
        _say_bad_setting(name, raw, problem)


def _switch_problems() -> list[tuple[str, str, str]]:
    problems = []
    for name, words in SWITCH_WORDS.items():
        raw = os.environ.get(name)
        if raw is not None and raw.strip().lower() not in words:
            problems.append((name, raw, f"not one of {'/'.join(w for w in words if w)}"))
    return problems


def setting_problems() -> list[tuple[str, str, str]]:
    """Every variable of the package set to a value that means nothing: `(name, value, what is wrong)`."""
    problems = []
    for name, parse in ((MODE_ENV, parse_mode), (TIMEOUT_ENV, parse_timeout), (COLLAPSE_ENV, parse_collapse)):
        raw = os.environ.get(name)
        if raw is not None and raw.strip():
            try:
                parse(raw)
            except ValueError as exc:
                problems.append((name, raw, str(exc)))
    return problems + _switch_problems()


def speaks_for_host() -> bool:
    """True in the process that reports this host's bad settings: its local main (`LOCAL_RANK` 0).

    torchrun, `accelerate launch` and `notebook_launcher` set `LOCAL_RANK` in every rank. A process
    without it (or with a value that is not a number) is taken as the only one on its host, and speaks.
    """
    raw = os.environ.get(LOCAL_RANK_ENV, "").strip()
    return not raw.isdigit() or int(raw) == 0


# What a bad value of each variable falls back to, as a user would set it.
_DEFAULTS = {
    MODE_ENV: DEFAULT_MODE,
    TIMEOUT_ENV: f"{DEFAULT_TIMEOUT:g}",
    COLLAPSE_ENV: "off",
    SWITCH_ENV: "on",
    STARTUP_ENV: "on",
}


def fallback(name: str, raw: str, problem: str) -> str:
    """How every bad value is said: `NAME='value' is not valid (why); using the default, <default>`."""
    return f"{name}={raw!r} is not valid ({problem}); using the default, {_DEFAULTS[name]}"


def _say_bad_setting(name: str, raw: str, problem: str) -> None:
    """A bad value, said once per process and variable, by the host's local main process only."""
    if speaks_for_host():
        warn_once(fallback(name, raw, problem), key=("setting", name, raw))


def configure(mode: Optional[str] = None, timeout: Optional[float] = None, collapse: Optional[bool] = None) -> None:
    """Override the in_order mode, the timeout and/or collapse for this process.

    Args:
        mode (`str`, *optional*): `"barrier"` or `"gather"` (any case), before the process group starts
            (before `Accelerator()`): the main process's setting then is the job's mode (a rank whose own
            setting differs says so once). Set after that, it is not taken: one warning.
        timeout (`float`, *optional*): T, the unit of every in_order bound (`bounds.py`): the main
            process's wait for a rank's record in gather mode, a rank's wait for the others at a
            barrier-mode check-in (a whole call waits at most `bounds.CALL` in all); a finite number
            greater than 0.
        collapse (`bool`, *optional*): in gather mode, print a call's identical records (same logger,
            level and message text) from several ranks once, at the first one's place, tagged with
            every rank that sent it (`[RANK 0-3,6] `); records that differ print per rank. Read by the
            main process where it prints; barrier mode ignores it (and says so once).

    `None` leaves a setting as it is. Raises `ValueError` on a bad value, and then changes nothing.
    """
    SETTINGS.configure(mode=mode, timeout=timeout, collapse=collapse)
