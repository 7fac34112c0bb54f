"""A sweep from Python: :func:`sweep` starts one as ``hpctf sweep`` does, :class:`Sweep` reads
one (its points, ``status SWEEP --json``'s documents, the best point by a metric)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.python_api.run_api import Run, Settings, has_ended, set_texts, value_text


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, the values it set (typed as the experiment took them:
    int, float, bool, str, list), and its run."""

    index: int
    values: dict[str, Any]
    run: Run


class Sweep:
    """A sweep directory (``hpctf sweep`` printed it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from hpctf.login.sweeps.sweep_dir import SweepDir

        self.path = Path(path).resolve()
        SweepDir.read(self.path)  # a UserError now, when it is not a sweep directory

    def __repr__(self) -> str:
        return f"hpctf.Sweep({str(self.path)!r})"

    @property
    def points(self) -> list[Point]:
        from hpctf.login.sweeps.sweep_dir import SweepDir

        record = SweepDir.read(self.path)
        return [
            Point(int(p["index"]), p["values"] if record.is_search else typed(p["values"]),
                  Run(p["run_dir"]))
            for p in record.points
        ]  # fmt: skip

    def status(self) -> list[dict[str, Any]]:
        """One document per point, as ``hpctf status SWEEP --json`` prints them: index,
        values, run_dir, job, slurm, state, why, step, loss, eval (last), best_eval (a
        search's: one per trial, with trial, params, value too)."""
        from hpctf.login.reading.slurm_view import job_states
        from hpctf.login.sweeps.sweep_dir import SweepDir, point_documents

        record = SweepDir.read(self.path)
        if record.is_search:  # a search's trials, as `hpctf status SWEEP --json` has them
            from hpctf.login.sweeps.search_watch import trial_documents

            return trial_documents(record)[0]
        records = record.facts(every_point=True)
        return point_documents(record, records, job_states(records, all_jobs=False), time.time())

    def wait(self, timeout: float | None = None, poll: float = 10.0) -> dict[int, str]:
        """Block until every point has ended (as :meth:`Run.wait` says); each point's state.
        A search: until its whole budget is asked and every trial is done, pruned or failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            documents = self.status()
            if self._search_over() if self._is_search else all(map(has_ended, documents)):
                return {int(d["index"]): str(d["state"]) for d in documents}
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.path}: points still running after {timeout} s")
            time.sleep(poll)

    @property
    def _is_search(self) -> bool:
        from hpctf.login.sweeps.sweep_dir import SweepDir

        return SweepDir.read(self.path).is_search

    def _search_over(self) -> bool:
        """The study's word, not the run directories': its whole budget asked and no trial
        still running there (a trial refused before it had a run, or one a killed task asked,
        has no run directory to count)."""
        from hpctf.login.sweeps.search_watch import study_trials
        from hpctf.login.sweeps.sweep_dir import SweepDir

        record = SweepDir.read(self.path)
        trials = study_trials(record)
        budget = int(record.data.get("trials") or 0)
        finished = ("COMPLETE", "PRUNED", "FAIL")
        return len(trials) >= budget and all(t.state.name in finished for t in trials.values())

    def best(self, metric: str | None = None, mode: str | None = None) -> Point | None:
        """The point with the best ``metric`` (``eval.NAME``: its last evaluation;
        ``best_eval.NAME``; ``loss``; default ``eval.accuracy``), highest unless
        ``mode="min"`` or ``NAME:min`` (default: lowest for names with loss, error, mae, mse
        and the like), as ``hpctf status SWEEP --sort METRIC`` ranks them. None when no point
        has logged it.

        A search without ``metric``: its best trial as ``hpctf status SWEEP`` shows it (the
        study's best COMPLETE trial by the search's objective), its index the trial's number
        and its values the trial's parameters."""
        from hpctf.login.sweeps.ranking import metric_value, rank, split_mode
        from hpctf.login.sweeps.sweep_dir import SweepDir

        record = SweepDir.read(self.path)
        if record.is_search and metric is None:
            from hpctf.login.sweeps.search_watch import best_point

            found = best_point(record)
            return None if found is None else Point(found[0], found[1], Run(found[2]))
        metric = metric or "eval.accuracy"

        ranked = rank(self.status(), metric, mode)  # type: ignore[arg-type]
        if not ranked or metric_value(ranked[0], split_mode(metric)[0]) is None:
            return None
        top = ranked[0]
        values = top["values"] if record.is_search else typed(top["values"])
        return Point(int(top["index"]), values, Run(top["run_dir"]))


def typed(values: Mapping[str, str]) -> dict[str, Any]:
    """A point's values (kept as the ``--set`` texts it was given) as the experiment took
    them: ``{"train.args.lr": 0.01, "train.steps": 100, "train.args.bn": True}``."""
    from hpctf.core.settings.config import Experiment
    from hpctf.core.settings.validation import override_value

    return {key: override_value(Experiment, key, str(text)) for key, text in values.items()}


def sweep(
    experiment: str | os.PathLike[str],
    grid: Mapping[str, Sequence[Any]] | None = None,
    site: str | None = None,
    set: Settings = None,
    max_running: int | None = None,
    ranges: Mapping[str, str] | None = None,
    draws: int | None = None,
    seed: int = 0,
    max_points: int | None = None,
    echo: bool = False,
) -> Sweep:
    """``hpctf sweep EXPERIMENT --grid KEY=V1,V2 ...``: one run per point of the product of
    ``grid`` (``{"train.args.lr": [0.01, 0.1]}``), or ``draws`` random points from ``ranges``
    (``{"train.args.lr": "1e-4:1e-1:log"}``); an experiment with a ``sweep:`` section (and no
    grid) is searched, as ``hpctf sweep`` does. On a Slurm site it returns once the job array
    is submitted (:meth:`Sweep.wait` waits); on a local site once every point has run (worker
    output in the rank logs unless ``echo``; Ctrl-C: the point saves, KeyboardInterrupt)."""
    from hpctf.login.submitting.launchers import Caller
    from hpctf.login.sweeps.plan import DEFAULT_MAX_POINTS
    from hpctf.login.sweeps.start import start_any

    grids = [f"{k}={','.join(value_text(v) for v in vs)}" for k, vs in (grid or {}).items()]
    range_texts = [f"{k}={v}" for k, v in (ranges or {}).items()]
    record, _ = start_any(
        Path(experiment), grids, range_texts, draws, seed, max_points or DEFAULT_MAX_POINTS,
        site, set_texts(set), max_running, Caller(echo=echo, interrupt=True),
    )  # fmt: skip
    return Sweep(record.path)
