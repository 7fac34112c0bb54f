"""What a trial's run came to, read from its run directory (pure reading, no Optuna): how it
ended (:func:`run_end`) and its objective's value at each evaluation (:func:`eval_values`) and
the last (:func:`objective_value`). The array task that runs trials asks these after a trial's
run ends, to tell the study; ``hpctf plot SWEEP`` draws the curves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpctf.core.run.history import RunStatus, read_history
from hpctf.core.run.metrics_history import eval_metric, metric_records
from hpctf.core.run.rundir import RunDir


def metric_in(record: Mapping[str, Any], metric: str) -> float | None:
    """``metric`` (``eval.loss``: the ``loss`` of the record's ``eval`` group, or its
    ``val_loss`` from ``model.fit``; ``loss``: a top-level value) in one metrics.jsonl
    record, or None when it holds no number there."""
    group, _, name = metric.partition(".")
    value: Any = record.get(group) if name else record.get(metric)
    if name:
        value = eval_metric(value, name) if group == "eval" else _member(value, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and value == value else None  # NaN is no value


def _member(group: Any, name: str) -> Any:
    return group.get(name) if isinstance(group, Mapping) else None


def eval_values(records: Iterable[Mapping[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of ``metric`` in each record that has it, in step order, each step once
    (the last record of a step wins: a resumed start logs it again)."""
    values: dict[int, float] = {}
    for record in records:
        step, value = record.get("step"), metric_in(record, metric)
        if isinstance(step, int) and value is not None:
            values[step] = value
    return sorted(values.items())


def objective_value(run_dir: Path, metric: str) -> float | None:
    """The value of ``metric`` at the run's last evaluation (its metrics.jsonl), or None when
    no evaluation logged it."""
    values = eval_values(metric_records(RunDir(Path(run_dir)).metrics), metric)
    return values[-1][1] if values else None


def run_end(run_dir: Path) -> RunStatus:
    """The run's state from its journal: ``done``, ``pruned``, ``failed``, ``gave_up``,
    ``cancelled``, ``preempted``, or ``running``/``queued``/``requeued`` while not ended."""
    return read_history(RunDir(Path(run_dir))).state.state
