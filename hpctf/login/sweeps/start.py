"""``hpctf sweep``, and starting a sweep for it and :func:`hpctf.sweep` alike: its points planned
and resolved (:func:`plan`), then its sweep directory, a run directory per point and the
job array(s) (:func:`start_sweep`). The array's parts are in
:mod:`hpctf.login.sweeps.sweep_commands`.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.core.run.snapshot import CODE_DIR
from hpctf.core.scheduler.launcher import is_slurm, launcher_for
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.launchers import CLI, Caller
from hpctf.login.submitting.pipeline import (
    create_points,
    warn_if_nodes_shared,
    warn_if_writable_by_others,
    warn_left_out,
)
from hpctf.login.sweeps import sweep_commands as commands
from hpctf.login.sweeps.plan import (
    DEFAULT_MAX_POINTS,
    Point,
    parse_axes,
    plan_points,
    run_names,
)
from hpctf.login.sweeps.points import check as points_checked
from hpctf.login.sweeps.points import point_scripts
from hpctf.login.sweeps.search_start import has_search, start_search
from hpctf.login.sweeps.sweep_dir import SweepDir, array_size_limit, claim_sweep_dir
from hpctf.login.sweeps.sweep_record import SweepPoint, SweepRecord


@dataclass(frozen=True)
class Plan:
    """A sweep's points, the first point's resolved config, and every point's when they were
    kept (a dry run keeps none: each one is checked and dropped)."""

    points: list[Point]
    base: ResolvedConfig
    configs: list[ResolvedConfig]


def plan(
    experiment: Path,
    grids: Sequence[str],
    ranges: Sequence[str],
    draws: int | None,
    seed: int,
    max_points: int,
    site_name: str | None,
    overrides: Sequence[str],
    keep: bool = True,
) -> Plan:
    """The points of a sweep (``--grid``/``--range`` texts), each resolved and checked as
    ``hpctf submit`` checks one (every problem in one UserError), and its script checked to be
    the first point's. Writes nothing. ``keep``: keep each point's config (a sweep to
    create); else each is dropped once checked."""
    parsed_grids, parsed_ranges = parse_axes(grids, ranges)
    fixed = [item.partition("=")[0] for item in overrides]
    points = plan_points(parsed_grids, parsed_ranges, draws, seed, max_points, fixed)
    base, configs = points_checked(experiment, site_name, overrides, points, keep)
    return Plan(points, base, configs)


def start_sweep(
    experiment: Path,
    points: Sequence[Point],
    configs: Sequence[ResolvedConfig],
    spec: SweepRecord,
    caller: Caller = CLI,
) -> tuple[SweepDir, int]:
    """``hpctf sweep`` and :func:`hpctf.sweep`: the sweep directory, a run directory per
    point, and the job array(s) submitted (a local site: every point run, one after
    another). ``spec``: the sweep's grid, range, random, seed, set and max_running, as
    sweep.json keeps them. Returns the sweep and the status (a local site's first failure,
    else 0)."""
    base = configs[0]
    slurm_site = launcher_for(base.site).slurm
    limit = array_size_limit(base, dry_run=False)[0] if slurm_site else 0
    record = create_sweep(experiment, points, configs, spec)
    click.echo(f"sweep directory: {record.path}")
    if not slurm_site:
        return record, commands._run_locally(record, range(len(points)), caller)
    commands.submit_arrays(record, base, range(len(points)), limit)
    return record, 0


def create_sweep(
    experiment: Path, points: Sequence[Point], configs: Sequence[ResolvedConfig], spec: SweepRecord
) -> SweepDir:
    """The sweep directory: sweep.json (``spec`` with the sweep's name, time, experiment, site
    and points), the code once (``code/``, shared by every point) and a run directory per point
    holding only what is its own (its config, script and journal). Nothing is left behind when
    it fails."""
    base = configs[0]
    sweep_path = claim_sweep_dir(lambda: commands._sweep_path(base))  # a sweep of the same second
    try:
        warn_if_writable_by_others(sweep_path)
        run_dirs = [sweep_path / name for name in run_names(base.experiment.name, points)]
        record = SweepDir(
            sweep_path,
            replace(
                spec,
                name=base.experiment.name,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                experiment=str(experiment.resolve()),
                site=base.site.name,
                scheduler=base.site.scheduler,
                points=[
                    SweepPoint(p.index, dict(p.values), str(d))
                    for p, d in zip(points, run_dirs, strict=True)
                ],
            ),
        )
        scripts = point_scripts(configs, run_dirs, sweep_path / CODE_DIR)  # rendered once
        create_points(configs, run_dirs, sweep_path / CODE_DIR, scripts)
        record.write()
    except BaseException:
        shutil.rmtree(sweep_path, ignore_errors=True)  # nothing was submitted from it yet
        raise
    warn_if_nodes_shared(base)
    warn_left_out(run_dirs[0])
    return record


@click.command()
@click.argument("experiment", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--grid",
    "grids",
    multiple=True,
    metavar="KEY=V1,V2,...",
    help="Values of one experiment key (repeatable: the points are the product).",
)
@click.option(
    "--random",
    "draws",
    type=click.IntRange(min=1),
    metavar="N",
    help="Draw N points from the --range keys (times the grid's points).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draws.")
@click.option(
    "--range",
    "ranges",
    multiple=True,
    metavar="KEY=LO:HI[:log]",
    help="A range to draw from (uniform, or log-uniform with :log).",
)
@click.option(
    "--max-running",
    type=click.IntRange(min=1),
    metavar="K",
    help="Run at most K points at once (the array's %K).",
)
@click.option(
    "--max-points",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_POINTS,
    show_default=True,
    help="Refuse sweeps with more points than this.",
)
@click.option("--site", "site_name", metavar="NAME", help="Site config name or path.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override an experiment key for every point (repeatable).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the points and the array script(s); write and submit nothing.",
)
def sweep(
    experiment: Path,
    grids: tuple[str, ...],
    draws: int | None,
    seed: int,
    ranges: tuple[str, ...],
    max_running: int | None,
    max_points: int,
    site_name: str | None,
    overrides: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Run EXPERIMENT once per point of a grid (or of random draws): each point a run
    directory of its own, all of them one Slurm job array (local sites: one after another).
    An experiment with a ``sweep:`` section is searched instead: its trials, asked of an
    Optuna study, run on one job array of agents (Slurm sites)."""
    grid = (grids, ranges, draws, seed, max_points, site_name, overrides)
    if dry_run and not has_search(experiment):
        show_dry_run(plan(experiment, *grid, keep=False), max_running)
        return
    if dry_run:
        refuse_grid_flags(experiment, grids, ranges, draws, max_running)
        start_search(experiment, site_name, overrides, dry_run=True)
        return
    record, status = start_any(experiment, *grid, max_running)
    if not is_slurm(record.record.scheduler):
        sys.exit(status)
    click.echo(f"status: hpctf status {record.path}")


