"""``hpctf plot``: loss and eval metrics against step, each restart marked with its reason; of
a search's sweep directory, the objective over trials and each trial's eval curve
(:mod:`hpctf.login.watching.search_plot`). matplotlib is imported only inside the command, off
every other command's import path.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import UserError
from hpctf.core.run.history import EndReason
from hpctf.core.safe_files import write_atomic
from hpctf.login.reading.run_report import with_slurm_queue
from hpctf.login.reading.run_site import run_site_option
from hpctf.login.reading.runs import RunRecord, metric_records
from hpctf.login.reading.slurm_view import job_states, slurm_state
from hpctf.login.sweeps.sweep_dir import SweepDir, is_sweep_dir
from hpctf.login.watching import search_plot

RESTART_LABELS = {
    EndReason.PREEMPTED: "preempted",
    EndReason.TIMEOUT: "time limit",
    EndReason.RESTART: "planned restart",
    EndReason.NODE_FAIL: "node failure",
    EndReason.FAILED: "crash",
    EndReason.STALLED: "stalled",
    EndReason.CANCELLED: "cancelled",
    EndReason.DONE: "done",
    EndReason.PRUNED: "pruned",
}


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The PNG to write (default: RUN_DIR/loss.png for your own run, ./NAME-loss.png "
    "for a run someone else owns; SWEEP/search.png for a search, SWEEP/sweep.png for a grid).",
)
@run_site_option
def plot(run_dir: Path, output: Path | None, site_name: str | None) -> None:
    """Draw RUN_DIR's loss and eval metrics against step, each restart marked with why the
    start before it ended; for a search's SWEEP directory, the objective over trials (with the
    best so far) and each trial's eval curve, pruned trials marked where they were pruned; for
    a grid's SWEEP directory, every point's loss and first eval metric, labelled by its values.
    Needs matplotlib: pip install matplotlib (the extra hpctf[plot])."""
    if run_dir.is_dir() and search_plot.is_search(run_dir):
        plot_search(run_dir, output)
        return
    if run_dir.is_dir() and is_sweep_dir(run_dir):
        plot_grid(run_dir, output)
        return
    run = RunRecord.read(run_dir)
    pyplot = _pyplot()
    records = metric_records(run.run.metrics)
    losses = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))]
    if not losses:
        raise UserError(f"{run.run.metrics}: no loss logged yet; nothing to plot")
    output = output or default_output(run)
    figure, axes = pyplot.subplots(figsize=(9, 5), dpi=100)
    axes.plot([s for s, _ in losses], [v for _, v in losses], label="training loss", color="C0")
    if all(v > 0 for _, v in losses):
        axes.set_yscale("log")
    evals = eval_series(records)
    other = axes.twinx() if any(name != "loss" for name in evals) else axes
    for i, (name, points) in enumerate(sorted(evals.items()), 1):
        (axes if name == "loss" else other).plot(
            [s for s, _ in points],
            [v for _, v in points],
            marker="o",
            linestyle="--",
            color=f"C{i}",
            label=f"eval {name}",
        )
    mark_restarts(axes, run)
    axes.set_xlabel("step (optimizer updates)")
    axes.set_ylabel("training loss" + (" (log scale)" if axes.get_yscale() == "log" else ""))
    if other is not axes:
        other.set_ylabel("eval metric")
    handles, labels = axes.get_legend_handles_labels()
    if other is not axes:
        more_handles, more_labels = other.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axes.legend(handles, labels, loc="upper right")
    axes.set_title(title(run))
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    _save(pyplot, figure, output)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise UserError(
            "hpctf plot needs matplotlib, which is not installed: pip install matplotlib "
            "(into the environment that runs hpctf)"
        ) from None
    return pyplot


def plot_search(sweep: Path, output: Path | None) -> None:
    """``hpctf plot SWEEP`` of a search (:mod:`hpctf.login.watching.search_plot`)."""
    trials, ref = search_plot.search_trials(sweep)
    if ref is None or not any(trial.curve for trial in trials):
        raise UserError(f"{sweep}: no trial has logged an evaluation yet; nothing to plot")
    pyplot = _pyplot()
    figure = search_plot.draw(pyplot, sweep, trials, ref)
    output = output or search_plot.default_output(sweep, sweep.stat().st_uid == os.geteuid())
    _save(pyplot, figure, output)


# Points named in the legend of a grid's plot; more are drawn unnamed.
LEGEND_POINTS = 12


def plot_grid(sweep: Path, output: Path | None) -> None:
    """``hpctf plot SWEEP`` of a grid: every point's training loss (left) and its first eval
    metric (right) against step, one line per point, named by its values."""
    directory = SweepDir.read(sweep)
    curves: list[tuple[str, list[tuple[int, float]], dict[str, list[tuple[int, float]]]]] = []
    for point in directory.points:
        run_dir = Path(point["run_dir"])
        if not (run_dir / "metrics.jsonl").is_file():
            continue
        records = metric_records(run_dir / "metrics.jsonl")
        losses = [
            (r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))
        ]
        given = point.get("values")
        values: dict[str, Any] = given if isinstance(given, dict) else {}
        name = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in values.items())
        curves.append((name[:48] or run_dir.name, losses, eval_series(records)))
    if not any(losses for _, losses, _ in curves):
        raise UserError(f"{sweep}: no point has logged a loss yet; nothing to plot")
    pyplot = _pyplot()
    metric = next((sorted(evals)[0] for _, _, evals in curves if evals), None)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(13, 5), dpi=100)
    for i, (name, losses, evals) in enumerate(curves):
        label = name if i < LEGEND_POINTS else None
        left.plot([s for s, _ in losses], [v for _, v in losses], color=f"C{i % 10}", label=label)
        if metric is not None and metric in evals:
            points = evals[metric]
            right.plot([s for s, _ in points], [v for _, v in points], color=f"C{i % 10}",
                       marker="o", linestyle="--", label=label)  # fmt: skip
    left.set_xlabel("step (optimizer updates)")
    left.set_ylabel("training loss")
    right.set_xlabel("step (optimizer updates)")
    right.set_ylabel(f"eval {metric}" if metric else "no eval metric logged")
    for axes in (left, right):
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize=7)
    figure.suptitle(f"{directory.path.name}: {len(directory.points)} point(s)")
    figure.tight_layout()
    owned = directory.path.stat().st_uid == os.geteuid()
    default = directory.path / "sweep.png" if owned else Path.cwd() / f"{sweep.name}-sweep.png"
    _save(pyplot, figure, output or default)


def _save(pyplot: Any, figure: Any, output: Path) -> None:
    image = io.BytesIO()
    figure.savefig(image, format="png")
    pyplot.close(figure)
    # A temporary file renamed over the name: a link planted at ``output`` is refused, and
    # never written through (hpctf.core.safe_files).
    write_atomic(output, image.getvalue(), mode=None)
    click.echo(f"wrote {output}")


def default_output(run: RunRecord) -> Path:
    """RUN_DIR/loss.png when the caller owns the run directory; else NAME-loss.png in the
    current directory: a run someone else owns is theirs to write, not ours (and whatever
    they planted in it is not ours to follow)."""
    if run.run.path.stat().st_uid == os.geteuid():
        return run.run.path / "loss.png"
    return Path.cwd() / f"{run.name}-loss.png"


def eval_series(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Each eval metric's (step, value) points, from metrics.jsonl's records."""
    evals: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for name, value in (record.get("eval") or {}).items():
            if isinstance(value, (int, float)):
                evals.setdefault(name, []).append((record["step"], value))
    return evals


