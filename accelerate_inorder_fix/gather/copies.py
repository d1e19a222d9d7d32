"""Copies of the records in slots every rank shares: a whole call's records in one read.

A rank's n-th record lives in the rank's own key (`queues.key`); the rank also appends a *copy* of it,
one line, to slot `n % SLOTS`, which every rank writes to. For a call, the main process reads one slot
instead of 1,024 keys. The key stays the record: whatever is wrong with a copy (damaged, foreign,
missing, read too early) costs only the copy, and the main process reads that rank's key instead.

Decoding is the main process's largest cost at 1,024 ranks, and most of a record never changes from
one call to the next at a call site (logger, level, file, line, function, process, thread). So a
copy is either *full*, `[rank, n, payload]`, or a *delta*, `[rank, n, base, count, msg, created,
msecs, relativeCreated]`: what differs from the rank's full copy at place `base`, which it sends again
whenever anything else changes, and at least every `refresh` records. A delta whose base the main
process did not decode from a full copy is not used: the record comes from the rank's key.

The shapes, named: a slot's lines parse into `FullCopy` and `DeltaCopy` (what travels); the main
process keeps a `Base` per rank (its last full copy, decoded); a delta copy of the call being
collected becomes a `DeferredRecord`, made into a `LogRecord` only when its block goes out (`build`).
A `BlockEntry` is what a block holds for a rank: a record, a deferred one, or None (an empty marker).
"""

from __future__ import annotations

import json
import logging
import operator
from typing import Any, NamedTuple, Optional, Union, cast

from .._callsite import Identity, Site
from . import records


_DYNAMIC = [records.FIELDS.index(name) for name in ("msg", "created", "msecs", "relativeCreated")]
_dynamic = operator.itemgetter(*_DYNAMIC)
# Everything else in a record's values (the other fields, args, exc_info and the other attributes).
_static = operator.itemgetter(*(i for i in range(len(records.FIELDS) + 3) if i not in _DYNAMIC))


class FullCopy:
    """A full copy on the wire: the JSON list `[rank, place, document]`, the record's payload whole.

    Lines stay the lists JSON gives (a slot of 1,024 copies is parsed in one call, and an object per
    copy would cost the main process more than a tenth of its decoding): this class names their places.
    """

    RANK, PLACE, DOCUMENT = range(3)
    LENGTH = 3


class DeltaCopy:
    """A delta copy on the wire: `[rank, place, base, call_count, msg, created, msecs, relative_created]`.

    What differs from the rank's full copy at place `base`: the call's count at its site and the
    record's four dynamic attributes, sent as read (`CopyReader.decode` checks the types it relies on).
    """

    RANK, PLACE, BASE, CALL_COUNT, MSG, CREATED, MSECS, RELATIVE_CREATED = range(8)
    LENGTH = 8


CopyLine = list[Any]  # a FullCopy or a DeltaCopy line, told apart by its length (the class's `LENGTH`)
_LENGTHS = frozenset((FullCopy.LENGTH, DeltaCopy.LENGTH))
RANK = 0  # every copy, of either shape, starts with its rank and its place in the rank's queue
PLACE = 1
# The places the main process reads on its hot path, as module constants (a class attribute costs a lookup).
_DOCUMENT = FullCopy.DOCUMENT
_BASE = DeltaCopy.BASE
_CALL_COUNT = DeltaCopy.CALL_COUNT
_MSG = DeltaCopy.MSG
_CREATED = DeltaCopy.CREATED
_MSECS = DeltaCopy.MSECS
_RELATIVE_CREATED = DeltaCopy.RELATIVE_CREATED
_FULL = FullCopy.LENGTH


class Base(NamedTuple):
    """What the main process keeps of a rank's last full copy: the base of its deltas."""

    place: int
    site: Site
    attributes: dict[str, Any]  # the record's, before any handler touched it


# A delta copy of the call being collected, kept as `(its base's attributes, the DeltaCopy line)` and
# made into a record only when its block goes out (`build`). Records made as they are taken would all
# be alive together until their block goes out (1,024 LogRecords): Python's collector would then move
# them to its oldest generation, whose collections scan the whole heap. A plain tuple: a block entry is
# otherwise a LogRecord or None, so its type tells it apart, and it costs no constructor call per record.
DeferredRecord = tuple[dict[str, Any], CopyLine]
BlockEntry = Optional[Union[logging.LogRecord, DeferredRecord]]  # None: the rank's empty marker
Decoded = tuple[Identity, BlockEntry]


