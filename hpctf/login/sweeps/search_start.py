"""``hpctf sweep`` of an experiment with a ``sweep:`` search: one job array of agents.

Planned like a submit (the experiment resolved and validated once, every parameter key checked
against it: :mod:`hpctf.login.resolving.search_keys`), then the sweep directory
(:func:`hpctf.login.sweeps.sweep_dir.claim_sweep_dir`), the code snapshot once for every trial
(``code/<digest>/``, as a grid's points share theirs), the base config frozen in
``search/``, the Optuna study (``study.journal``), and one job array of
``min(parallel, trials, MaxArraySize)`` tasks, each an agent that runs trials until the budget
is spent (:mod:`hpctf.batch.search_agent`; layout: :mod:`hpctf.core.search.search_dir`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.core.run.rundir import create_shared_base
from hpctf.core.run.snapshot import CODE_DIR
from hpctf.core.safe_files import write_atomic
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.search.search_dir import SEARCH_DIR, STUDY_NAME
from hpctf.core.search.study import JOURNAL_FILE, create_study, grid_size, trial_budget
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.search import Search
from hpctf.login.resolving.loader import load_config
from hpctf.login.resolving.readings import Readings
from hpctf.login.resolving.search_keys import check_search_keys
from hpctf.login.submitting.launchers import slurm_jobs
from hpctf.login.submitting.pipeline import (
    warn_if_nodes_shared,
    warn_if_writable_by_others,
    warn_left_out,
)
from hpctf.login.submitting.render import ArrayScript, render
from hpctf.login.sweeps.sweep_dir import (
    SweepDir,
    array_size_limit,
    claim_sweep_dir,
    new_sweep_path,
)
from hpctf.login.sweeps.sweep_record import SweepArray, SweepRecord


@dataclass(frozen=True)
class SearchPlan:
    """A search, resolved: the base config, its search, the trial budget, the array's size."""

    config: ResolvedConfig
    search: Search
    budget: int
    tasks: int
    limit_source: str


def has_search(experiment: Path) -> bool:
    """Whether the experiment file has a ``sweep:`` section (read as YAML, bounded as every
    read of it; a file that cannot be read says so when it is resolved)."""
    from hpctf.core.settings.sources import load_yaml

    try:
        data, _ = load_yaml(experiment)
    except (UserError, OSError):
        return False
    return isinstance(data, dict) and data.get("sweep") is not None


def plan_search(
    experiment: Path, site_name: str | None, overrides: Sequence[str], dry_run: bool
) -> SearchPlan:
    """The search resolved and checked; writes nothing. A local site is refused: the trials
    of a search are the tasks of a Slurm job array."""
    readings = Readings()
    config = load_config(experiment, site_name, overrides, os.environ, readings=readings).config
    search = config.experiment.sweep
    if search is None:
        raise UserError(f"{experiment}: no sweep: section to search")
    check_search_keys(experiment, site_name, overrides, search, os.environ, readings)
    if not launcher_for(config.site).slurm:
        raise UserError(
            f"site {config.site.name} runs no Slurm: a search's trials are the tasks of a "
            "Slurm job array; give a Slurm site (--site), or sweep a grid (--grid) here"
        )
    budget = trial_budget(search)
    limit, source = array_size_limit(config, dry_run)
    return SearchPlan(config, search, budget, min(search.parallel, budget, limit), source)


def array_script(plan: SearchPlan, sweep_path: Path) -> str:
    """The array's script: ``plan.tasks`` agents (``--array=0-N``; a task the search no longer
    needs ends at once)."""
    spec = "0" if plan.tasks == 1 else f"0-{plan.tasks - 1}"
    array = ArrayScript(spec, sweep_path / "logs", (), search=sweep_path)
    return render(plan.config, sweep_path, array)


def describe(plan: SearchPlan) -> str:
    search = plan.search
    grid = f" (the grid has {grid_size(search)} points)" if search.sampler == "grid" else ""
    return (
        f"{plan.budget} trial(s){grid}, {search.sampler} sampler, pruner {search.pruner.kind}, "
        f"{search.objective.direction} {search.objective.metric}; one job array of "
        f"{plan.tasks} task(s) ({plan.limit_source} allows at most that many)"
    )


def create_search(experiment: Path, plan: SearchPlan, overrides: Sequence[str]) -> SweepDir:
    """The sweep directory of a search: its record, the base (the code once, the config
    frozen), the study and the array's script. Nothing is left behind when it fails."""
    config = plan.config
    path = claim_sweep_dir(lambda: new_sweep_path(config))
    try:
        warn_if_writable_by_others(path)
        create_shared_base(path / SEARCH_DIR, config, path / CODE_DIR)
        create_study(path / JOURNAL_FILE, STUDY_NAME, plan.search)
        made = SweepRecord(
            name=config.experiment.name,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            experiment=str(experiment.resolve()),
            site=config.site.name,
            scheduler=config.site.scheduler,
            overrides=list(overrides),
            search=plan.search.model_dump(),
            trials=plan.budget,
            tasks=plan.tasks,
        )
        record = SweepDir(path, made)
        write_atomic(record.next_script(), array_script(plan, path))
        record.write()
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # nothing was submitted from it yet
        raise
    warn_if_nodes_shared(config)
    warn_left_out(path / SEARCH_DIR)
    return record


def submit_array(record: SweepDir, config: ResolvedConfig, script: Path | None = None) -> str:
    """sbatch the search's array script (its one script, written when the search was made:
    a resubmit sends the same agents again); record the array in sweep.json."""
    path = script or record.path / "array-0.sbatch"
    job_id = slurm_jobs(config.site).submit_script(path, [], owner=record.path)
    tasks = record.record.tasks
    record.record.arrays.append(SweepArray(job_id, str(path), tasks=tasks))
    record.write()
    click.echo(f"submitted job array {job_id}: {tasks} agent(s)")
    return job_id


def start_search(
    experiment: Path, site_name: str | None, overrides: Sequence[str], dry_run: bool
) -> SweepDir | None:
    """``hpctf sweep`` of a search: planned, then (unless ``dry_run``, which prints the plan
    and the array's script and writes nothing) created and submitted."""
    plan = plan_search(experiment, site_name, overrides, dry_run)
    if dry_run:
        sweep_path = new_sweep_path(plan.config)
        click.echo(f"# search {sweep_path}: {describe(plan)}; nothing written")
        click.echo(array_script(plan, sweep_path), nl=False)
        click.echo("# dry run: nothing written, nothing submitted", err=True)
        return None
    record = create_search(experiment, plan, overrides)
    click.echo(f"sweep directory: {record.path}")
    click.echo(f"search: {describe(plan)}")
    submit_array(record, plan.config, record.path / "array-0.sbatch")
    return record
