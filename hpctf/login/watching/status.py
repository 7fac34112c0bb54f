"""``hpctf status`` and ``hpctf runs``: one run in full, many as a table, ``--json`` for
scripts. At most one squeue and one sacct call per command for the jobs' states
(:mod:`hpctf.login.reading.slurm_view`); ``status RUN`` and ``runs`` make one sacct call
more, for the hours (:mod:`hpctf.login.reading.hours_view`), the one Slurm call of ``runs``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import UserError
from hpctf.core.printable import printable as _printable
from hpctf.core.run.hours import Hours, hours_json, hours_text, summed
from hpctf.core.run.listing import RunFacts
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.scheduler.slurm import SlurmError
from hpctf.core.scheduler.slurm_queries import commented_jobs
from hpctf.core.secrets import redact
from hpctf.login.reading.hours_view import hours_of
from hpctf.login.reading.run_report import (
    describe_run,
    format_table,
    full_document,
    run_document,
    status_table,
)
from hpctf.login.reading.runs import (
    ACTIVE_RUN_STATES,
    READ_AT_MOST,
    RunRecord,
    every_runs_root,
    find_runs,
    runs_root_for,
    scan_runs,
    unread_note,
)
from hpctf.login.reading.slurm_view import SlurmView, job_states
from hpctf.login.sweeps.sweep_commands import sweep_status
from hpctf.login.sweeps.sweep_dir import (
    SweepDir,
    find_sweeps,
    is_sweep_dir,
    summary,
    sweep_document,
)

# Runs `hpctf status` shows without RUN arguments: those still queued or running, and those
# whose journal moved within this many days (--all: every run).
RECENT_DAYS = 7

_runs_option = click.argument(
    "run_dirs", nargs=-1, type=click.Path(path_type=Path, file_okay=False), metavar="[RUN]..."
)
_root_option = click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Look for runs here (default: $HPCTF_RUNS_ROOT, else the site's runs_root).",
)
_where_site_option = click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="Whose runs_root to look in (default: $HPCTF_SITE, else local).",
)
_json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document.")


def _selected_runs(
    root: Path | None, site_name: str | None, every: bool, lazy: bool = False
) -> tuple[list[RunFacts], list[dict[str, Any]]]:
    """The runs to show without RUN arguments, and the sweeps (one document each): with
    --root or --site, under that runs root; else under every runs root hpctf knows of,
    $HPCTF_RUNS_ROOT's and each site's. ``lazy``: of the runs the index lacks, only the
    newest read (:func:`~hpctf.login.reading.runs.scan_runs`), the rest said on stderr."""
    if root is not None or site_name:
        roots = [runs_root_for(root, site_name, os.environ)]
    else:
        roots = every_runs_root(os.environ)
    cutoff = time.time() - RECENT_DAYS * 86400

    def shown(run: RunFacts) -> bool:
        return every or run.state.state in ACTIVE_RUN_STATES or run.last_event_time >= cutoff

    found: dict[str, RunFacts] = {}
    sweeps = []
    for where in roots:
        scan = scan_runs(where, READ_AT_MOST if lazy else None)
        found.update((run.path, run) for run in scan.runs if shown(run))
        if scan.unread:
            click.echo(unread_note(scan), err=True)
        for sweep in find_sweeps(where):
            points = sweep.facts()
            if every or any(shown(point) for point in points):
                sweeps.append(sweep_document(sweep, points))
    runs = sorted(found.values(), key=lambda r: r.created, reverse=True)
    if not runs and not sweeps:
        places = ", ".join(str(where) for where in roots)
        click.echo(f"no {'' if every else 'recent '}runs under {places}", err=True)
    return runs, sweeps


def for_terminal(text: str) -> str:
    """Run data as it may reach a terminal: control characters escaped, URI passwords
    redacted (:mod:`hpctf.core.printable`, :mod:`hpctf.core.secrets`)."""
    return _printable(redact(text))


@click.command()
@_runs_option
@_json_option
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every run, not only the recent ones, each read now if the index lacks it.",
)
@_root_option
@_where_site_option
@click.option(
    "--sort",
    metavar="METRIC",
    help="A sweep's points best first by eval.NAME (last evaluation), best_eval.NAME or loss; "
    "NAME:min or NAME:max says which way (default: lowest first for loss, error, mae, ...).",
)
@click.option("--top", type=click.IntRange(min=1), metavar="K", help="With --sort: the best K.")
def status(
    run_dirs: tuple[Path, ...], as_json: bool, every: bool, root: Path | None,
    site_name: str | None, sort: str | None, top: int | None,
) -> None:  # fmt: skip
    """Show runs: one RUN in full (state and why, budgets, code, Slurm, progress, each job and
    start), several as a table; without RUN, the recent runs and sweeps under every runs
    root hpctf knows of ($HPCTF_RUNS_ROOT's and each site's; --root or --site: one), a sweep
    as one row (--all: every run). At most one squeue and one sacct call, however many runs. A sweep
    directory: one line per point.

    Runs the runs root's index has not seen (a first listing): the 200 whose journals changed
    last are read now, the others counted on stderr and read into the index in the
    background, for the next listing; --all and --json read every run now."""
    if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):
        sweep_status(run_dirs[0], as_json, sort, top)
        return
    if sort or top:
        raise UserError("--sort and --top rank the points of one sweep: hpctf status SWEEP_DIR")
    single = len(run_dirs) == 1
    read = [RunRecord.read(path) for path in run_dirs]
    sweeps: list[dict[str, Any]] = []
    if read:
        # One run in full, with one sacct call more for its hours; a table of many keeps to one
        # squeue call.
        documents, view, hours = run_documents(read, whole=single, with_hours=single)
    else:
        runs, sweeps = _selected_runs(root, site_name, every, lazy=not (every or as_json))
        view = job_states(runs, all_jobs=False)
        now = time.time()
        documents = [run_document(run, view, now) for run in runs]
    unrecorded = _unrecorded_jobs(read[0]) if single else ""
    if as_json:
        notes = [n for n in (view.problem, unrecorded) if n]
        click.echo(
            redact(json.dumps({"runs": documents, "sweeps": sweeps, "notes": notes}, indent=2))
        )
    elif single:
        click.echo(for_terminal(describe_run(read[0], documents[0])), nl=False)
        assert hours is not None  # asked for with the one run
        click.echo(f"hours: {hours_text(hours[read[0].facts.path])}")
        if unrecorded:
            click.echo(unrecorded)
    elif documents or sweeps:
        click.echo(for_terminal(status_table(documents, sweeps)), nl=False)


def run_documents(
    read: Sequence[RunRecord], whole: bool, with_hours: bool, watching: bool = False
) -> tuple[list[dict[str, Any]], SlurmView, dict[str, Hours | None] | None]:
    """The ``status --json`` documents of the runs ``read``: ``whole`` (every job of each,
    its losses; :func:`full_document`) or as a listing's rows; one squeue call for all, one
    sacct call more ``with_hours`` (each document's ``hours``). Also the view of Slurm they
    were made with and the hours. ``hpctf status RUN...`` and the typed call's status
    (:func:`hpctf.login.calls.table.status`); ``watching``: a watcher's look
    (:func:`hpctf.login.reading.slurm_view.job_states`)."""
    runs = [record.facts for record in read]
    view = job_states(runs, all_jobs=whole, watching=watching)
    now = time.time()
    documents = [
        full_document(record, view, now) if whole else run_document(record.facts, view, now)
        for record in read
    ]
    hours = hours_of(runs) if with_hours else None
    if hours is not None:
        for document, run in zip(documents, runs, strict=True):
            document["hours"] = hours_json(hours[run.path])
    return documents, view, hours


def _unrecorded_jobs(run: RunRecord) -> str:
    """A note naming the jobs Slurm holds for ``run`` that its journal does not know (a submit
    stopped while sbatch ran), when it has no open job; "" otherwise. Status only reads: the
    next cancel or resubmit records them."""
    if not run.slurm or run.history.open_jobs or run.run.done.exists():
        return ""
    try:
        found = commented_jobs(slurm_comment(run.run.path))
    except SlurmError:
        return ""  # what Slurm could not say is said by the job states' own note
    known = {job.job_id for job in run.history.jobs}
    if not (jobs := [j for j in found if j not in known]):
        return ""
    return (
        f"note: Slurm holds job {', '.join(jobs)} of this run, which its journal does not know "
        f"(a submit stopped while sbatch ran): hpctf cancel {run.run.path} stops it, "
        "hpctf resubmit records it"
    )


@click.command()
@_json_option
@_root_option
@_where_site_option
def runs(as_json: bool, root: Path | None, site_name: str | None) -> None:
    """List the runs under the runs root, newest first: name, created, site, state, last step,
    node-hours and GPU-hours (a sweep: summed over its points; "unaccounted" without Slurm's
    accounting).

    The state is hpctf's, from each journal; one sacct call for the hours of every Slurm run.
    """
    where = runs_root_for(root, site_name, os.environ)
    found = find_runs(where)
    sweep_records = find_sweeps(where)
    sweep_points = [record.facts() for record in sweep_records]
    hours = hours_of([*found, *(run for points in sweep_points for run in points)])
    documents = [_run_row(run, hours[run.path]) for run in found]
    sweeps = [
        _sweep_row(record, points, summed(hours[run.path] for run in points))
        for record, points in zip(sweep_records, sweep_points, strict=True)
    ]
    if as_json:
        click.echo(
            redact(json.dumps({"root": str(where), "runs": documents, "sweeps": sweeps}, indent=2))
        )
    elif not documents and not sweeps:
        click.echo(f"no runs under {where}", err=True)
    else:
        _print_runs(documents, sweeps)


def _run_row(run: RunFacts, hours: Hours | None) -> dict[str, Any]:
    """``hpctf runs``' document of one run."""
    return {
        "run": run.name,
        "path": run.path,
        "created": run.created,
        "site": run.site,
        "state": run.state.state,
        "last_step": run.last_logged_step,
        "hours": hours_json(hours),
    }


def _sweep_row(record: SweepDir, points: Sequence[RunFacts], hours: Hours | None) -> dict[str, Any]:
    """``hpctf runs``' document of one sweep: its points' states and summed hours."""
    return {
        "sweep": record.path.name,
        "path": str(record.path),
        "created": record.data.get("created"),
        "site": record.data.get("site"),
        "points": len(points),
        "states": summary([{"state": run.state.state} for run in points]),
        "hours": hours_json(hours),
    }


def _print_runs(documents: list[dict[str, Any]], sweeps: list[dict[str, Any]]) -> None:
    """``hpctf runs``' two tables: the runs, then the sweeps."""
    rows = [
        (
            d["run"],
            d["created"],
            d["site"],
            d["state"],
            str(d["last_step"] or "-"),
            *hours_cells(d["hours"]),
        )
        for d in documents
    ]
    if rows:
        header = ("RUN", "CREATED", "SITE", "STATE", "LAST STEP", "NODE-H", "GPU-H")
        click.echo(for_terminal(format_table(header, rows)), nl=False)
    if sweeps:
        sweep_rows = [
            (
                str(s["sweep"]),
                str(s["created"]),
                str(s["site"]),
                str(s["states"]),
                *hours_cells(s["hours"]),
            )
            for s in sweeps
        ]
        sweep_header = ("SWEEP", "CREATED", "SITE", "POINTS", "NODE-H", "GPU-H")
        click.echo(for_terminal(format_table(sweep_header, sweep_rows)), nl=False)


def hours_cells(hours: dict[str, Any] | str) -> tuple[str, str]:
    """A table's NODE-H and GPU-H cells: two decimals, or the one word of a run without
    accounting."""
    if isinstance(hours, str):
        return hours, "-"
    return f"{hours['node_hours']:.2f}", f"{hours['gpu_hours']:.2f}"


COMMANDS = (status, runs)
