"""The gather-mode wire format: records travel as data, never as code (pure logic, no ranks).

What a user sees of a rank's record survives the trip; whatever else arrives from the store (a pickle,
truncated or foreign bytes) is refused with `MalformedRecord`, without executing or importing
anything; the collector turns it into one warning and that rank's empty record of the call.
"""

import builtins
import enum
import importlib
import json
import logging
import math
import pathlib
import pickle
import re
import sys
import threading

import pytest
from conftest import REPO

from accelerate_inorder_fix._call import ThisCall
from accelerate_inorder_fix._origin import Origin
from accelerate_inorder_fix.gather import queues, records


IDENTITY = (("train.py", "step", 42), 3)
LOGGER = "aif.test_records"


class Level(enum.IntEnum):
    LOUD = 35


def _record(msg="hello %s", args=("world",), level=logging.INFO, extra=None, exc_info=None, stack_info=False):
    """A record made by a real Logger.log call, kept before any handler, as `records.capture` does."""
    kept = []

    def keep(record):
        kept.append(record)
        return False

    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.DEBUG)
    logger.addFilter(keep)
    try:
        logger.log(level, msg, *args, extra=extra, exc_info=exc_info, stack_info=stack_info)
    finally:
        logger.removeFilter(keep)
    (record,) = kept
    return record


def to_bytes(identity, record):
    """A record on the wire as a rank sends it: stamped with its origin (rank 0 unless it says)."""
    if record is not None and not hasattr(record, "rank"):
        Origin(0, "node-a", False).stamp(record)
    return records.encode(identity, record)[0]


def from_bytes(payload, rank=0):
    return records.read(payload, rank)[:2]


def _trip(record, identity=IDENTITY):
    payload = to_bytes(identity, record)
    assert isinstance(payload, bytes)
    got_identity, got = from_bytes(payload)
    assert got_identity == identity
    return got


STANDARD = [
    "name",
    "levelno",
    "levelname",
    "pathname",
    "filename",
    "module",
    "lineno",
    "funcName",
    "created",
    "msecs",
    "relativeCreated",
    "thread",
    "threadName",
    "process",
    "processName",
    "stack_info",
] + (["taskName"] if sys.version_info >= (3, 12) else [])


def test_what_users_see_of_a_record_survives_the_round_trip():
    original = _record(stack_info=True)
    got = _trip(original)
    assert {k: getattr(got, k) for k in STANDARD} == {k: getattr(original, k) for k in STANDARD}
    assert got.getMessage() == "hello world" and got.args is None and got.exc_info is None
    assert (got.filename, got.funcName) == ("test_records.py", "_record")  # the caller, as logging saw it
    fmt = logging.Formatter("%(levelname)s %(name)s %(process)d %(thread)d %(funcName)s:%(lineno)d %(message)s")
    assert fmt.format(got) == fmt.format(original)


def test_identity_and_empty_marker_round_trip():
    assert from_bytes(to_bytes(IDENTITY, None)) == (IDENTITY, None)


def test_a_message_that_cannot_be_formatted_still_arrives():
    got = _trip(_record(msg="%d items", args=("many",)))
    assert got.getMessage().startswith("'%d items' % ('many',) (could not be formatted: TypeError")


def test_plain_extra_values_arrive_as_values():
    extra = {
        "text": "t",
        "number": -7,
        "big": 2**80,
        "ratio": 0.1,
        "flag": True,
        "nothing": None,
        "items": [1, "two", 3.0, None, [False]],
        "nested": {"a": {"b": [1, {"c": "d"}]}},
        "empty": {},
    }
    got = _trip(_record(extra=extra))
    for key, value in extra.items():
        assert getattr(got, key) == value and type(getattr(got, key)) is type(value), key


def test_non_finite_floats_arrive_as_floats():
    got = _trip(_record(extra={"nan": math.nan, "inf": math.inf, "ninf": -math.inf}))
    assert math.isnan(got.nan) and got.inf == math.inf and got.ninf == -math.inf


_DOCUMENTS = [
    [2, ["f.py", "fn", 3], 7, None],
    {"text": 'caf\u00e9 \u65e5\u672c \udcff \n\t"', "n": -(10**30), "x": 1.5e-300, "flags": [True, False, None]},
    [math.nan, math.inf, -math.inf, 0.1, -0.0, {"": []}, [[[]]]],
    "a bare string",
    12,
]


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


