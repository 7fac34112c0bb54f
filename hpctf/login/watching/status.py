"""``hpctf status`` and ``hpctf runs``: one run in full, many as a table, ``--json`` for
scripts. At most one squeue and one sacct call per command (:mod:`hpctf.login.reading.slurm_view`);
``runs`` asks Slurm nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import UserError
from hpctf.core.printable import printable as _printable
from hpctf.core.run.listing import RunFacts
from hpctf.core.secrets import redact
from hpctf.login.reading.run_report import (
    describe_run,
    format_table,
    full_document,
    run_document,
    status_table,
)
from hpctf.login.reading.runs import (
    ACTIVE_RUN_STATES,
    Run,
    every_runs_root,
    find_runs,
    runs_root_for,
)
from hpctf.login.reading.slurm_view import (
    job_states,
)
from hpctf.login.sweeps.commands import sweep_status
from hpctf.login.sweeps.sweep_dir import (
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
    root: Path | None, site_name: str | None, every: bool
) -> tuple[list[RunFacts], list[dict[str, Any]]]:
    """The runs to show without RUN arguments, and the sweeps (one document each): with
    --root or --site, under that runs root; else under every runs root hpctf knows of,
    $HPCTF_RUNS_ROOT's and each site's."""
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
        found.update((run.path, run) for run in find_runs(where) if shown(run))
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
@click.option("--all", "every", is_flag=True, help="Every run, not only the recent ones.")
@_root_option
@_where_site_option
@click.option(
    "--sort",
    metavar="METRIC",
    help="A sweep's points best first by eval.NAME (last evaluation), best_eval.NAME or loss.",
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
    directory: one line per point."""
    if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):
        sweep_status(run_dirs[0], as_json, sort, top)
        return
    if sort or top:
        raise UserError("--sort and --top rank the points of one sweep: hpctf status SWEEP_DIR")
    single = len(run_dirs) == 1
    read = [Run.read(path) for path in run_dirs]
    sweeps: list[dict[str, Any]] = []
    if read:
        runs = [run.facts for run in read]
    else:
        runs, sweeps = _selected_runs(root, site_name, every)
    view = job_states(runs, all_jobs=single)
    now = time.time()
    if single:
        documents = [full_document(read[0], view, now)]
    else:
        documents = [run_document(run, view, now) for run in runs]
    if as_json:
        notes = [view.problem] if view.problem else []
        click.echo(
            redact(json.dumps({"runs": documents, "sweeps": sweeps, "notes": notes}, indent=2))
        )
    elif single:
        click.echo(for_terminal(describe_run(read[0], documents[0])), nl=False)
    elif documents or sweeps:
        click.echo(for_terminal(status_table(documents, sweeps)), nl=False)


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
        documents.append(
            {
                "run": run.name,
                "path": run.path,
                "created": run.created,
                "site": run.site,
                "state": run.state.state,
                "last_step": run.last_logged_step,
            }
        )
    sweeps = []
    for record in find_sweeps(where):
        points = [{"state": run.state.state} for run in record.facts()]
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
        click.echo(
            redact(json.dumps({"root": str(where), "runs": documents, "sweeps": sweeps}, indent=2))
        )
        return
    if not documents and not sweeps:
        click.echo(f"no runs under {where}", err=True)
        return
    rows = [
        (d["run"], d["created"], d["site"], d["state"], str(d["last_step"] or "-"))
        for d in documents
    ]
    if rows:
        click.echo(
            for_terminal(format_table(("RUN", "CREATED", "SITE", "STATE", "LAST STEP"), rows)),
            nl=False,
        )
    if sweeps:
        sweep_rows = [
            (str(s["sweep"]), str(s["created"]), str(s["site"]), str(s["states"])) for s in sweeps
        ]
        click.echo(
            for_terminal(format_table(("SWEEP", "CREATED", "SITE", "POINTS"), sweep_rows)), nl=False
        )


COMMANDS = (status, runs)
