"""What W&B wrote offline, read back for tests: the records of each ``run-ID.wandb`` file under
``RUN_DIR/tracking/wandb/offline-run-*/``, one :class:`Start` per file (per hpctf start).

wandb 0.30 has no Python reader of its own (its ``datastore`` went with the Go service), so
this reads the file format the service writes: a 7-byte header (``:W&B``, magic 0xBEE1,
version 0), then LevelDB's log format (32 KiB blocks of chunks: crc32c, length, type; a record
larger than a block's rest is split FIRST/MIDDLE/LAST), each record a ``wandb_internal_pb2``
``Record``. Checked against the files wandb 0.30.0 writes (tests/test_tracking.py)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_CHUNK_HEADER = 7  # crc32c (4), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """The ``Record`` messages of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and data[4:7] == b"\xe1\xbe\x00", data[:7]
    out, pos, pending = [], 7, b""
    while pos + _CHUNK_HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _CHUNK_HEADER:  # a block's tail too short for a chunk: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        body = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == 0:  # zero fill at the end of a block
            pos += -pos % _BLOCK
            continue
        pending = body if kind in (_FULL, _FIRST) else pending + body
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


@dataclass
class Start:
    """One offline start's records: what hpctf sent, as W&B kept it."""

    run_id: str = ""
    project: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per step
    config_updates: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    preempting: bool = False
    exit_code: int | None = None


def _items(items: Any) -> dict[str, Any]:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def read_start(path: Path) -> Start:
    start = Start()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            start.run_id, start.project = record.run.run_id, record.run.project
        elif kind == "history":
            start.history.append(_items(record.history.item))
        elif kind == "config":
            start.config_updates.append(_items(record.config.update))
        elif kind == "summary":
            start.summary.update(_items(record.summary.update))
        elif kind == "preempting":
            start.preempting = True
        elif kind == "exit":
            start.exit_code = record.exit.exit_code
    return start


def offline_starts(run_dir: Path) -> list[Start]:
    """Each start's records, in the order they started (W&B names its directories by time)."""
    files = sorted((run_dir / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    return [read_start(f) for f in files]
