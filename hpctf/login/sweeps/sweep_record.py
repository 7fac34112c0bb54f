"""``sweep.json``, a sweep's record, typed: :class:`SweepRecord` is its one reader
(:meth:`SweepRecord.from_json`) and its one writer (:meth:`SweepRecord.to_json`).

Dataclasses checked by hand, not pydantic: ``hpctf status`` reads every sweep of a runs root and
imports no pydantic (tests/test_cli.py: read from a cold page cache at every status).

Version 1 is the format every hpctf has written since the first sweep (the same keys: a grid's
``grid``, ``range``, ``random``, ``seed``, ``set``, ``max_running``; a search's ``set``,
``search``, ``trials``, ``tasks``; both ``name``, ``created``, ``experiment``, ``site``,
``scheduler``, ``points`` and ``arrays``); a file without ``version`` is version 1. A key this
hpctf does not know is kept as it was and written back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SWEEP_VERSION = 1

COMMON_KEYS = ("name", "created", "experiment", "site", "scheduler")
GRID_KEYS = ("grid", "range", "random", "seed", "set", "max_running")
SEARCH_KEYS = ("set", "search", "trials", "tasks")
_KNOWN = {"version", *COMMON_KEYS, *GRID_KEYS, *SEARCH_KEYS, "points", "arrays"}


class DamagedSweepRecord(ValueError):
    """What is wrong in a sweep.json, one line (the key path and why)."""


class NewerSweepRecord(ValueError):
    """A sweep.json of a version this hpctf does not read."""


def _check(value: Any, kinds: type | tuple[type, ...], where: str, what: str) -> Any:
    # bool is an int to isinstance: no count or index is one.
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise DamagedSweepRecord(f"{where}: {what} expected, got {value!r}")
    if not isinstance(value, kinds):
        raise DamagedSweepRecord(f"{where}: {what} expected, got {type(value).__name__}")
    return value


def _optional(
    data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], what: str, where: str = ""
) -> Any:
    value = data.get(key)
    return None if value is None else _check(value, kinds, f"{where}{key}", what)


def _texts(data: Mapping[str, Any], key: str) -> list[str] | None:
    items = _optional(data, key, list, "a list")
    if items is None:
        return None
    return [_check(item, str, f"{key}.{i}", "a string") for i, item in enumerate(items)]


@dataclass
class SweepPoint:
    """A grid's point: its index, its ``--set`` values (key -> value) and its run directory."""

    index: int
    values: dict[str, Any]
    run_dir: str

    @classmethod
    def from_json(cls, data: Any, where: str) -> SweepPoint:
        _check(data, dict, where, "a mapping")
        return cls(
            index=_check(data.get("index"), int, f"{where}.index", "an integer"),
            values=dict(_check(data.get("values"), dict, f"{where}.values", "a mapping")),
            run_dir=_check(data.get("run_dir"), str, f"{where}.run_dir", "a path"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "values": self.values, "run_dir": self.run_dir}


@dataclass
class SweepArray:
    """One job array submitted: its id, its script, and a grid's point indices (task N runs
    point ``indices[N]``) or a search's number of agents."""

    job_id: str
    script: str
    indices: list[int] | None = None
    tasks: int | None = None

    @classmethod
    def from_json(cls, data: Any, where: str) -> SweepArray:
        _check(data, dict, where, "a mapping")
        indices = _optional(data, "indices", list, "a list", f"{where}.")
        return cls(
            job_id=str(_check(data.get("job_id"), (str, int), f"{where}.job_id", "a job id")),
            script=_check(data.get("script"), str, f"{where}.script", "a path"),
            indices=None
            if indices is None
            else [_check(i, int, f"{where}.indices", "integers") for i in indices],
            tasks=_optional(data, "tasks", int, "an integer", f"{where}."),
        )

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"job_id": self.job_id}
        if self.indices is not None:
            document["indices"] = self.indices
        if self.tasks is not None:
            document["tasks"] = self.tasks
        document["script"] = self.script
        return document


@dataclass
class SweepRecord:
    """A sweep directory's record: a grid's (its points listed) or a search's (``search``
    set: its points are its trials' run directories)."""

    points: list[SweepPoint] = field(default_factory=list)
    arrays: list[SweepArray] = field(default_factory=list)
    name: str | None = None
    created: str | None = None  # ISO 8601, UTC
    experiment: str | None = None
    site: str | None = None
    scheduler: str | None = None
    grid: list[str] | None = None
    range: list[str] | None = None
    random: int | None = None
    seed: int | None = None
    overrides: list[str] | None = None  # the sweep's --set ("set" in the file)
    max_running: int | None = None
    search: dict[str, Any] | None = None  # the Search's model_dump: a search
    trials: int | None = None
    tasks: int | None = None
    version: int = SWEEP_VERSION
    unknown: dict[str, Any] = field(default_factory=dict)  # keys of another hpctf, kept

    @property
    def is_search(self) -> bool:
        return self.search is not None

    @classmethod
    def from_json(cls, data: Any) -> SweepRecord:
        """The record of a parsed sweep.json; DamagedSweepRecord naming the first key that is
        wrong, NewerSweepRecord for a version past :data:`SWEEP_VERSION`."""
        _check(data, dict, "sweep.json", "a mapping")
        version = _check(data.get("version", 1), int, "version", "an integer")
        if version < 1:
            raise DamagedSweepRecord(f"version: {version} is no version (1, 2, ...)")
        if version > SWEEP_VERSION:
            raise NewerSweepRecord(
                f"written by a newer hpctf (sweep record version {version}; this hpctf reads "
                f"up to {SWEEP_VERSION}): upgrade hpctf"
            )
        points = _check(data.get("points"), list, "points", "a list of points")
        arrays = _optional(data, "arrays", list, "a list of arrays") or []
        text = {key: _optional(data, key, str, "a string") for key in COMMON_KEYS}
        counts = {
            key: _optional(data, key, int, "an integer")
            for key in ("random", "seed", "max_running", "trials", "tasks")
        }
        return cls(
            points=[SweepPoint.from_json(p, f"points.{i}") for i, p in enumerate(points)],
            arrays=[SweepArray.from_json(a, f"arrays.{i}") for i, a in enumerate(arrays)],
            grid=_texts(data, "grid"),
            range=_texts(data, "range"),
            overrides=_texts(data, "set"),
            search=_optional(data, "search", dict, "a mapping"),
            version=version,
            unknown={k: v for k, v in data.items() if k not in _KNOWN},
            **text,
            **counts,
        )

    def to_json(self) -> dict[str, Any]:
        """The document sweep.json holds (before its secrets are redacted): the common keys,
        then a grid's or a search's, then points and arrays, then keys of another hpctf."""
        kind = {
            "grid": self.grid,
            "range": self.range,
            "random": self.random,
            "seed": self.seed,
            "set": self.overrides,
            "max_running": self.max_running,
            "search": self.search,
            "trials": self.trials,
            "tasks": self.tasks,
        }
        return {
            "version": self.version,
            **{key: getattr(self, key) for key in COMMON_KEYS},
            **{key: kind[key] for key in (SEARCH_KEYS if self.is_search else GRID_KEYS)},
            "points": [point.to_json() for point in self.points],
            "arrays": [array.to_json() for array in self.arrays],
            **self.unknown,
        }