def test_a_value_whose_repr_fails_or_cannot_be_written_does_not_cost_the_record():
    got = _trip(_record(extra={"bad": _BadRepr(), "huge": 10**5000}))
    assert got.getMessage() == "hello world"
    assert got.bad == "<_BadRepr value could not be sent: repr() failed: RuntimeError>"
    assert isinstance(got.huge, str) and "could not be sent" in got.huge


def test_attributes_a_record_factory_adds_arrive_as_data_or_repr():
    """An attribute that could not be rebuilt in the main process arrives as its repr, the record with it."""

    class Handle:  # defined here: the main process could never import it
        def __repr__(self):
            return "<Handle 7>"

    default = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = default(*args, **kwargs)
        record.rank_info, record.handle, record.exc_text = {"rank": 3, "local": [0, 1]}, Handle(), ["odd"]
        return record

    logging.setLogRecordFactory(factory)
    try:
        original = _record()
    finally:
        logging.setLogRecordFactory(default)
    got = _trip(original)
    assert (got.getMessage(), got.rank_info, got.handle, got.exc_text) == (
        "hello world",
        {"rank": 3, "local": [0, 1]},
        "<Handle 7>",
        "['odd']",
    )


def test_an_intenum_level_arrives_as_an_int():
    got = _trip(_record(level=Level.LOUD))
    assert got.levelno == 35 and type(got.levelno) is int


def test_a_traceback_arrives_as_text_rendered_on_its_rank():
    try:
        raise KeyError("boom")
    except KeyError:
        original = _record(msg="failed", args=(), exc_info=sys.exc_info())
        want = logging.Formatter().formatException(sys.exc_info())
    got = _trip(original)
    assert got.exc_info is None and got.exc_text == want
    assert logging.Formatter().format(got) == f"failed\n{want}"


def test_stack_info_arrives_as_text():
    original = _record(stack_info=True)
    got = _trip(original)
    assert got.stack_info == original.stack_info and got.stack_info.startswith("Stack (most recent call last)")


def test_non_ascii_and_undecodable_names_survive():
    text = "héllo wörld 日本語 🎉 \u202e"
    original = _record(msg=text, args=(), extra={"who": "Zoë", "odd": "name\udcff.txt"})
    payload = to_bytes(IDENTITY, original)
    _, got = from_bytes(payload)
    assert (got.getMessage(), got.who, got.odd) == (text, "Zoë", "name\udcff.txt")


def test_a_surrogate_pair_sent_as_two_code_units_arrives_as_two_and_an_emoji_as_one():
    """The main process prints a rank's text code unit for code unit, as its own (JSON's `\\ud83d\\ude00`
    escapes would join the two into one character on the way)."""
    for text in ("a\ud83d\ude00b", "a\U0001f600b", "\ude00\ud83d"):
        _, got = from_bytes(to_bytes(IDENTITY, _record(msg=text, args=())))
        assert got.getMessage() == text and len(got.getMessage()) == len(text)


def test_a_one_mebibyte_message_survives():
    text = "é" + "x" * (1 << 20)
    assert _trip(_record(msg=text, args=())).getMessage() == text


