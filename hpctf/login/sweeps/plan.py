"""A sweep's points and arrays, planned without touching a file or Slurm (pure).

``--grid KEY=V1,V2,...`` and ``--range KEY=LO:HI[:log]`` (with ``--random N --seed S``) become
a list of :class:`Point`: each one a mapping of experiment keys to ``--set`` values, so every
point goes through the same resolve and validation as ``hpctf submit``. The points are the
product of the grids, times the random draws when there are ranges. :func:`chunks` splits the
point indices into job arrays that fit the cluster's MaxArraySize.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpctf.core.errors import UserError

DEFAULT_MAX_POINTS = 1000
# Slurm's default MaxArraySize (slurm.conf(5)); used only where Slurm cannot be asked (a dry
# run without scontrol).
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001
# How much of each value goes into a run directory's name.
_NAME_VALUE_CHARS = 24
_NAME_CHARS = 120
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Grid:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Range:
    key: str
    low: float
    high: float
    log: bool
    integer: bool  # both ends written as integers: draw integers


@dataclass(frozen=True)
class Point:
    """One experiment of a sweep: its index and the ``--set`` values (key -> text) it adds."""

    index: int
    values: Mapping[str, str]

    def sets(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.values.items()]

    def label(self) -> str:
        return " ".join(f"{short_key(k)}={v}" for k, v in self.values.items())


def short_key(key: str) -> str:
    """The last part of a key path: ``train.args.lr`` -> ``lr``."""
    return key.rsplit(".", 1)[-1]


def _split_values(text: str) -> list[str]:
    """Comma-separated values; commas inside [...] or {...} (a YAML list) do not split."""
    values, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_grid(text: str) -> Grid:
    """``KEY=V1,V2,...``, or a UserError naming what is wrong and what is allowed."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.fullmatch(key):
        raise UserError(
            f"--grid {text!r}: expected KEY.PATH=V1,V2,..., e.g. train.args.lr=0.1,0.01"
        )
    values = _split_values(rest)
    if not rest.strip() or any(v == "" for v in values):
        raise UserError(
            f"--grid {text!r}: an empty value; give one or more comma-separated values, "
            f"e.g. {key}=1,2"
        )
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise UserError(f"--grid {key}: value {seen[0]!r} given twice; each value once")
    return Grid(key, tuple(values))


