"""Collapse (`ACCELERATE_INORDER_COLLAPSE=1`): one line for the ranks of a call that said the same thing.

A call's records are grouped by logger, level, host tag, text without its rank tag, traceback and stack,
compared exactly; a group prints once, at its first rank's place, tagged with all its ranks
(`_origin.span_tag`). A record not tagged with its own rank is never grouped. Rules: docs/gather-mode.md.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable
from typing import Optional

from .._origin import span_tag


Key = tuple[Hashable, ...]
TRACEBACKS = logging.Formatter()  # renders a traceback as `records` renders a rank's (the default format)
Group = tuple[logging.LogRecord, str, str, list[int]]  # (first record, host tag, untagged text, ranks)


def _text(record: logging.LogRecord) -> Optional[str]:
    """The record's message as printed (a rank's comes formatted, args None: no formatting here), or None."""
    msg = record.msg
    if type(msg) is str and not record.args:
        return msg
    try:
        return record.getMessage()
    except Exception:  # a %-format that fails: its own line, where the handler reports it as it always would
        return None


def _split(text: str, rank: int, hostname: object) -> Optional[tuple[str, str]]:
    """`(host tag, text without its tags)` of `rank`'s message, or None if it is not tagged so."""
    rank_tag = f"[RANK {rank}] "  # `RANK_TAG`, spelled out: this runs once per record
    if text.startswith(rank_tag):
        return "", text[len(rank_tag) :]
    host_tag = f"[{hostname}] "
    if text.startswith(host_tag) and text.startswith(rank_tag, len(host_tag)):
        return host_tag, text[len(host_tag) + len(rank_tag) :]
    return None


def _traceback(record: logging.LogRecord) -> Optional[str]:
    """The record's traceback as text: a rank's comes rendered (`exc_text`); the main process's own record
    may still hold `exc_info`, rendered here as a rank's is, for the comparison only (its handler renders it)."""
    if record.exc_text is None and record.exc_info:
        return TRACEBACKS.formatException(record.exc_info)
    return record.exc_text


def collapse(records: Iterable[tuple[int, logging.LogRecord]]) -> list[logging.LogRecord]:
    """The records to print for one call, in order: one per group of identical records.

    Args:
        records: `(rank, record)` in rank order. A group's first record becomes its line (its message
            retagged, its args dropped: the text is final), and every record returned carries the
            ranks it stands for as `ranks` (a list), for a formatter that keeps them.
    """
    groups: dict[Key, Group] = {}
    lines: list[Group] = []  # in the order they print: each at the place of its first rank
    for rank, record in records:
        text = _text(record)
        tags = None if text is None else _split(text, rank, getattr(record, "hostname", None))
        if tags is None:  # never grouped: printed as it came
            lines.append((record, "", "", [rank]))
            continue
        key = (record.name, record.levelno, *tags, _traceback(record), record.stack_info)
        group = groups.get(key)
        if group is None:
            group = groups[key] = (record, *tags, [rank])
            lines.append(group)
        else:
            group[3].append(rank)
    return [_line(*group) for group in lines]


def _line(record: logging.LogRecord, host_tag: str, untagged: str, ranks: list[int]) -> logging.LogRecord:
    """The first record of a group, standing for all of `ranks`: `[host] [RANK 0-7] text` (one rank: as it was)."""
    record.ranks = ranks
    if len(ranks) > 1:
        record.msg, record.args = f"{host_tag}{span_tag(ranks)}{untagged}", None
    return record
