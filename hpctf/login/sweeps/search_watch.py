"""``hpctf status``, ``resubmit`` and ``cancel`` of a search's sweep directory, and its best
trial (:meth:`hpctf.Sweep.best`).

A trial's state is the study's word where the study has one (done, pruned, failed), and its
run's otherwise: ``running`` while its job trains it, ``pending`` while it waits (queued,
requeued after a preemption, or stopped until a resubmit). The best value so far is the
study's best COMPLETE trial's, the objective's last evaluation in its run, as the agent told
it; ``Sweep.best()`` returns that trial. The trial budget spent is how many trials the study
has asked, of ``trials``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.printable import printable
from hpctf.core.run import journal
from hpctf.core.run.history import RunStatus, TrialStatus
from hpctf.core.run.hours import Hours, hours_json, hours_text, parse_usage, run_hours
from hpctf.core.run.listing import RunFacts
from hpctf.core.run.run_index import Index
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm, slurm_queries
from hpctf.core.scheduler.slurm import FINAL_STATES, SlurmFailure
from hpctf.core.search.search_dir import SEARCH_DIR, STUDY_NAME
from hpctf.core.search.study import JOURNAL_FILE, damage_named, open_study
from hpctf.core.settings.search import Search
from hpctf.login.reading.run_report import format_table, run_document
from hpctf.login.reading.slurm_view import job_states, slurm_records, slurm_text
from hpctf.login.sweeps.ranking import rank
from hpctf.login.sweeps.sweep_dir import SweepDir, refuse_unrecorded_arrays, unrecorded_arrays

_STUDY_STATES = {
    "COMPLETE": TrialStatus.DONE,
    "PRUNED": TrialStatus.PRUNED,
    "FAIL": TrialStatus.FAILED,
}


def search_of(record: SweepDir) -> Search:
    return Search.model_validate(record.record.search)


def study_trials(record: SweepDir) -> dict[int, Any]:
    """The study's trials by number (Optuna's FrozenTrial)."""
    journal = record.path / JOURNAL_FILE
    with damage_named(journal):
        study = open_study(journal, STUDY_NAME, search_of(record).pruner)
        return {t.number: t for t in study.get_trials(deepcopy=False)}


def trial_state(frozen: Any, run_state: str) -> TrialStatus:
    """A trial's state in ``status``: the study's when it has ended there, else its run's
    (``running``, or ``pending`` while it waits; a run that ended and is not told yet shows its
    end: :meth:`~hpctf.core.run.history.TrialStatus.of_run`)."""
    if frozen is not None and frozen.state.name in _STUDY_STATES:
        return _STUDY_STATES[frozen.state.name]
    return TrialStatus.of_run(RunStatus(run_state))


def best_trial(record: SweepDir, trials: Mapping[int, Any]) -> Any | None:
    """The study's best COMPLETE trial by the objective (the earliest of equals), or None."""
    done = [t for t in trials.values() if t.state.name == "COMPLETE" and t.value is not None]
    if not done:
        return None
    sign = 1 if search_of(record).objective.direction == "minimize" else -1
    return min(done, key=lambda t: (sign * t.value, t.number))


def trial_documents(record: SweepDir) -> tuple[list[dict[str, Any]], list[RunFacts], str | None]:
    """One mapping per trial that has a run: trial (number), params, state, value, and what
    ``status SWEEP`` says of a grid's point (index and values are the number and params, so
    that ``--sort``/``--top`` and :meth:`hpctf.Sweep.best` rank them alike); the runs' facts;
    Slurm's problem, if any."""
    points = record.points  # listed once: agents may add trials meanwhile
    index = Index(record.path)
    runs = [facts for p in points if (facts := index.facts(Path(p["run_dir"]))) is not None]
    index.save(keep=(r.path for r in runs))
    by_path = {r.path: r for r in runs}
    view = job_states(runs, all_jobs=False)
    trials = study_trials(record)
    now = time.time()
    documents = []
    for point in points:
        run = by_path.get(str(Path(point["run_dir"])))
        if run is None:
            continue
        document = run_document(run, view, now)
        frozen = trials.get(int(point["index"]))
        documents.append(
            {
                "trial": point["index"],
                "index": point["index"],
                "params": point["values"],
                "values": point["values"],
                "run_dir": point["run_dir"],
                "state": trial_state(frozen, document["state"]),
                "value": None if frozen is None else frozen.value,
                "run_state": document["state"],
                "why": document["why"],
                "job": document["job"],
                "slurm": document["slurm"],
                "step": document["step"],
                "total_steps": document["total_steps"],
                "loss": document["loss"],
                "eval": run.last_eval,
                "best_eval": run.best_eval,
            }
        )
    return documents, runs, view.problem


def search_hours(runs: Sequence[RunFacts]) -> Hours | None:
    """The hours of the search's array tasks: each job once, however many trials it ran (one
    sacct call; None without accounting)."""
    jobs = sorted({job for run in runs if run.slurm for job in run.state.jobs})
    if not jobs:
        return None
    try:
        text = slurm_queries.sacct_usage(jobs)
    except SlurmFailure as exc:
        click.echo(f"hpctf: hours unknown: {exc}", err=True)
        return None
    return None if text is None else run_hours(jobs, parse_usage(text))


