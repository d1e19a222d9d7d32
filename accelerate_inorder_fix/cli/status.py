"""`accelerate-inorder-fix status`: what is installed, and whether a process here gets the fix.

`collect()` gathers the facts into a plain dict (that is the `--json` output); `render()` turns it into
lines for a person. A variable of the package set to a value that means nothing is listed under
`invalid_settings` (and named on a line of its own): `status` then exits 2, so a CI step can check. Nothing here raises because a dependency is missing: a machine without
accelerate or torch is exactly where a user runs `status` to find out why nothing works.
"""

import importlib
import importlib.util
import os
import sys
from typing import Any

from .. import __version__, _upstream, bounds, hook_status
from .. import config as _config
from .._patcher import is_patched
from ..config import SETTINGS


# The package's folder (this module is in its `cli` folder).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_or_none(name: str) -> Any:
    """The module, or None when it (not one of its own imports) is absent."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def accelerate_facts() -> dict[str, Any]:
    """accelerate's version and where it lives, and which upstream `log` body it carries."""
    try:
        accelerate = _import_or_none("accelerate")
        logging_module = _import_or_none("accelerate.logging") if accelerate else None
    except Exception as exc:  # a broken install is a fact to report, not a reason to crash
        return {"installed": False, "error": f"accelerate cannot be imported: {exc!r}"}
    if accelerate is None or logging_module is None:
        return {"installed": False}
    facts = {
        "installed": True,
        "version": getattr(accelerate, "__version__", "unknown"),
        "path": os.path.dirname(getattr(accelerate, "__file__", "") or ""),
    }
    adapter = getattr(logging_module, "MultiProcessAdapter", None)
    log = adapter.__dict__.get("log") if adapter is not None else None
    # This process imported the package, so `log` may already be the wrapper: judge what it wraps.
    original = getattr(log, "__wrapped__", log) if is_patched() else log
    line = _upstream.known_release_line(original) if original is not None else None
    facts["log_body"] = {
        "known": line is not None,
        "release_line": line,
        "fingerprint": _upstream.fingerprint(original) if original is not None else None,
    }
    return facts


def torch_facts() -> dict[str, Any]:
    try:
        torch = sys.modules.get("torch") or _import_or_none("torch")
    except Exception as exc:
        return {"installed": False, "error": f"torch cannot be imported: {exc!r}"}
    if torch is None:
        return {"installed": False}
    return {"installed": True, "version": getattr(torch, "__version__", "unknown")}


def startup_hook_facts() -> dict[str, Any]:
    """What the start-up hook says of itself, or `available: False` when this build has no hook.

    `active`: installed and not switched off, so new processes here get the patch at start-up.
    """
    try:
        report = dict(hook_status.status())
    except Exception as exc:
        return {"available": True, "error": f"the start-up hook could not be queried: {exc!r}"}
    installed = bool(report.get("hook_installed"))
    return {
        "available": True,
        "installed": installed,
        "path": report.get("hook_file"),
        "switched_off": report.get("startup_switch") == "off",
        "active": installed and report.get("startup_switch") != "off",
        "patched_by": report.get("patched_by"),
        "last_failure": report.get("hook_error"),
        "report": report,
    }


def setting_facts() -> dict[str, Any]:
    """Mode, timeout and collapse in effect, where each comes from, and env values that were ignored."""
    facts: dict[str, Any] = {}
    problems = {name: problem for name, _, problem in _config.setting_problems()}
    for key, env, value in (
        ("mode", _config.MODE_ENV, SETTINGS.mode()),
        ("timeout", _config.TIMEOUT_ENV, SETTINGS.timeout()),
        ("collapse", _config.COLLAPSE_ENV, SETTINGS.collapse()),
    ):
        raw = os.environ.get(env)
        entry = {"value": value, "source": "default"}
        if raw is not None and raw.strip():
            if str(value) == raw.strip().lower() or _same_value(key, raw, value):
                entry["source"] = env
            else:
                entry["ignored"] = _config.fallback(env, raw, problems.get(env, "not a value it takes"))
        facts[key] = entry
    facts["mode"]["means"] = MODE_MEANS[facts["mode"]["value"]]
    facts["collapse"]["means"] = COLLAPSE_MEANS[facts["collapse"]["value"]]
    return facts


COLLAPSE_MEANS = {
    True: "gather mode prints a call's identical records (logger, level, text) once, tagged with every rank "
    "that sent them ([RANK 0-3,6]); records that differ print per rank; barrier mode ignores it",
    False: "gather mode prints every rank's record of a call on its own line",
}


# What each mode does in a job, for `status` (README "Two modes" says the same at length); its bounds are
# bounds.py's, as docs/promises.md's table shows them.
MODE_MEANS = {
    "barrier": (
        "each in_order call checks in through the job's c10d store (torchrun, accelerate launch, any env:// "
        "job); when every rank has made it, the ranks hand their turns over through that store (no barrier), "
        f"and a call some ranks skip costs each rank at most {bounds.DIVERGENCE.value:g} timeouts in all and is "
        "named (bounds: docs/promises.md); without a c10d store (no default process group, XLA) plain "
        "barriers run, as upstream"
    ),
    "gather": (
        "each rank's record goes through the job's c10d store to the main process, which prints every "
        "call's records in rank order; a post waits only when its rank holds "
        f"{bounds.GATHER_QUEUE.value:g} records in the store, and a call only the main process makes costs it "
        f"{bounds.GATHER_MAIN_ONLY.value:g} timeout per site in all (bounds: docs/promises.md); without a c10d "
        "store, barrier mode"
    ),
}


