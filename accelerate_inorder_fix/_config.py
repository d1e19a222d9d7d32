"""Settings read from the environment, overridable from Python with `configure()`.

- `ACCELERATE_INORDER_FIX`: `0`/`off`/`false`/`no` turns the automatic patch off (start-up hook and
  `import accelerate_inorder_fix`); `force` also patches a `log` body this package does not know.
  An explicit `patch()` call always patches.
- `ACCELERATE_INORDER_MODE`: `barrier` (default, upstream's own synchronisation) or `gather`.
- `ACCELERATE_INORDER_TIMEOUT`: seconds the main process waits for a rank's record in gather mode.
"""

import os

# The start-up hook must read the switch without importing this package (wrapt); the words live in
# its tiny top-level module and are shared from there.
from _accelerate_inorder_fix_startup import SWITCH_ENV, switch  # noqa: F401  (re-exported)

MODE_ENV = "ACCELERATE_INORDER_MODE"
TIMEOUT_ENV = "ACCELERATE_INORDER_TIMEOUT"

MODES = ("barrier", "gather")
DEFAULT_MODE = "barrier"
DEFAULT_TIMEOUT = 30.0

_overrides = {}


def _env_mode():
    value = os.environ.get(MODE_ENV, "").strip().lower()
    return value if value in MODES else DEFAULT_MODE


def _env_timeout():
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def mode():
    """The in_order mode in effect: 'barrier' or 'gather'."""
    return _overrides.get("mode") or _env_mode()


def timeout():
    """Seconds a gather-mode wait may last."""
    return _overrides.get("timeout") or _env_timeout()


def configure(mode=None, timeout=None):
    """Override the mode and/or timeout for this process (`None` leaves a setting as it is).

    Call it with the same values on every rank: the mode decides how ranks synchronise.
    """
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        _overrides["mode"] = mode
    if timeout is not None:
        timeout = float(timeout)
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        _overrides["timeout"] = timeout
