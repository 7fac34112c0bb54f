"""A run's progress in numbers and words, from its facts (:mod:`hpctf.core.run.listing`: the
tail of its metrics.jsonl, its journal): step, loss, steps/s, elapsed time inside starts, ETA;
durations, sparklines and the code snapshot as text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hpctf.core.run.history import RunStatus, Start
from hpctf.core.run.listing import RunFacts, epoch_seconds


def elapsed_seconds(starts: Sequence[Start], running: bool, now: float) -> float:
    """Time spent in ``starts`` (:attr:`hpctf.core.run.history.RunHistory.starts`), over all
    of them: each from its start to its ``ended`` record (a start killed without one: to its
    last record; the running one: to ``now``)."""
    total = 0.0
    for number, start in enumerate(starts, 1):
        begin = epoch_seconds(start.started_at)
        if start.ended_at is not None:
            end = epoch_seconds(start.ended_at)
        elif running and number == len(starts):
            end = now
        else:
            end = epoch_seconds(start.last_at)
        total += max(end - begin, 0.0)  # clocks of two nodes may disagree: never negative
    return total


def progress(run: RunFacts, now: float, running: bool | None = None) -> dict[str, Any]:
    """Step, total, last loss, steps/s, elapsed and ETA of ``run`` (None where unknown).
    ``running``: whether a start is training now (default: the journal's word); elapsed time
    and the ETA count only then, not while a requeued job waits."""
    step, total, rate = run.step, run.total_steps, run.steps_per_s
    if running is None:
        running = run.state.state == RunStatus.RUNNING
    eta = None
    if running and total and step is not None and isinstance(rate, (int, float)) and rate > 0:
        eta = max(total - step, 0) / rate
    return {
        "step": step,
        "total_steps": total,
        "loss": run.loss,
        "steps_per_s": rate,
        "elapsed_s": round(elapsed_seconds(run.state.starts, running, now)),
        "eta_s": None if eta is None else round(eta),
    }


def duration(seconds: float | None) -> str:
    """``1d02:03:04``, ``2:03:04``, ``3:04``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# The eight block heights of a sparkline, lowest first.
BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """``values`` as at most ``width`` block characters (bucket means; log scale when every
    value is positive, so a loss falling by decades still shows its shape)."""
    points = [float(v) for v in values if math.isfinite(v)]
    if not points:
        return ""
    log = all(v > 0 for v in points)
    if log:
        points = [math.log10(v) for v in points]
    buckets = min(width, len(points))
    means = []
    for i in range(buckets):
        part = points[i * len(points) // buckets : (i + 1) * len(points) // buckets]
        means.append(sum(part) / len(part))
    low, high = min(means), max(means)
    span = high - low or 1.0
    return "".join(BLOCKS[min(int((m - low) / span * len(BLOCKS)), len(BLOCKS) - 1)] for m in means)


def code_text(code: Sequence[Mapping[str, Any]]) -> str:
    """A run's code snapshot in a word: each source's commit (+dirty), or no-git; - for none."""
    words = [
        "no-git"
        if c["git_commit"] is None
        else c["git_commit"][:8] + ("+dirty" if c["git_dirty"] else "")
        for c in code
    ]
    return ",".join(dict.fromkeys(words)) or "-"