def _same_value(key: str, raw: str, value: object) -> bool:
    """Whether the environment's `raw` is what gave `value` (a timeout's number, collapse's word)."""
    parse = {"timeout": _config.parse_timeout, "collapse": _config.parse_collapse}.get(key)
    try:
        return parse is not None and parse(raw) == value
    except ValueError:
        return False


def outlook(switch: str, accelerate: dict[str, Any], hook: dict[str, Any]) -> dict[str, Any]:
    """Would a Python process here run with the fix, and how? ({"patched": bool, "how": str})."""
    if not accelerate.get("installed"):
        return {"patched": False, "how": "accelerate is not installed: nothing to patch"}
    if switch == "off":
        return {
            "patched": False,
            "how": f"{_config.SWITCH_ENV}={os.environ.get(_config.SWITCH_ENV)!r} turns the automatic "
            "patch off (an explicit accelerate_inorder_fix.patch() still patches)",
        }
    known = accelerate["log_body"]["known"]
    if not known and switch != "force":
        return {
            "patched": False,
            "how": "this accelerate's log body is not one the package was tested against, so it is "
            f"left alone (set {_config.SWITCH_ENV}=force to patch anyway)",
        }
    via = (
        "at start-up, by the start-up hook"
        if hook.get("active")
        else "when your script runs `import accelerate_inorder_fix`"
    )
    if not known:
        via += f" (forced by {_config.SWITCH_ENV}=force)"
    return {"patched": True, "how": via}


def collect() -> dict[str, Any]:
    """Every fact `status` reports, as a JSON-ready dict."""
    accelerate = accelerate_facts()
    hook = startup_hook_facts()
    switch = _config.switch()
    this_process: dict[str, Any] = {"patched": is_patched()}
    if this_process["patched"] and hook.get("patched_by") == "start-up hook":
        this_process["how"] = "by the start-up hook"
    elif this_process["patched"]:
        this_process["how"] = "by `import accelerate_inorder_fix` (this command does that)"
    return {
        "package": {"version": __version__, "path": PACKAGE_DIR},
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "accelerate": accelerate,
        "torch": torch_facts(),
        "switch": {"value": switch, "env": _config.SWITCH_ENV, "raw": os.environ.get(_config.SWITCH_ENV)},
        "would_patch": outlook(switch, accelerate, hook),
        "this_process": this_process,
        **setting_facts(),
        "invalid_settings": [
            {"name": name, "value": raw, "problem": problem} for name, raw, problem in _config.setting_problems()
        ],
        "startup_hook": hook,
    }


def _installed_line(name: str, facts: dict[str, Any]) -> str:
    if facts.get("installed"):
        return f"{name}: {facts['version']}"
    return f"{name}: NOT INSTALLED" + (f" ({facts['error']})" if facts.get("error") else "")


def render(facts: dict[str, Any]) -> list[str]:
    """The report for a person, one fact a line."""
    acc = facts["accelerate"]
    lines = [
        f"accelerate-inorder-fix {facts['package']['version']} ({facts['package']['path']})",
        f"python: {facts['python']['version']} ({facts['python']['executable']})",
        _installed_line("accelerate", acc) + (f" ({acc['path']})" if acc.get("path") else ""),
        _installed_line("torch", facts["torch"]),
    ]
    if acc.get("installed"):
        body = acc["log_body"]
        if body["known"]:
            lines.append(
                f"log body: known, the one of accelerate {body['release_line']} (fingerprint {body['fingerprint']})"
            )
        else:
            lines.append(f"log body: UNKNOWN (fingerprint {body['fingerprint']}); not tested against it")
    outlook_ = facts["would_patch"]
    lines.append(f"a Python process here gets the fix: {'yes' if outlook_['patched'] else 'NO'}, {outlook_['how']}")
    here = facts["this_process"]
    lines.append("this process: " + (f"patched, {here['how']}" if here["patched"] else "not patched"))
    for key in ("mode", "timeout", "collapse"):
        entry = facts[key]
        value = f"{entry['value']:g} s" if key == "timeout" else entry["value"]
        value = ("on" if value else "off") if key == "collapse" else value
        source = "default" if entry["source"] == "default" else f"from {entry['source']}"
        lines.append(f"{key}: {value} ({source})" + (f"; note: {entry['ignored']}" if entry.get("ignored") else ""))
        if entry.get("means"):
            lines.append(f"  {entry['means']}")
    hook = facts["startup_hook"]
    if not hook["available"]:
        lines.append("start-up hook: not available in this build")
    elif hook.get("error"):
        lines.append(f"start-up hook: {hook['error']}")
    elif not hook["installed"]:
        lines.append(
            "start-up hook: not installed (a pip install puts it in site-packages; a source "
            "tree or PYTHONPATH does not)"
        )
    else:
        state = "installed but switched off" if hook["switched_off"] else "installed"
        lines.append(f"start-up hook: {state} ({hook['path']})")
        if hook.get("last_failure"):
            lines.append(f"start-up hook failed in this process: {hook['last_failure']}")
    for bad in facts["invalid_settings"]:
        lines.append(f"INVALID SETTING: {bad['name']}={bad['value']!r}: {bad['problem']}")
    return lines