class _CreatesFile:
    """Unpickling this runs `Path.touch`: the shape of any code-execution payload."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def test_a_pickle_payload_is_refused_and_not_run(tmp_path):
    target = tmp_path / "created-by-unpickling"
    payload = pickle.dumps((IDENTITY, {"msg": _CreatesFile(target)}), protocol=4)
    with pytest.raises(records.MalformedRecord, match="not JSON"):
        from_bytes(payload)
    assert not target.exists()
    pickle.loads(payload)  # the control: the payload is live, unpickling it would have run it
    assert target.exists()


def test_a_payload_naming_a_module_never_imports_it(tmp_path, monkeypatch):
    """A pickle that would import a module on load: refused, and the module is not imported."""
    (tmp_path / "aif_canary_module.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    payload = b"caif_canary_module\nsomething\n."
    before = set(sys.modules)
    with pytest.raises(records.MalformedRecord):
        from_bytes(payload)
    assert set(sys.modules) == before and not (tmp_path / "imported").exists()
    with pytest.raises(AttributeError):  # the control: unpickling imports the module (then misses the name)
        pickle.loads(payload)
    assert (tmp_path / "imported").exists()
    monkeypatch.delitem(sys.modules, "aif_canary_module")


def _valid():
    return to_bytes(IDENTITY, _record())


PLACES = {"v": 0, "call": 1, "count": 2, "record": 3}  # a payload is a JSON list


def _document(**changes):
    document = json.loads(_valid())
    for name, value in changes.items():
        document[PLACES[name]] = value
    return json.dumps(document).encode()


def _with_record(**changes):
    """A valid payload with record attributes changed."""
    document = json.loads(_valid())
    for name, value in changes.items():
        if name in records.FIELDS:
            document[3][records.FIELDS.index(name)] = value
        else:
            document[4][name] = value
    return json.dumps(document).encode()


FOREIGN = {
    "empty": b"",
    "garbage": b"\x00\xffnot a record\xfe",
    "latin-1": "{'é'}".encode("latin-1"),
    "utf-16 json": json.dumps([records.VERSION]).encode("utf-16"),
    "ascii pickle (protocol 0)": pickle.dumps((IDENTITY, {"msg": "hi"}), protocol=0),
    "pickle of a record's data": pickle.dumps((IDENTITY, {"msg": "hi", "name": "x", "levelno": 20}), protocol=4),
    "json null": b"null",
    "json list": b"[1, 2]",
    "json string": b'"record"',
    "no version": _document(v=None),
    "other version": _document(v=1),
    "version 1 (an object)": json.dumps({"v": 1, "call": [["f", "g", 1], 1], "record": None}).encode(),
    "bool version": _document(v=True),
    "call missing": _document(call=None),
    "call of wrong shape": _document(call=["f", "g"]),
    "call with a float line": _document(call=["f", "g", 1.5]),
    "count not an int": _document(count="3"),
    "record not a list": _document(record={"msg": "hi"}),
    "record of the wrong length": _document(record=[1]),
    "name not text": _with_record(name=1),
    "levelno not an int": _with_record(levelno="40"),
    "levelno a bool": _with_record(levelno=True),
    "msg missing": _with_record(msg=None),
    "exc_text not text": _with_record(exc_text=["x"]),
    "args sent": _with_record(args=["x"]),
    "exc_info sent": _with_record(exc_info=[1]),
    "deeply nested": b"[" * 200_000 + b"]" * 200_000,
    "huge int literal": b"[" + b"9" * 10_000 + b"]",
    "not bytes": "{}",
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_foreign_bytes_are_refused(name):
    with pytest.raises(records.MalformedRecord):
        from_bytes(FOREIGN[name])


def test_every_truncation_of_a_record_is_refused():
    payload = to_bytes(IDENTITY, _record(extra={"k": [1, {"a": "b"}]}, stack_info=True))
    for end in range(len(payload)):
        with pytest.raises(records.MalformedRecord):
            from_bytes(payload[:end])


def test_names_logging_reserves_are_never_set_from_a_payload():
    payload = _with_record(getMessage="not a method", __class__="x", __dict__={"msg": "swapped"})
    _, got = from_bytes(payload)
    assert type(got) is logging.LogRecord and got.getMessage() == "hello world"


def test_decoding_never_imports_or_evaluates(tmp_path):
    payloads = [_valid(), to_bytes(IDENTITY, None), *FOREIGN.values()]
    payloads.append(pickle.dumps((IDENTITY, {"msg": _CreatesFile(tmp_path / "x")})))
    reached = []

    def refuse(*args, **kwargs):
        reached.append(args[:1])
        raise AssertionError("decoding reached code execution or an import")

    hooks = [(builtins, "__import__"), (builtins, "eval"), (builtins, "exec"), (builtins, "compile")]
    hooks += [(importlib, "import_module"), (pickle, "loads"), (pickle, "load"), (pickle, "Unpickler")]
    saved = {(owner, name): getattr(owner, name) for owner, name in hooks}
    before = set(sys.modules)
    refused = 0
    try:
        for owner, name in hooks:
            setattr(owner, name, refuse)
        for payload in payloads:
            try:
                from_bytes(payload)
            except records.MalformedRecord:
                refused += 1
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
    assert reached == [] and set(sys.modules) == before and not (tmp_path / "x").exists()
    assert refused == len(payloads) - 2  # the hooks were in place while every payload was decoded


# -- the collector: foreign bytes count as that rank's empty record of the call -------------------


def _origin(rank):
    """The attributes a record read from `rank`'s queue carries (`_origin.Origin`)."""
    return {"rank": rank, "hostname": "node-a"}