def parse_range(text: str) -> Range:
    """``KEY=LO:HI`` (uniform) or ``KEY=LO:HI:log`` (log-uniform); integer ends draw
    integers."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    parts = rest.split(":")
    usage = f"--range {text!r}: expected KEY.PATH=LO:HI[:log], e.g. train.args.lr=1e-4:1e-1:log"
    if not sep or not _KEY.fullmatch(key) or len(parts) not in (2, 3):
        raise UserError(usage)
    if len(parts) == 3 and parts[2] != "log":
        raise UserError(f"{usage} ({parts[2]!r} is not 'log')")
    if not all(_NUMBER.fullmatch(p.strip()) for p in parts[:2]):
        raise UserError(f"{usage} (LO and HI must be numbers)")
    low, high = float(parts[0]), float(parts[1])
    log = len(parts) == 3
    if not low < high:
        raise UserError(f"--range {key}: LO ({parts[0]}) must be below HI ({parts[1]})")
    if log and low <= 0:
        raise UserError(f"--range {key}: a log range needs LO > 0 (got {parts[0]})")
    integer = all(re.fullmatch(r"[+-]?\d+", p.strip()) for p in parts[:2])
    return Range(key, low, high, log, integer)


def _draw(rng: random.Random, spec: Range) -> str:
    if spec.log:
        value = math.exp(rng.uniform(math.log(spec.low), math.log(spec.high)))
    else:
        value = rng.uniform(spec.low, spec.high)
    if spec.integer:
        return str(min(max(round(value), int(spec.low)), int(spec.high)))
    return f"{value:.4g}"


def plan_points(
    grids: Sequence[Grid],
    ranges: Sequence[Range] = (),
    draws: int | None = None,
    seed: int = 0,
    max_points: int = DEFAULT_MAX_POINTS,
    fixed_keys: Sequence[str] = (),
) -> list[Point]:
    """Every point: the product of ``grids`` (in the order given, the last key fastest),
    times ``draws`` seeded random draws from ``ranges``. A UserError before anything is built
    when a key comes twice (``fixed_keys``: those ``--set`` gives), when ranges and draws do
    not come together, or when there would be more than ``max_points``."""
    keys = [g.key for g in grids] + [r.key for r in ranges]
    for index, key in enumerate(keys):
        if key in keys[:index]:
            raise UserError(f"{key}: swept twice (--grid/--range); give each key once")
        if key in fixed_keys:
            raise UserError(f"{key}: swept and also given by --set; give it in one place")
    if ranges and not draws:
        raise UserError("--range needs --random N: how many points to draw from the ranges")
    if draws and not ranges:
        raise UserError("--random N needs at least one --range KEY=LO:HI[:log] to draw from")
    if not grids and not ranges:
        raise UserError("nothing to sweep: give --grid KEY=V1,V2,... or --random N --range ...")
    count = math.prod(len(g.values) for g in grids) * (draws or 1)
    if count > max_points:
        raise UserError(
            f"{count} points is more than --max-points {max_points}; sweep fewer values, or "
            "raise --max-points"
        )
    rng = random.Random(seed)
    drawn = [{r.key: _draw(rng, r) for r in ranges} for _ in range(draws or 1)]
    points: list[Point] = []
    for combo in itertools.product(*(g.values for g in grids)):
        for extra in drawn:
            values = {**dict(zip([g.key for g in grids], combo, strict=True)), **extra}
            points.append(Point(len(points), values))
    return points


def run_names(name: str, points: Sequence[Point]) -> list[str]:
    """A directory name per point: ``<name>-lr0.01-width64``, safe on any filesystem (letters,
    digits, ``.``, ``_``, ``-``), and unique: a name taken by an earlier point gets
    ``-<index>``."""
    names: list[str] = []
    taken: set[str] = set()
    for point in points:
        parts = [name]
        for key, value in point.values.items():
            safe = _UNSAFE.sub("_", value).strip("._-")[:_NAME_VALUE_CHARS] or "_"
            parts.append(_UNSAFE.sub("_", short_key(key)) + safe)
        candidate = "-".join(parts)[:_NAME_CHARS].rstrip("._-")
        if candidate.lower() in taken:  # case-insensitive filesystems too
            candidate = f"{candidate}-{point.index}"
        taken.add(candidate.lower())
        names.append(candidate)
    return names


@dataclass(frozen=True)
class Chunk:
    """One job array: the points ``indices`` as array tasks 0..len-1."""

    indices: tuple[int, ...]

    def spec(self, max_running: int | None) -> str:
        """sbatch's ``--array`` value: ``0-N`` and ``%K`` when throttled."""
        last = len(self.indices) - 1
        text = "0" if last == 0 else f"0-{last}"
        return f"{text}%{max_running}" if max_running else text


def chunks(indices: Sequence[int], max_array_size: int) -> list[Chunk]:
    """``indices`` as arrays of at most ``max_array_size`` tasks each. Slurm refuses an index
    >= MaxArraySize (slurm.conf(5)), so every array counts its tasks from 0 and the task's
    point is looked up in that array's own list."""
    if max_array_size < 1:
        raise UserError(f"MaxArraySize {max_array_size}: a job array needs at least 1")
    return [
        Chunk(tuple(indices[start : start + max_array_size]))
        for start in range(0, len(indices), max_array_size)
    ]


def parse_axes(grids: Sequence[str], ranges: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """Every ``--grid`` and ``--range`` parsed, or one UserError naming each bad one."""
    problems: list[str] = []
    parsed: tuple[list[Any], list[Any]] = ([], [])
    for texts, parse, out in ((grids, parse_grid, parsed[0]), (ranges, parse_range, parsed[1])):
        for text in texts:
            try:
                out.append(parse(text))
            except UserError as exc:
                problems.append(str(exc))
    if problems:
        raise UserError("\n".join(problems))
    return parsed