def start_any(
    experiment: Path,
    grids: Sequence[str],
    ranges: Sequence[str],
    draws: int | None,
    seed: int,
    max_points: int,
    site_name: str | None,
    overrides: Sequence[str],
    max_running: int | None,
    caller: Caller = CLI,
) -> tuple[SweepDir, int]:
    """``hpctf sweep`` and :func:`hpctf.sweep`, the one way either starts: a search when the
    experiment has a ``sweep:`` section, else the grid's (or draws') points; the sweep
    directory and the exit status (a local sweep's points', else 0)."""
    if has_search(experiment):
        refuse_grid_flags(experiment, grids, ranges, draws, max_running)
        record = start_search(experiment, site_name, overrides, dry_run=False)
        assert record is not None  # only a dry run makes none
        return record, 0
    planned = plan(experiment, grids, ranges, draws, seed, max_points, site_name, overrides)
    spec = SweepRecord(
        grid=list(grids),
        range=list(ranges),
        random=draws,
        seed=seed,
        overrides=list(overrides),
        max_running=max_running,
    )
    return start_sweep(experiment, planned.points, planned.configs, spec, caller)


def refuse_grid_flags(
    experiment: Path,
    grids: Sequence[str],
    ranges: Sequence[str],
    draws: int | None,
    max_running: int | None,
) -> None:
    """A UserError when a search's experiment is also given a grid's flags (or arguments)."""
    flags = {"--grid": grids, "--range": ranges, "--random": draws, "--max-running": max_running}
    if given := [flag for flag, value in flags.items() if value]:
        raise UserError(
            f"{', '.join(given)}: {experiment} has a sweep: section (a search); give its "
            "space there (sweep.parameters, sweep.parallel), or drop the section to sweep "
            "a grid"
        )


def show_dry_run(planned: Plan, max_running: int | None) -> None:
    """What ``hpctf sweep --dry-run`` prints: each point and its run directory's name, and each
    job array's script, written as they are made (100,000 points are 16 MB of text)."""
    base, points = planned.base, planned.points
    sweep_path = commands._sweep_path(base)
    names = run_names(base.experiment.name, points)
    click.echo(f"# sweep {sweep_path} ({len(points)} points; nothing written)")
    for start in range(0, len(points), 1000):
        lines = [
            f"# point {point.index}: {point.label()} -> {names[point.index]}\n"
            for point in points[start : start + 1000]
        ]
        click.echo("".join(lines), nl=False)
    if launcher_for(base.site).slurm:
        limit, source = array_size_limit(base, dry_run=True)
        run_dirs = [f"{sweep_path}/{name}" for name in names]
        every = range(len(points))
        scripts = commands.array_scripts(base, sweep_path, run_dirs, every, limit, max_running)
        arrays = math.ceil(len(points) / limit)
        click.echo(f"# {arrays} job array(s) of at most {limit} tasks ({source})")
        for number, (indices, script) in enumerate(scripts):
            click.echo(f"# ----- array-{number}.sbatch: points {indices[0]}-{indices[-1]}")
            click.echo(script, nl=False)
    click.echo("# dry run: nothing written, nothing submitted", err=True)
