"""The dashboard's pages as typed calls (``hpctf ui``, :mod:`hpctf.login.dashboard`): what one
refresh of a page reads, in ONE call, so that from a laptop a refresh is one SSH round trip
(:func:`hpctf.login.remote.calling.remote_call`). Each reads through what the terminal's
commands read: the runs root's index and lazy listing (``hpctf status``), the user's shared
view of Slurm's queue, a run's ``status --json`` document, its metrics and its rank log's tail
(``hpctf logs``), a sweep's ``status SWEEP --json`` (a search's trials from its study, read
with Optuna) and the curves ``hpctf plot`` draws."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpctf.core.secrets import redact, redact_data
from hpctf.login.calls.models import (
    Mark,
    RunPage,
    RunPageRequest,
    RunsPage,
    RunsPageRequest,
    SweepPage,
    SweepPageRequest,
)

# A run's curves on the page: at most this many rows of training values (every evaluation
# kept): 100,000 logged steps would be megabytes a refresh, and a chart 1,000 pixels wide.
CURVE_ROWS = 2000
# What a row of the runs page shows of a run's ``status --json`` document (its jobs, starts and
# code are the run's page's: 1,000 runs are 0.8 MB a refresh with them, about half without).
ROW_KEYS = frozenset(
    {"run", "path", "site", "job", "slurm", "state", "why", "step", "total_steps", "loss",
     "steps_per_s", "elapsed_s", "eta_s"}
)  # fmt: skip


def runs_page(request: RunsPageRequest) -> RunsPage:
    """Every run under the runs root as ``hpctf status`` lists it, lazily (the runs the index
    lacks: the 200 whose journals changed last now, the rest by the background indexer for the
    next refresh), with Slurm's word from the user's shared queue view (a pending job's reason
    and expected start: squeue's), each run's last evaluation, and its hours when asked."""
    from hpctf.core.run.hours import hours_json
    from hpctf.login.reading.hours_view import hours_of
    from hpctf.login.reading.run_report import run_document
    from hpctf.login.reading.runs import READ_AT_MOST, runs_root_for, scan_runs, unread_note
    from hpctf.login.reading.slurm_view import job_states
    from hpctf.login.sweeps.sweep_dir import find_sweeps, sweep_document

    given = Path(request.root) if request.root else None
    root = runs_root_for(given, request.site, os.environ)
    scan = scan_runs(root, READ_AT_MOST)
    view = job_states(scan.runs, all_jobs=False, watching=True)
    now = time.time()
    documents = []
    for run in scan.runs:
        document = {k: v for k, v in run_document(run, view, now).items() if k in ROW_KEYS}
        document.update(last_eval=run.last_eval, created=run.created, starts=len(run.state.starts))
        documents.append(document)
    if request.hours:
        hours = hours_of(scan.runs)
        for document, run in zip(documents, scan.runs, strict=True):
            document["hours"] = hours_json(hours[run.path])
    sweeps = [sweep_document(sweep, sweep.facts()) for sweep in find_sweeps(root)]
    notes = [view.problem] if view.problem else []
    if scan.unread:
        notes.append(unread_note(scan))
    return RunsPage(
        root=str(scan.root),
        runs=redact_data(documents),
        sweeps=redact_data(sweeps),
        notes=redact_data(notes),
        unread=scan.unread,
    )


def run_page(request: RunPageRequest) -> RunPage:
    """One run as ``hpctf status RUN --json`` says it (every job, Slurm's word, hours when
    asked), its metrics by step, the restarts and prune to mark on its curves, its resolved
    config (secrets as ``***``) and the tail of one rank's log as ``hpctf logs`` shows it."""
    from hpctf.core.run.metrics_history import by_step, metric_records
    from hpctf.login.reading.runs import RunRecord
    from hpctf.login.watching.logs import LogReader
    from hpctf.login.watching.status import run_documents

    record = RunRecord.read(Path(request.run_dir))
    documents, _, _ = run_documents([record], whole=True, with_hours=request.hours, watching=True)
    document = documents[0]
    document.pop("losses", None)  # the rows below hold them
    reader = LogReader(record.run, request.rank, None, shown_bytes=request.log_bytes)
    log = "".join(reader.read(record.history, final=True))
    return RunPage(
        document=redact_data(document),
        rows=redact_data(thinned(by_step(metric_records(record.run.metrics)), CURVE_ROWS)),
        marks=marks_of(document["starts"]),
        config=redact_data(config_document(record.config)),
        ranks=logged_ranks(record.run.logs),
        rank=request.rank,
        log=redact(log),
    )


def sweep_page(request: SweepPageRequest) -> SweepPage:
    """A sweep's points (a grid's, as ``hpctf status SWEEP --json``) or a search's trials (its
    study read with Optuna: state and value of each, the best), with each one's eval curve:
    the objective's for a search, eval.loss (else the first evaluation) for a grid."""
    from hpctf.login.sweeps.sweep_dir import SweepDir

    record = SweepDir.read(Path(request.sweep_dir))
    if record.is_search:
        return _search_page(record)
    from hpctf.login.sweeps.sweep_view import documents_of

    documents = documents_of(record, watching=True)
    curves = [_point_curve(d) for d in documents]
    named = next((c["metric"] for c in curves if c["metric"]), None)
    return SweepPage(
        sweep_dir=str(record.path),
        search=False,
        document=redact_data({"points": documents}),
        metric=None if named is None else f"eval.{named}",
        curves=redact_data(curves),
    )


def _search_page(record: Any) -> SweepPage:
    """A search's page: ``status SWEEP --json``'s document, its trials' curves and the
    objective with the best so far (:mod:`hpctf.login.watching.search_plot`)."""
    from hpctf.login.sweeps.search_watch import search_document, search_of
    from hpctf.login.watching.search_plot import best_so_far, search_trials

    document = search_document(record)
    trials, _ = search_trials(record.path)
    objective = search_of(record).objective
    curves = [
        {
            "label": f"trial {t.number}",
            "number": t.number,
            "state": t.state,
            "points": [list(p) for p in t.curve],
            "pruned_at": None if t.pruned_at is None else list(t.pruned_at),
        }
        for t in trials
    ]
    values = [(t.number, v) for t in trials if (v := t.value) is not None]
    return SweepPage(
        sweep_dir=str(record.path),
        search=True,
        document=redact_data(document),
        metric=objective.metric,
        direction=objective.direction,
        curves=redact_data(curves),
        objective=values,
        best_so_far=best_so_far(trials, objective.direction),
    )


def _point_curve(document: dict[str, Any]) -> dict[str, Any]:
    """One grid point's evaluation curve: eval.loss, else its first evaluated metric."""
    from hpctf.core.run.metrics_history import metric_records
    from hpctf.login.watching.plot import eval_series

    series = eval_series(metric_records(Path(document["run_dir"]) / "metrics.jsonl"))
    metric = "loss" if "loss" in series else next(iter(sorted(series)), None)
    values = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in document["values"].items())
    return {
        "label": f"{document['index']}: {values}",
        "number": document["index"],
        "state": document["state"],
        "metric": metric,
        "points": [list(p) for p in series.get(metric or "", [])],
        "pruned_at": None,
    }


