"""Node-hours and GPU-hours a run cost, from Slurm's accounting: pure, from ``sacct``'s own
text (:func:`hpctf.core.scheduler.slurm_queries.sacct_usage` asks for it, one call for every
run a command shows).

A run's hours are the sum over every start of every job it had: each start's elapsed seconds
(``ElapsedRaw``: to its end, or to now while it runs) times the nodes it held (``NNodes``) and
the GPUs of its allocation (``gres/gpu`` in ``AllocTRES``), divided by 3,600. A job Slurm or
hpctf requeued keeps its id: ``sacct --duplicates`` lists each of its starts, the earlier ones
REQUEUED, PREEMPTED or NODE_FAIL. A start still pending holds nothing (elapsed 0, no TRES).

A site without accounting (a local site, or ``sacct``: "accounting storage is disabled") has
no hours: :data:`UNACCOUNTED`, said in one word, never 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hpctf.core.scheduler.slurm_queries import USAGE_FIELDS

UNACCOUNTED = "unaccounted"

# gres/gpu=4 (every GPU of the allocation) or gres/gpu:a100=4 (those of one type).
_GPU_TRES = re.compile(r"^gres/gpu(?::[^=]+)?=(\d+)$")


@dataclass(frozen=True)
class Usage:
    """One start of one job, as ``sacct --allocations --duplicates`` lists it."""

    job_id: str
    state: str
    elapsed_s: int
    nodes: int
    gpus: int


def gpus_in_tres(tres: str) -> int:
    """The GPUs of an allocation's TRES (``billing=2,cpu=2,gres/gpu=4,mem=8G,node=1``): the
    untyped ``gres/gpu`` count, else the sum of the typed ones (``gres/gpu:a100=2``)."""
    untyped = 0
    typed = 0
    found_untyped = False
    for item in tres.split(","):
        match = _GPU_TRES.match(item.strip())
        if match is None:
            continue
        if item.strip().startswith("gres/gpu="):
            untyped, found_untyped = int(match.group(1)), True
        else:
            typed += int(match.group(1))
    return untyped if found_untyped else typed


def _whole(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def parse_usage(text: str) -> list[Usage]:
    """sacct's ``--parsable2 --noheader --format=<USAGE_FIELDS>`` output, one :class:`Usage`
    per line, in sacct's order; lines of another shape are left out."""
    starts = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != len(USAGE_FIELDS) or not fields[0]:
            continue
        job_id, state, elapsed, nodes, tres = fields
        starts.append(
            Usage(job_id, state.split(" ")[0], _whole(elapsed), _whole(nodes), gpus_in_tres(tres))
        )
    return starts


@dataclass(frozen=True)
class Hours:
    """What some starts cost: node-hours, GPU-hours, and how many starts held nodes."""

    node_hours: float = 0.0
    gpu_hours: float = 0.0
    starts: int = 0

    def __add__(self, other: Hours) -> Hours:
        return Hours(
            self.node_hours + other.node_hours,
            self.gpu_hours + other.gpu_hours,
            self.starts + other.starts,
        )


def run_hours(job_ids: Iterable[str], usage: Sequence[Usage]) -> Hours:
    """The hours of a run whose jobs are ``job_ids`` (its journal's job handles: ``123`` or
    ``123_4``), summed over every start of each in ``usage``."""
    ids = set(job_ids)
    total = Hours()
    for start in usage:
        if start.job_id in ids and start.elapsed_s > 0:
            seconds = start.elapsed_s
            total += Hours(seconds * start.nodes / 3600, seconds * start.gpus / 3600, 1)
    return total


def summed(hours: Iterable[Hours | None]) -> Hours | None:
    """The hours of several runs (a sweep's points): the sum of those accounted, None
    (:data:`UNACCOUNTED`) when none is."""
    known = [h for h in hours if h is not None]
    return sum(known, Hours()) if known else None


def hours_json(hours: Hours | None) -> dict[str, Any] | str:
    """``--json``'s value: ``{"node_hours", "gpu_hours", "starts"}``, or ``"unaccounted"``."""
    if hours is None:
        return UNACCOUNTED
    return {
        "node_hours": round(hours.node_hours, 6),
        "gpu_hours": round(hours.gpu_hours, 6),
        "starts": hours.starts,
    }


def hours_text(hours: Hours | None) -> str:
    """``1.25 node-h, 10.00 GPU-h`` for a person, or ``unaccounted``."""
    if hours is None:
        return UNACCOUNTED
    return f"{hours.node_hours:.2f} node-h, {hours.gpu_hours:.2f} GPU-h"
