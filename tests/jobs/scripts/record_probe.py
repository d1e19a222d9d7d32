"""Emit the same log calls through upstream's `log` and through the patched one, in one process, and
print both sets of records as JSON. Used by test_record_identity.py; one process, so upstream's
in_order path works and gives the reference record."""

import json
import logging
import sys

from accelerate import PartialState
from accelerate.logging import get_logger


PartialState(cpu=True)
records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)


base = logging.getLogger("probe")
base.addHandler(Keep())
base.setLevel(logging.DEBUG)
base.propagate = False
log = get_logger("probe")
fmt = logging.Formatter()


def helper(tag, in_order):
    # A user's own wrapper that points the record at its caller, as accelerate's test does.
    log.log(logging.INFO, "helper %s", tag, in_order=in_order, stacklevel=3)


def calls(tag, in_order):
    log.debug("debug %s %d", tag, 1, in_order=in_order)
    log.info("info %s", tag, in_order=in_order)
    log.warning("warning %s", tag, in_order=in_order, stack_info=True)
    log.error("error %s", tag, in_order=in_order, extra={"key": "value"})
    log.critical("critical %s", tag, in_order=in_order)
    try:
        raise KeyError(f"boom {tag}")
    except KeyError:
        log.exception("exception %s", tag, in_order=in_order)
    log.log(logging.WARNING, "log %s", tag, in_order=in_order)
    getattr(log, "warning_once", log.warning)(f"once {tag}", in_order=in_order)  # 0.21 has no warning_once
    helper(tag, in_order)


def snapshot(tag):
    out = []
    for r in records:
        out.append(
            {
                "name": r.name,
                "levelno": r.levelno,
                "message": r.getMessage().replace(tag, "TAG"),
                "pathname": r.pathname,
                "lineno": r.lineno,
                "funcName": r.funcName,
                "exc_text": fmt.formatException(r.exc_info).replace(tag, "TAG") if r.exc_info else None,
                "stack_info": r.stack_info,
                "key": getattr(r, "key", None),
            }
        )
    records.clear()
    return out


result = {"file": __file__}
for phase in ("upstream", "patched"):
    if phase == "patched":
        import accelerate_inorder_fix

        accelerate_inorder_fix.patch()  # the test turns the automatic patch (start-up hook) off
        assert accelerate_inorder_fix.is_patched()
    for in_order in (True, False):
        calls(f"{phase}{in_order}", in_order)  # one call line for both phases: same stack_info
        result[f"{phase}-{in_order}"] = snapshot(f"{phase}{in_order}")
json.dump(result, sys.stdout)
