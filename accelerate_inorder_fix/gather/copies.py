"""Copies of the records in slots every rank shares: a whole call's records in one read.

A rank's n-th record lives in the rank's own key (`transport`); the rank also appends a *copy* of it,
one line, to slot `n % SLOTS`, which every rank writes to. For a call, the main process reads one slot
instead of 1,024 keys. The key stays the record: whatever is wrong with a copy (damaged, foreign,
missing, read too early) costs only the copy, and the main process reads that rank's key instead.

Decoding is the main process's largest cost at 1,024 ranks, and most of a record never changes from
one call to the next at a call site (logger, level, file, line, function, process, thread). So a
copy is either *full*, `[rank, n, payload]`, or a *delta*, `[rank, n, base, count, msg, created,
msecs, relativeCreated]`: what differs from the rank's full copy at place `base`, which it sends again
whenever anything else changes, and at least every `refresh` records. A delta whose base the main
process did not decode from a full copy is not used: the record comes from the rank's key.
"""

from __future__ import annotations

import json
import logging
import operator
from typing import Any, Optional

from . import records


_DYNAMIC = [records.FIELDS.index(name) for name in ("msg", "created", "msecs", "relativeCreated")]
_dynamic = operator.itemgetter(*_DYNAMIC)
# Everything else in a record's values (the other fields, args, exc_info and the other attributes).
_static = operator.itemgetter(*(i for i in range(len(records.FIELDS) + 3) if i not in _DYNAMIC))
_NEW_RECORD = logging.LogRecord.__new__


class Copier:
    """A rank's side: the line to append for its n-th record, full or delta."""

    def __init__(self, rank: int, refresh: int):
        self.rank, self.refresh = rank, refresh
        self.base: Optional[tuple[int, tuple]] = None  # (n, static part) of this rank's last full copy

    def line(self, n: int, payload: bytes, document: Optional[list] = None) -> bytes:
        """The copy of `payload` (the record's own bytes; `document`, their data, allows a delta)."""
        if document is not None and document[3] is not None:
            static = (document[1], _static(document[3]))  # the call site, and what does not change
            if self.base is not None and n - self.base[0] < self.refresh and static == self.base[1]:
                delta = [self.rank, n, self.base[0], document[2], *_dynamic(document[3])]
                return records.dumps(delta) + b"\n"
            self.base = (n, static)
        # JSON text from `records` holds no raw newline: a line is a copy.
        return b"[%d,%d,%s]\n" % (self.rank, n, payload)


def read_lines(blob: bytes) -> list:
    """The lines of a slot, each parsed as JSON (a line that is not JSON is skipped); not yet checked."""
    try:  # one parse for the whole slot: the common case, and much cheaper than one per line
        return json.loads(b"[" + blob.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except (UnicodeDecodeError, ValueError, RecursionError):
        lines = []
        for text in blob.split(b"\n"):
            try:
                lines.append(json.loads(text))
            except (UnicodeDecodeError, ValueError, RecursionError):
                continue
        return lines


def copies_in(blob: bytes, world_size: int) -> list:
    """The lines of a slot that are copies of a rank's record (`[rank, n, ...]`); anything else is dropped."""
    return [
        line
        for line in read_lines(blob)
        if type(line) is list
        and len(line) in (3, 8)
        and type(line[0]) is int
        and type(line[1]) is int
        and 0 < line[0] < world_size
    ]


class CopyReader:
    """The main process's side: a record from its copy, or None when the copy cannot give it."""

    def __init__(self) -> None:
        # rank -> (n, site, attributes) of its last full copy: the base of its deltas
        self.bases: dict[int, tuple[int, tuple, dict[str, Any]]] = {}

    def decode(self, rank: int, line: list, current: Optional[tuple] = None) -> Any:
        """`(identity, record)` from the copy `line` of `rank`'s record, or None (read its key instead).

        The identity of a record of the call `current` is `current` itself (the same object).

        The record of a delta copy of the call `current` is deferred: it is `line` itself, made ready
        for `build`, which makes the record when it is emitted. Records made as they are taken would
        all be alive together until their block goes out (1,024 LogRecords): Python's collector would
        then move them to its oldest generation, whose collections scan the whole heap.
        """
        if len(line) == 3:
            try:
                identity, record = records.from_document(line[2])
            except records.MalformedRecord:
                return None
            if record is not None:  # before any handler has touched it
                self.bases[rank] = (line[1], identity[0], record.__dict__.copy())
            return (current if identity == current else identity), record
        count, msg = line[3], line[4]
        base = self.bases.get(rank)
        if base is None or base[0] != line[2] or type(count) is not int or type(msg) is not str:
            return None
        line[2] = base  # the line carries its own base from now on
        if current is not None and count == current[1] and base[1] == current[0]:
            return current, line
        return (base[1], count), build(line)


def build(entry: Any) -> Any:
    """The record of a block's entry: the entry itself, or the record of a deferred delta copy."""
    if type(entry) is not list:
        return entry
    _, _, base, _, msg, created, msecs, relative = entry
    record = _NEW_RECORD(logging.LogRecord)
    attributes = base[2].copy()  # a copy of a dict of the same shape: cheaper than filling an empty one
    attributes["msg"], attributes["created"], attributes["msecs"], attributes["relativeCreated"] = (
        msg,
        created,
        msecs,
        relative,
    )
    record.__dict__ = attributes
    return record
