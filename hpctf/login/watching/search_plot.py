"""``hpctf plot SWEEP`` of a search: the objective over trials with the best so far, and each
trial's eval curve, pruned trials marked where the pruner stopped them.

Read from the trials' run directories alone (each with its ``trial.json``: the trial's number
and the objective), their metrics and their journals, so neither Optuna nor the study file is
needed to draw; matplotlib is imported by the caller (:mod:`hpctf.login.watching.plot`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.core.run.history import RunStatus, read_history
from hpctf.core.run.metrics_history import metric_records
from hpctf.core.run.rundir import RunDir
from hpctf.core.search.outcome import eval_values
from hpctf.core.search.study import JOURNAL_FILE
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, read_trial_ref


@dataclass(frozen=True)
class TrialCurve:
    """One trial as drawn: its number, its run's state, the objective at each evaluation
    (step, value) and where a pruner stopped it (the step and value of its last evaluation
    before the prune; None: not pruned)."""

    number: int
    state: RunStatus
    curve: tuple[tuple[int, float], ...]
    pruned_at: tuple[int, float] | None = None

    @property
    def value(self) -> float | None:
        """The objective at the trial's last evaluation (None: none yet)."""
        return self.curve[-1][1] if self.curve else None


def is_search(path: Path) -> bool:
    """Whether ``path`` is a search's sweep directory: its study, or trials' run directories."""
    return (path / JOURNAL_FILE).is_file() or any(path.glob(f"*/{TRIAL_FILE}"))


def search_trials(sweep: Path) -> tuple[list[TrialCurve], TrialRef | None]:
    """Every trial in ``sweep`` (a run directory beside the study with a readable
    ``trial.json``), in trial order, and one trial's link (its objective, for the labels)."""
    found: list[tuple[TrialRef, Path]] = []
    for marker in sweep.glob(f"*/{TRIAL_FILE}"):
        try:
            ref = read_trial_ref(marker.parent)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged link: that run is left out, the others drawn
        if ref is not None:
            found.append((ref, marker.parent))
    found.sort(key=lambda item: item[0].number)
    trials = [trial_curve(ref, run_dir) for ref, run_dir in found]
    return trials, found[0][0] if found else None


def trial_curve(ref: TrialRef, run_dir: Path) -> TrialCurve:
    """One trial's curve and end, from its run directory."""
    run = RunDir(run_dir)
    curve = tuple(eval_values(metric_records(run.metrics), ref.objective.metric))
    history = read_history(run)
    pruned = history.pruned
    point = None
    if pruned is not None and history.state.state == RunStatus.PRUNED:
        before = [p for p in curve if pruned.step is None or p[0] <= pruned.step]
        if before:
            point = (before[-1][0], pruned.value if pruned.value is not None else before[-1][1])
    return TrialCurve(ref.number, history.state.state, curve, point)


def best_so_far(trials: Sequence[TrialCurve], direction: str) -> list[tuple[int, float]]:
    """(trial number, best objective among the finished trials up to it), for every finished
    (``done``) trial: pruned and failed trials take no part, as in the study."""
    better = min if direction == "minimize" else max
    best: float | None = None
    line = []
    for trial in trials:
        value = trial.value
        if trial.state != RunStatus.DONE or value is None or not math.isfinite(value):
            continue
        best = value if best is None else better(best, value)
        line.append((trial.number, best))
    return line


def draw(pyplot: Any, sweep: Path, trials: Sequence[TrialCurve], ref: TrialRef) -> Any:
    """The figure: the objective over trials (left) and every trial's eval curve (right)."""
    metric, direction = ref.objective.metric, ref.objective.direction
    figure, (over, curves) = pyplot.subplots(1, 2, figsize=(13, 5), dpi=100)
    for trial in trials:
        if trial.value is None:
            continue
        pruned = trial.state == RunStatus.PRUNED
        style = {"marker": "x", "color": "C3"} if pruned else {"marker": "o", "color": "C0"}
        over.scatter([trial.number], [trial.value], alpha=0.8, **style)
        if trial.state not in (RunStatus.DONE, RunStatus.PRUNED):
            over.annotate(trial.state, (trial.number, trial.value), fontsize=7, color="dimgrey")
    best = best_so_far(trials, direction)
    if best:
        over.step([n for n, _ in best], [v for _, v in best], where="post", color="C2",
                  label=f"best so far ({direction})")  # fmt: skip
    over.scatter([], [], marker="o", color="C0", label="finished trial")
    over.scatter([], [], marker="x", color="C3", label="pruned trial (its last evaluation)")
    over.xaxis.set_major_locator(pyplot.MaxNLocator(integer=True))
    over.set_xlabel("trial")
    over.set_ylabel(metric)
    over.legend(loc="best", fontsize=8)
    over.grid(True, alpha=0.3)
    for trial in trials:
        if trial.curve:
            color = "C3" if trial.state == RunStatus.PRUNED else "C0"
            curves.plot([s for s, _ in trial.curve], [v for _, v in trial.curve],
                        color=color, alpha=0.5, linewidth=1, marker=".")  # fmt: skip
        if trial.pruned_at is not None:
            curves.scatter([trial.pruned_at[0]], [trial.pruned_at[1]], marker="x", s=60,
                           color="C3", zorder=3)  # fmt: skip
    curves.scatter([], [], marker="x", s=60, color="C3", label="pruned here")
    curves.set_xlabel("step (optimizer updates)")
    curves.set_ylabel(metric)
    curves.legend(loc="best", fontsize=8)
    curves.grid(True, alpha=0.3)
    done = sum(1 for t in trials if t.state == RunStatus.DONE)
    pruned_count = sum(1 for t in trials if t.state == RunStatus.PRUNED)
    figure.suptitle(
        f"{sweep.name}: {len(trials)} trial(s), {done} done, {pruned_count} pruned"
        + (f", best {metric} {best[-1][1]:.6g}" if best else "")
    )
    figure.tight_layout()
    return figure


def default_output(sweep: Path, owned: bool) -> Path:
    """SWEEP/search.png for the caller's own sweep, ./NAME-search.png otherwise."""
    return sweep / "search.png" if owned else Path.cwd() / f"{sweep.name}-search.png"
