"""A run's logged history, read from metrics.jsonl as every reader sees it: each step once.

metrics.jsonl is append-only, written by the chief. A start that stops without saving its
last steps (a hard second Ctrl-C, a SIGKILL, a crash) leaves records past its last checkpoint;
the next start resumes from that checkpoint and logs those steps again. So the chief appends
a marker at each start, once it has restored (``{"resumed_from": STEP, "time": ...}``), and
:func:`effective_history` lets every record of an earlier start with a step past ``STEP``
be superseded by the new start's. Every reader (``Run.metrics()``, ``hpctf status``,
``hpctf plot``, a sweep's ranking) goes through :func:`metric_records`.

Pure but for :func:`metric_records`, which reads the file; no TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hpctf.core.safe_files import NotARegularFile, open_regular

RESUMED_FROM = "resumed_from"
# Keras's own name for an evaluation's metric: ``model.fit``'s epochs are recorded with their
# logs' names (eval: {"val_loss": ...}), hpctf's loop with the metrics' (eval: {"loss": ...}).
KERAS_EVAL_PREFIX = "val_"


def eval_metric(group: Any, name: str) -> Any:
    """The evaluation's ``name`` in a record's ``eval`` group (``loss``: its ``loss``, or
    ``val_loss`` as ``model.fit`` logs it); None when the group holds neither."""
    if not isinstance(group, dict):
        return None
    value = group.get(name)
    return group.get(KERAS_EVAL_PREFIX + name) if value is None else value


def resumed_marker(step: int, now: float) -> dict[str, Any]:
    """The record a start appends once it has restored ``step`` (0: a start from scratch)."""
    return {RESUMED_FROM: int(step), "time": now}


def effective_history(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The logged records, each step's from the start that logged it last: at each
    ``resumed_from`` marker, the records before it with a step past the marker's are dropped
    (their start ended before saving them). Markers are left out; order is kept."""
    kept: list[dict[str, Any]] = []
    for record in records:
        resumed = record.get(RESUMED_FROM)
        if isinstance(resumed, int) and not isinstance(resumed, bool):
            kept = [r for r in kept if r["step"] <= resumed]
        elif isinstance(record.get("step"), int):
            kept.append(record)
    return kept


def by_step(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step: the records of one step (training values, ``eval``, ...) merged into
    one dict, in step order; a later record's value wins for a key both hold."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        row = rows.setdefault(record["step"], {})
        for key, value in record.items():
            if isinstance(value, dict) and isinstance(row.get(key), dict):
                row[key] = {**row[key], **value}
            else:
                row[key] = value
    return [rows[step] for step in sorted(rows)]


# The most of metrics.jsonl a reader takes, from its end: about 100,000 logged steps; a bigger
# file (a damaged or planted one, a run logging every step for months) is read by its tail,
# so a listing's memory stays bounded whatever sits in a run directory.
MAX_READ_BYTES = 16 << 20


def metric_records(path: Path, tail_bytes: int | None = None) -> list[dict[str, Any]]:
    """The effective records of metrics.jsonl (:func:`effective_history`); only those in its
    last ``tail_bytes`` when given, and never more than its last :data:`MAX_READ_BYTES` (a
    marker before the tail superseded nothing in it). Not a regular file: none."""
    tail_bytes = min(tail_bytes if tail_bytes is not None else MAX_READ_BYTES, MAX_READ_BYTES)
    try:
        with open_regular(path, "metrics.jsonl") as handle:  # a FIFO, /dev/zero: none
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - tail_bytes))
            if size > tail_bytes:
                handle.readline()  # a partial first line
            # Line by line, the records kept lean: a whole tail decoded and split at once, and
            # a dict of its own for each of 100,000 records' eval groups, held 2-3 times the
            # memory of the records alone (a 200 MB file: 134 MB of Python objects).
            return effective_history(_records(handle, size))
    except (OSError, NotARegularFile):
        return []


def _records(handle: Any, size: int) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``handle``'s lines up to ``size`` bytes (what was there when it was
    opened); a line still being written, or not an object, is left out."""
    left = size - handle.tell()
    for line in handle:
        left -= len(line)
        if left < 0:
            break
        try:
            record = _DECODER.decode(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            yield record


def _interned(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {sys.intern(key): value for key, value in pairs}


# Every record repeats the same few keys: one string each, not one per record.
_DECODER = json.JSONDecoder(object_pairs_hook=_interned)