def search_document(record: SweepDir) -> dict[str, Any]:
    """``status SWEEP --json`` of a search (and what the text shows)."""
    documents, runs, problem = trial_documents(record)
    trials = study_trials(record)
    best = best_trial(record, trials)
    best_doc = next((d for d in documents if best is not None and d["trial"] == best.number), None)
    search = search_of(record)
    return {
        "sweep": str(record.path),
        "search": {
            "sampler": search.sampler,
            "objective": search.objective.model_dump(),
            "pruner": search.pruner.kind,
            "parallel": search.parallel,
        },
        "budget": {"asked": len(trials), "trials": record.record.trials or 0},
        "best": None
        if best is None
        else {
            "trial": best.number,
            "value": best.value,
            "params": dict(best.params),
            "run_dir": best_doc["run_dir"] if best_doc else None,
        },
        "trials": documents,
        "hours": hours_json(search_hours(runs)),
        "notes": [problem] if problem else [],
    }


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def status_text(record: SweepDir, document: Mapping[str, Any]) -> str:
    """One line per trial: number, params, state, step, objective value; the budget and the
    best value so far above."""
    budget, best, metric = document["budget"], document["best"], document["search"]["objective"]
    counts = Counter(d["state"] for d in document["trials"])
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none yet"
    best_text = "no trial done yet"
    if best is not None:
        best_text = f"best {metric['metric']} {_value(best['value'])} (trial {best['trial']})"
    text = (
        f"search {record.path.name}: {budget['asked']} of {budget['trials']} trials asked "
        f"({states}); {best_text}\n"
    )
    rows = []
    for d in document["trials"]:
        step = "-" if d["step"] is None else f"{d['step']}/{d['total_steps'] or '?'}"
        params = _params_text(d["params"])
        rows.append(
            (
                str(d["trial"]),
                params,
                d["job"] or "-",
                slurm_text(d["slurm"]),
                d["state"],
                step,
                _value(d["value"]),
            )
        )
    header = ("TRIAL", "PARAMS", "JOB", "SLURM", "STATE", "STEP", "VALUE")
    return text + format_table(header, rows)


# A trial's parameters in the table: at most this many characters (a 50 KB value made a 50 KB
# line), every control character escaped (a newline and an OSC sequence painted a fake row).
PARAMS_CHARS = 120


def _params_text(params: Mapping[str, Any]) -> str:
    text = " ".join(
        f"{key.rsplit('.', 1)[-1]}={_value(value) if isinstance(value, float) else value}"
        for key, value in params.items()
    )
    text = printable(text, keep_lines=False)
    return text if len(text) <= PARAMS_CHARS else text[: PARAMS_CHARS - 3] + "..."


def search_status(path: Path, as_json: bool, sort: str | None, top: int | None) -> None:
    """``hpctf status SWEEP`` of a search; ``--sort METRIC [--top K]`` ranks the trials as a
    grid's points (``--top K`` alone: by the objective)."""
    record = SweepDir.read(path)
    document = search_document(record)
    search = search_of(record)
    if top and not sort:
        sort = search.objective.metric
        mode = "min" if search.objective.direction == "minimize" else "max"
        document["trials"] = [dict(d) for d in rank(document["trials"], sort, mode, top)]  # type: ignore[arg-type]
    elif sort:
        document["trials"] = [dict(d) for d in rank(document["trials"], sort, top=top)]
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(status_text(record, document), nl=False)
    click.echo(f"hours: {hours_text(search_hours_of(document))} over the search's array task(s)")


def search_hours_of(document: Mapping[str, Any]) -> Hours | None:
    hours = document["hours"]
    if not isinstance(hours, dict):
        return None
    return Hours(hours["node_hours"], hours["gpu_hours"], hours["starts"])


def search_cancel(record: SweepDir) -> None:
    """``hpctf cancel SWEEP`` of a search: one scancel of its arrays (every task, queued or
    running), and ``cancelled`` in each trial run that had an open job."""
    arrays = [array.job_id for array in record.record.arrays]
    arrays += unrecorded_arrays(record)
    if not arrays:
        click.echo(f"nothing to cancel: {record.path} has submitted no array")
        return
    slurm.cancel(arrays)
    runs = record.runs()
    for run in runs:
        if run.history.open_jobs:
            journal.record_cancelled(run.run, run.history.open_jobs)
    click.echo(f"cancelled job array(s) {', '.join(arrays)} of search {record.path.name}")


def search_resubmit(record: SweepDir) -> int:
    """``hpctf resubmit SWEEP`` of a search: the array again (its tasks resume the trials they
    held, then take new ones while the budget lasts); refused while a task of the last array is
    still in Slurm."""
    from hpctf.login.sweeps.search_start import submit_array  # the sweeps room's own module

    refuse_unrecorded_arrays(record)
    arrays = record.record.arrays
    if arrays:
        last = arrays[-1].job_id
        tasks = arrays[-1].tasks or record.record.tasks or 1
        view = slurm_records([f"{last}_{task}" for task in range(tasks)])
        if view.problem:
            raise EnvironmentProblem(f"{view.problem}; cannot tell whether the array still runs")
        live = [r for r in view.records.values() if r.state not in FINAL_STATES]
        if live:
            raise UserError(
                f"job array {last} of {record.path.name} is still in Slurm; its agents go on "
                f"(hpctf cancel {record.path} first to start it again)"
            )
    submit_array(record, RunDir(record.path / SEARCH_DIR).load_config())
    return 0


def best_point(record: SweepDir) -> tuple[int, dict[str, Any], str] | None:
    """The best trial's number, parameters and run directory (:meth:`hpctf.Sweep.best`)."""
    best = search_document(record)["best"]
    if best is None or best["run_dir"] is None:
        return None
    return int(best["trial"]), dict(best["params"]), str(best["run_dir"])