class Copier:
    """A rank's side: the line to append for its n-th record, full or delta."""

    def __init__(self, rank: int, refresh: int) -> None:
        self.rank = rank
        self.refresh = refresh
        self.base: Optional[tuple[int, tuple[Any, ...]]] = None  # (place, static part) of its last full copy

    def line(self, n: int, payload: bytes, document: Optional[list[Any]] = None) -> bytes:
        """The copy of `payload` (the record's own bytes; `document`, their data, allows a delta)."""
        if document is not None and document[3] is not None:
            static = (document[1], _static(document[3]))  # the call site, and what does not change
            if self.base is not None and n - self.base[0] < self.refresh and static == self.base[1]:
                delta = [self.rank, n, self.base[0], document[2], *_dynamic(document[3])]
                return records.dumps(delta) + b"\n"
            self.base = (n, static)
        # JSON text from `records` holds no raw newline: a line is a copy.
        return b"[%d,%d,%s]\n" % (self.rank, n, payload)


def read_lines(blob: bytes) -> list[Any]:
    """The lines of a slot, each parsed as JSON (a line that is not JSON is skipped); not yet checked."""
    try:  # one parse for the whole slot: the common case, and much cheaper than one per line
        return cast(list[Any], json.loads(b"[" + blob.rstrip(b"\n").replace(b"\n", b",") + b"]"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        lines = []
        for text in blob.split(b"\n"):
            try:
                lines.append(json.loads(text))
            except (UnicodeDecodeError, ValueError, RecursionError):
                continue
        return lines


def parse_slot(blob: bytes, world_size: int) -> list[CopyLine]:
    """The copies in a slot's bytes; a line that is no rank's copy (of either shape) is dropped."""
    return [
        line
        for line in read_lines(blob)
        if type(line) is list
        and len(line) in _LENGTHS
        and type(line[RANK]) is int
        and type(line[PLACE]) is int
        and 0 < line[RANK] < world_size
    ]


class CopyReader:
    """The main process's side: a record from its copy, or None when the copy cannot give it."""

    def __init__(self) -> None:
        self.bases: dict[int, Base] = {}  # rank -> its last full copy, decoded

    def decode(self, rank: int, line: CopyLine, current: Optional[Identity] = None) -> Optional[Decoded]:
        """`(identity, entry)` from `rank`'s copy, or None: the copy cannot give it (read its key instead).

        A delta copy of the call `current` gives a `DeferredRecord` (and `current` itself as its identity);
        any other copy, the record itself.
        """
        if len(line) == _FULL:
            try:
                identity, record = records.from_document(line[_DOCUMENT], rank)
            except records.MalformedRecord:
                return None
            if record is not None:  # before any handler has touched it
                self.bases[rank] = Base(line[PLACE], identity[0], record.__dict__.copy())
            return identity, record
        count = line[_CALL_COUNT]
        base = self.bases.get(rank)
        if base is None or base[0] != line[_BASE] or type(count) is not int or type(line[_MSG]) is not str:
            return None
        deferred = (base[2], line)  # (the base's attributes, the delta): a DeferredRecord
        site = base[1]
        if current is not None and count == current[1] and site == current[0]:
            return current, deferred
        return (site, count), build(deferred)


def build(entry: Union[logging.LogRecord, DeferredRecord]) -> logging.LogRecord:
    """The record of a block's entry: the entry itself, or the record a `DeferredRecord` stands for."""
    if type(entry) is not tuple:
        return cast(logging.LogRecord, entry)
    base_attributes, delta = entry
    attributes = base_attributes.copy()  # a copy of a dict of the same shape: cheaper than filling an empty one
    attributes["msg"] = delta[_MSG]
    attributes["created"] = delta[_CREATED]
    attributes["msecs"] = delta[_MSECS]
    attributes["relativeCreated"] = delta[_RELATIVE_CREATED]
    return records.rebuild(attributes)
