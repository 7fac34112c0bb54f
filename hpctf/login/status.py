"""``hpctf status`` and ``hpctf runs``: one run in full, many as a table, ``--json`` for
scripts. At most one squeue and one sacct call per command (:mod:`hpctf.login.slurm_view`);
``runs`` asks Slurm nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from hpctf.login.run_report import describe_run, format_table, run_document, status_table
from hpctf.login.runs import (
    ACTIVE_RUN_STATES,
    METRICS_TAIL_BYTES,
    Run,
    find_runs,
    metric_records,
    runs_root_for,
)
from hpctf.login.slurm_view import (
    job_states,
)
from hpctf.login.sweep_commands import sweep_status
from hpctf.login.sweep_dir import find_sweeps, is_sweep_dir, summary

# Runs `hpctf status` shows without RUN arguments: those still queued or running, and those
# whose journal moved within this many days (--all: every run).
RECENT_DAYS = 7

SPARK = "▁▂▃▄▅▆▇█"

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
    run_dirs: Sequence[Path], root: Path | None, site_name: str | None, every: bool
) -> list[Run]:
    if run_dirs:
        return [Run.read(path) for path in run_dirs]
    where = runs_root_for(root, site_name, os.environ)
    runs = find_runs(where)
    if not every:
        cutoff = time.time() - RECENT_DAYS * 86400
        runs = [
            r for r in runs if r.state.state in ACTIVE_RUN_STATES or r.last_event_time >= cutoff
        ]
    if not runs:
        click.echo(f"no {'' if every else 'recent '}runs under {where}", err=True)
    return runs


@click.command()
@_runs_option
@_json_option
@click.option("--all", "every", is_flag=True, help="Every run, not only the recent ones.")
@_root_option
@_where_site_option
def status(
    run_dirs: tuple[Path, ...], as_json: bool, every: bool, root: Path | None, site_name: str | None
) -> None:
    """Show runs: one RUN in full (state and why, budgets, code, Slurm, progress, each job and
    start), several as a table; without RUN, the recent runs under the runs root (--all:
    every run). At most one squeue and one sacct call, however many runs. A sweep
    directory: one line per point."""
    if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):
        sweep_status(run_dirs[0], as_json)
        return
    runs = _selected_runs(run_dirs, root, site_name, every)
    single = len(run_dirs) == 1
    view = job_states(runs, all_jobs=single)
    now = time.time()
    documents = [run_document(run, view, now, full=single) for run in runs]
    if as_json:
        click.echo(
            json.dumps(
                {"runs": documents, "notes": [view.problem] if view.problem else []}, indent=2
            )
        )
    elif single:
        click.echo(describe_run(runs[0], documents[0]), nl=False)
    elif documents:
        click.echo(status_table(documents), nl=False)


@click.command()
@_json_option
@_root_option
@_where_site_option
def runs(as_json: bool, root: Path | None, site_name: str | None) -> None:
    """List the runs under the runs root, newest first: name, created, site, state, last step.

    From the run directories alone (no Slurm call): the state is hpctf's, from each journal.
    """
    where = runs_root_for(root, site_name, os.environ)
    found = find_runs(where)
    documents: list[dict[str, Any]] = []
    for run in found:
        records = metric_records(run.run.metrics, METRICS_TAIL_BYTES)
        documents.append(
            {
                "run": run.name,
                "path": str(run.run.path),
                "created": run.created,
                "site": run.config.site.name,
                "state": run.state.state,
                "last_step": max((int(r["step"]) for r in records), default=None),
            }
        )
    sweeps = []
    for record in find_sweeps(where):
        points = [{"state": run.state.state} for run in record.runs()]
        sweeps.append(
            {
                "sweep": record.path.name,
                "path": str(record.path),
                "created": record.data.get("created"),
                "site": record.data.get("site"),
                "points": len(points),
                "states": summary(points),
            }
        )
    if as_json:
        click.echo(json.dumps({"root": str(where), "runs": documents, "sweeps": sweeps}, indent=2))
        return
    if not documents and not sweeps:
        click.echo(f"no runs under {where}", err=True)
        return
    rows = [
        (d["run"], d["created"], d["site"], d["state"], str(d["last_step"] or "-"))
        for d in documents
    ]
    if rows:
        click.echo(format_table(("RUN", "CREATED", "SITE", "STATE", "LAST STEP"), rows), nl=False)
    if sweeps:
        sweep_rows = [
            (str(s["sweep"]), str(s["created"]), str(s["site"]), str(s["states"])) for s in sweeps
        ]
        click.echo(format_table(("SWEEP", "CREATED", "SITE", "POINTS"), sweep_rows), nl=False)


COMMANDS = (status, runs)
