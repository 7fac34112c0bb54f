"""The hours each run cost (:mod:`hpctf.core.run.hours`) for ``status`` and ``runs``: ONE
``sacct`` call for every job of every run shown (:func:`hpctf.core.scheduler.slurm_queries.
sacct_usage`), none when no run is a Slurm run. A run of a local site, or of a cluster without
accounting, is :data:`~hpctf.core.run.hours.UNACCOUNTED`; sacct failing is one line on
stderr and every run unaccounted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import click

from hpctf.core.run.hours import Hours, parse_usage, run_hours
from hpctf.core.run.listing import RunFacts
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.scheduler.slurm_queries import sacct_usage


def hours_of(
    runs: Sequence[RunFacts], env: Mapping[str, str] | None = None
) -> dict[str, Hours | None]:
    """Each run's hours by its path; None for a run without accounting."""
    slurm_runs = [run for run in runs if run.slurm and run.state.jobs]
    hours: dict[str, Hours | None] = {run.path: None for run in runs}
    if not slurm_runs:
        return hours
    ids = [job for run in slurm_runs for job in run.state.jobs]
    try:
        text = sacct_usage(ids, env)
    except SlurmFailure as exc:
        click.echo(f"hpctf: hours unknown: {exc}", err=True)
        return hours
    if text is None:
        return hours
    usage = parse_usage(text)
    for run in slurm_runs:
        hours[run.path] = run_hours(run.state.jobs, usage)
    return hours
