"""A sweep as the Python API reads it (:class:`hpctf.Sweep`, through the typed call
:func:`hpctf.login.calls.table.sweep`): its points with their values typed, their
``status SWEEP --json`` documents, whether it is over, its best point. Pure but for reading
the sweep directory (and one squeue call for the documents)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpctf.login.sweeps.sweep_dir import SweepDir


def points_of(record: SweepDir) -> list[dict[str, Any]]:
    """Every point: index, values (a grid's typed as the experiment took them; a search's
    parameters as the study gave them) and run_dir."""
    return [
        {
            "index": int(point["index"]),
            "values": point["values"] if record.is_search else typed(point["values"]),
            "run_dir": str(point["run_dir"]),
        }
        for point in record.points
    ]


def documents_of(record: SweepDir, watching: bool = False) -> list[dict[str, Any]]:
    """One document per point, as ``hpctf status SWEEP --json`` prints them (a search's: one
    per trial, with trial, params and value too)."""
    from hpctf.login.reading.slurm_view import job_states
    from hpctf.login.sweeps.sweep_dir import point_documents

    if record.is_search:
        from hpctf.login.sweeps.search_watch import trial_documents

        return trial_documents(record)[0]
    facts = record.facts(every_point=True)
    view = job_states(facts, all_jobs=False, watching=watching)
    return point_documents(record, facts, view, time.time())


def is_over(record: SweepDir, documents: Sequence[Mapping[str, Any]]) -> bool:
    """Every point has ended (as :meth:`hpctf.Run.wait` says). A search: the study's word,
    not the run directories' — its whole budget asked and no trial still running there (a
    trial refused before it had a run, or one a killed task asked, has no run directory)."""
    if not record.is_search:
        from hpctf.login.reading.run_report import has_ended

        return all(map(has_ended, documents))
    from hpctf.login.sweeps.search_watch import study_trials

    trials = study_trials(record)
    budget = record.record.trials or 0
    finished = ("COMPLETE", "PRUNED", "FAIL")
    return len(trials) >= budget and all(t.state.name in finished for t in trials.values())


def best_of(
    record: SweepDir,
    documents: Sequence[Mapping[str, Any]],
    metric: str | None,
    mode: str | None,
) -> dict[str, Any] | None:
    """The point with the best ``metric`` (default ``eval.accuracy``), as ``hpctf status
    SWEEP --sort METRIC`` ranks them; None when no point has logged it. A search without a
    metric: the study's best COMPLETE trial by its objective."""
    from hpctf.login.sweeps.ranking import metric_value, rank, split_mode

    if record.is_search and metric is None:
        from hpctf.login.sweeps.search_watch import best_point

        found = best_point(record)
        return None if found is None else {"index": found[0], "values": found[1],
                                           "run_dir": found[2]}  # fmt: skip
    metric = metric or "eval.accuracy"
    ranked = rank(list(documents), metric, mode)  # type: ignore[arg-type]
    if not ranked or metric_value(ranked[0], split_mode(metric)[0]) is None:
        return None
    top = ranked[0]
    values = top["values"] if record.is_search else typed(top["values"])
    return {"index": int(top["index"]), "values": values, "run_dir": str(top["run_dir"])}


def typed(values: Mapping[str, str]) -> dict[str, Any]:
    """A point's values (kept as the ``--set`` texts it was given) as the experiment took
    them: ``{"train.args.lr": 0.01, "train.steps": 100, "train.args.bn": True}``."""
    from hpctf.core.settings.config import Experiment
    from hpctf.core.settings.validation import override_value

    return {key: override_value(Experiment, key, str(text)) for key, text in values.items()}
