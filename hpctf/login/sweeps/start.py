"""Starting a sweep, for ``hpctf sweep`` and :func:`hpctf.sweep` alike: its points planned
and resolved (:func:`plan_sweep`), then its sweep directory, a run directory per point and the
job array(s) (:func:`start_sweep`). The array's parts are in :mod:`hpctf.login.sweeps.commands`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from hpctf.core.run.rundir import RunDir, create_run_dir
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.launch import warn_if_writable_by_others
from hpctf.login.submitting.render import render
from hpctf.login.sweeps import commands  # the array's parts (looked up at each call)
from hpctf.login.sweeps.plan import Point, parse_axes, plan_points, run_names
from hpctf.login.sweeps.sweep_dir import SweepDir, claim_sweep_dir


def plan_sweep(
    experiment: Path, grids: Sequence[str], ranges: Sequence[str], draws: int | None, seed: int,
    max_points: int, site_name: str | None, overrides: Sequence[str],
) -> tuple[list[Point], list[ResolvedConfig]]:  # fmt: skip
    """The points of a sweep (``--grid``/``--range`` texts) and each one's resolved config, or
    one UserError listing every problem. Writes nothing."""
    parsed_grids, parsed_ranges = parse_axes(grids, ranges)
    fixed = [item.partition("=")[0] for item in overrides]
    points = plan_points(parsed_grids, parsed_ranges, draws, seed, max_points, fixed)
    configs = commands.resolve_points(experiment, site_name, overrides, points)
    commands.check_one_script(points, configs)
    return points, configs


def start_sweep(
    experiment: Path, points: Sequence[Point], configs: Sequence[ResolvedConfig],
    spec: dict[str, Any],
) -> tuple[SweepDir, int]:  # fmt: skip
    """``hpctf sweep`` and :func:`hpctf.sweep`: the sweep directory, a run directory per
    point, and the job array(s) submitted (a local site: every point run, one after
    another). ``spec``: grid, range, random, seed, set and max_running, as sweep.json keeps
    them. Returns the sweep and the status (a local site's first failure, else 0)."""
    base = configs[0]
    slurm_site = launcher_for(base.site).slurm
    limit = commands.array_size_limit(base, dry_run=False)[0] if slurm_site else 0
    sweep_path = claim_sweep_dir(lambda: commands._sweep_path(base))  # a sweep of the same second
    run_dirs = [sweep_path / name for name in run_names(base.experiment.name, points)]
    warn_if_writable_by_others(sweep_path)
    record = SweepDir(sweep_path, {
        "name": base.experiment.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "experiment": str(experiment.resolve()), "site": base.site.name,
        "scheduler": base.site.scheduler, **spec,
        "points": [{"index": p.index, "values": dict(p.values), "run_dir": str(d)}
                   for p, d in zip(points, run_dirs, strict=True)],
        "arrays": [],
    })  # fmt: skip
    for config, path in zip(configs, run_dirs, strict=True):
        create_run_dir(RunDir(path), config, render(config, path))
    record.write()
    click.echo(f"sweep directory: {sweep_path}")
    if not slurm_site:
        return record, commands._run_locally(record, range(len(points)))
    commands.submit_arrays(record, base, range(len(points)), limit)
    return record, 0