def _queues(payloads_by_rank, world_size):
    """The real Inbox over torch's in-memory store, every payload already posted by the real Outbox."""
    import torch.distributed as dist

    store = dist.HashStore()
    for rank, payloads in payloads_by_rank.items():
        outbox = queues.Outbox(store, rank)
        for payload in payloads:
            outbox.post(payload)
    return queues.StoreInbox(store, world_size)


def _emitted(caplog_records):
    return [(r.getMessage(), r.levelname) for r in caplog_records if r.name == LOGGER]


# -- the whole package --------------------------------------------------------------------------

PACKAGE = REPO / "accelerate_inorder_fix"
CODE_FROM_DATA = re.compile(r"pickle|marshal|shelve|\beval\(|\bexec\(|literal_eval|__reduce__", re.IGNORECASE)


def test_no_pickle_marshal_or_eval_anywhere_in_the_package():
    """No exception: the old codec's benchmark lives in benchmarks/, outside the package."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CODE_FROM_DATA.search(line)
    ]
    assert found == []
    assert len(list(PACKAGE.rglob("*.py"))) > 10  # the walk saw the package


# -- where a record comes from: its rank and host, checked against the queue it was read from --


def test_a_record_read_from_a_queue_carries_that_rank_and_its_host():
    _, got = from_bytes(to_bytes(IDENTITY, _record(extra=_origin(1))), rank=1)
    assert (got.rank, got.hostname) == (1, "node-a")


@pytest.mark.parametrize(
    "origin",
    [{}, {"hostname": "node-a"}, {"rank": 1}, _origin(2), {"rank": True, "hostname": "node-a"},
     {"rank": "1", "hostname": "node-a"}, {"rank": 1, "hostname": 7}, {"rank": 1, "hostname": None}],
)  # fmt: skip
def test_a_record_claiming_another_rank_or_no_host_is_refused(origin):
    payload = to_bytes(IDENTITY, _record(extra=origin))
    with pytest.raises(records.MalformedRecord, match="'rank'|'hostname'"):
        from_bytes(payload, rank=1)


def test_a_call_filter_stamps_rank_and_hostname_on_this_threads_records_only_and_drops_none():
    logger = logging.getLogger("aif.test.stamping")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append((record.getMessage(), getattr(record, "rank", None)))
    logger.handlers[:], logger.propagate = [handler], False
    stamping = ThisCall(Origin(3, "node-c", several_hosts=True), keep=False)
    logger.addFilter(stamping)
    try:
        logger.warning("mine")
        other = threading.Thread(target=logger.warning, args=("another thread's",))
        other.start()
        other.join()
    finally:
        logger.removeFilter(stamping)
    assert seen == [("mine", 3), ("another thread's", None)]  # the message is left as it was


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no str for you")


# -- the line upstream prints, whatever the record factory ---------------------------------------


class _WithContext(logging.LogRecord):
    """A record factory's record whose `getMessage` adds a suffix (as request-id and tracing factories do)."""

    def getMessage(self):
        return super().getMessage() + " <ctx>"


@pytest.mark.parametrize("rank", [0, 1])
def test_a_factory_whose_getMessage_adds_a_suffix_prints_it_once(monkeypatch, rank):
    from types import SimpleNamespace

    from accelerate_inorder_fix._call import LogArgs

    monkeypatch.setattr(records, "upstream_tags", lambda: False)
    monkeypatch.setattr(logging, "_logRecordFactory", _WithContext)
    logger = logging.getLogger("aif.test.factory")
    logger.setLevel(logging.DEBUG)
    adapter = SimpleNamespace(isEnabledFor=lambda level: True, process=lambda msg, kw: (msg, kw), logger=logger)
    record = records.capture(LogArgs(adapter, logging.INFO, "hi %s", ("there",), {}), Origin(rank, "h", False))
    if rank:  # through the store to the main process, rebuilt there
        record = records.read(records.encode(IDENTITY, record)[0], rank)[1]
    assert record.getMessage() == f"[RANK {rank}] hi there <ctx>"  # the suffix once, as upstream prints it