def thinned(rows: Sequence[dict[str, Any]], at_most: int) -> list[dict[str, Any]]:
    """``rows`` (one per step) with at most about ``at_most`` of the rows without an
    evaluation, evenly spaced, the last one kept; every row with an evaluation kept."""
    plain = [i for i, row in enumerate(rows) if "eval" not in row]
    if len(plain) <= at_most:
        return list(rows)
    stride = -(-len(plain) // at_most)
    kept = set(plain[::stride]) | {plain[-1]}
    return [row for i, row in enumerate(rows) if "eval" in row or i in kept]


def marks_of(starts: Sequence[dict[str, Any]]) -> list[Mark]:
    """Where the curves are marked (as ``hpctf plot`` marks them): each start after the first
    at the step it resumed from, named with how the start before it ended; a prune at the
    step the pruner stopped the run."""
    from hpctf.core.run.history import EndReason
    from hpctf.login.watching.plot import RESTART_LABELS

    marks = []
    for number, (before, start) in enumerate(itertools.pairwise(starts), 2):
        reason = before["reason"]
        why = RESTART_LABELS.get(reason, str(reason)) if reason else "killed"
        marks.append(Mark(step=start["from_step"], kind="restart",
                          text=f"restart {number} (after {why})"))  # fmt: skip
    last = starts[-1] if starts else None
    if last and last["reason"] == EndReason.PRUNED and last["end_step"] is not None:
        marks.append(Mark(step=last["end_step"], kind="pruned", text="pruned"))
    return marks


def config_document(config: Any) -> dict[str, Any]:
    """The resolved config as JSON (the experiment, its site's name): every secret value its
    ``***`` (:mod:`hpctf.core.secrets`: a secret is a type that dumps as ``***``)."""
    from hpctf.core.secrets import is_secret

    def shown(value: Any) -> Any:
        if is_secret(value):
            return "***"
        if isinstance(value, dict):
            return {k: shown(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [shown(v) for v in value]
        return value

    data = shown(config.experiment.model_dump(mode="python"))
    return {"site": config.site.name, "experiment": json.loads(json.dumps(data, default=str))}


def logged_ranks(logs: Path) -> list[int]:
    """The ranks that have a log in ``logs`` (``rank-N.log``), in order."""
    try:
        names = os.listdir(logs)
    except OSError:
        return []
    ranks = []
    for name in names:
        number = name.removeprefix("rank-").removesuffix(".log")
        if name.startswith("rank-") and name.endswith(".log") and number.isdigit():
            ranks.append(int(number))
    return sorted(ranks)