def mark_restarts(axes: Any, run: RunRecord) -> None:
    """A dotted line at the first step of every start after the first, named with why the
    start before it ended; a dashed one where a search pruned the run."""
    previous = None
    for number, start in enumerate(run.state.starts, 1):
        if number > 1 and previous is not None:
            why = RESTART_LABELS[previous.reason] if previous.reason else "killed"
            _mark(axes, start.step, f"restart {number} (after {why})", "grey", ":", "dimgrey")
        previous = start
    last = run.state.last
    if last is not None and last.reason == EndReason.PRUNED and last.end_step is not None:
        _mark(axes, last.end_step, f"pruned {last.pruned or ''}".strip(), "C3", "--", "C3")


def _mark(axes: Any, step: int, text: str, color: str, style: str, text_color: str) -> None:
    """A vertical line at ``step`` with ``text`` along it, at the top of the plot."""
    axes.axvline(step, color=color, linestyle=style, linewidth=1)
    axes.annotate(
        text,
        (step, 0.98),
        xycoords=("data", "axes fraction"),
        rotation=90,
        va="top",
        ha="right",
        fontsize=8,
        color=text_color,
    )


def title(run: RunRecord) -> str:
    """The plot's title: the run's state as `hpctf status` says it (Slurm's word included, one
    squeue call), and its starts."""
    facts = run.facts
    state = with_slurm_queue(
        facts, slurm_state(facts, run.job, job_states([facts], all_jobs=False))
    ).state
    return f"{run.name}: {state}, {len(run.state.starts)} start(s)"
