"""The command line. User mistakes (UserError) are caught here and only here: one line per
problem on stderr, exit code 2, no traceback.

Login-node commands (validate, render, submit, schema, sites, init, status, logs, resubmit,
cancel) never import TensorFlow; ``worker`` is the compute-node entry that srun starts on every
task.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from hpctf import loader, scaffold, slurm
from hpctf.config import Experiment, ResolvedConfig, Site
from hpctf.errors import UserError
from hpctf.preemption import PREEMPTED_EXIT
from hpctf.render import explain as explain_script
from hpctf.render import render
from hpctf.rundir import (
    RunDir,
    create_run_dir,
    has_open_job,
    job_history,
    plan_run_dir,
    preempted_in_last_start,
    write_atomic,
)
from hpctf.sites import describe_site, listing, load_named_site, read_site, search_path
from hpctf.slurm import FINAL_STATES


class _UserMistake(click.ClickException):
    exit_code = UserError.exit_code


class _Group(click.Group):
    """Turns UserError into click's error display (``Error: ...`` on stderr, exit code 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise _UserMistake(str(exc)) from None


@click.group(cls=_Group)
@click.version_option(package_name="hpctf")
def cli() -> None:
    """From one experiment.yaml to multi-node TensorFlow training on Slurm."""


_site_option = click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="Site config name or path (default: the experiment's site).",
)
_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override an experiment key, e.g. --set resources.nodes=4 (repeatable).",
)
_experiment_arg = click.argument("experiment", type=click.Path(path_type=Path, dir_okay=False))


def load_config(
    experiment_file: Path, site_name: str | None, overrides: Sequence[str]
) -> ResolvedConfig:
    """Validate the experiment and its site and resolve them; writes nothing."""
    return loader.load_config(experiment_file, site_name, overrides, os.environ).config


def _run_dir(path: Path) -> RunDir:
    run = RunDir(path.resolve())
    run.load_config()  # fails with a clear message if this is not a run directory
    return run


@cli.command()
@_experiment_arg
@_site_option
@_set_option
def validate(experiment: Path, site_name: str | None, overrides: tuple[str, ...]) -> None:
    """Check EXPERIMENT and its site: every problem, one line each (exit 2). Writes nothing.

    Runs every check that render and submit run (the schema, the site and what it extends,
    conflicting options, the training entry, values the script could not hold) without
    printing a script.
    """
    loaded = loader.load_config(experiment, site_name, overrides, os.environ)
    config = loaded.config
    render(config, plan_run_dir(config).path)  # the checks made while writing the script
    res = config.experiment.resources
    click.echo(
        f"ok: {experiment} on site {config.site.name}: {res.nodes} node(s) x "
        f"{res.tasks_per_node} task(s), {config.gpus_per_node} GPU(s) per node, time {res.time}"
    )


@cli.command("render")
@_experiment_arg
@_site_option
@_set_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also create the run directory and write the script here, ready for `sbatch` by hand.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Beside each #SBATCH line and variable, say where its value came from.",
)
def render_command(
    experiment: Path,
    site_name: str | None,
    overrides: tuple[str, ...],
    output: Path | None,
    explain: bool,
) -> None:
    """Print the sbatch script for EXPERIMENT. Without -o nothing is written.

    With --explain the printed script carries a note (a comment) on each line whose value
    comes from the config: default, site file and line, experiment file and line, or --set.
    """
    loaded = loader.load_config(experiment, site_name, overrides, os.environ)
    config = loaded.config
    run = plan_run_dir(config)
    script = render(config, run.path)
    shown = explain_script(script, config, loaded.origins) if explain else script
    if output is None:
        click.echo(shown, nl=False)
        return
    create_run_dir(run, config, script)
    write_atomic(output, script)
    output.chmod(0o755)
    if explain:
        click.echo(shown, nl=False)
    click.echo(f"wrote {output} (run directory {run.path}); submit it with: sbatch {output}")


@cli.command()
@_experiment_arg
@_site_option
@_set_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and render, and ask `sbatch --test-only` when sbatch is on PATH; "
    "write and submit nothing.",
)
def submit(
    experiment: Path, site_name: str | None, overrides: tuple[str, ...], dry_run: bool
) -> None:
    """Create a run directory for EXPERIMENT and start it (sbatch, or local processes)."""
    config = load_config(experiment, site_name, overrides)
    run = plan_run_dir(config)
    script = render(config, run.path)
    if dry_run:
        click.echo(script, nl=False)
        click.echo(
            f"# dry run: nothing written, nothing submitted (run directory would be {run.path})",
            err=True,
        )
        if config.site.scheduler == "slurm" and shutil.which("sbatch"):
            slurm.test_only(script)  # a SlurmError (exit 2) carries Slurm's own words
            click.echo("# sbatch --test-only: Slurm accepts this job", err=True)
        return
    create_run_dir(run, config, script)
    sys.exit(_start(run, config))


@cli.command()
@click.argument("kind", type=click.Choice(["experiment", "site"]), default="experiment")
def schema(kind: str) -> None:
    """Print the JSON Schema of experiment files or site files, for editors."""
    model = Experiment if kind == "experiment" else Site
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **model.model_json_schema(),
    }
    click.echo(json.dumps(document, indent=2))


@cli.command()
@click.argument("name", required=False)
def sites(name: str | None) -> None:
    """List the sites on the search path, or print site NAME as resolved (extends followed).

    Search order, first match wins: $HPCTF_SITE_PATH, ~/.config/hpctf/sites/, the shipped
    site_configs/. Each value of a resolved site says which file and line it came from.
    """
    if name is None:
        entries = listing(os.environ)
        width = max((len(e.name) for e in entries), default=4)
        for entry in entries:
            click.echo(f"{entry.name.ljust(width)}  {entry.description}")
            click.echo(f"{''.ljust(width)}  {entry.path}")
            for hidden in entry.shadowed:
                click.echo(f"{''.ljust(width)}  (hides {hidden})")
        click.echo("search path: " + ":".join(str(d) for d in search_path(os.environ)))
        return
    site, origins = read_site(name, os.environ)
    click.echo(describe_site(site, origins), nl=False)


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--site", "site_name", default="local", show_default=True, metavar="NAME")
@click.option("--name", metavar="NAME", help="Experiment name (default: from DIRECTORY).")
@click.option("--force", is_flag=True, help="Overwrite experiment.yaml and train.py.")
def init(directory: Path, site_name: str, name: str | None, force: bool) -> None:
    """Start a new experiment in DIRECTORY: a commented experiment.yaml and train.py.

    Both pass `hpctf validate` as written, and train.py trains a small model on made-up data,
    so the first run works before any of it is yours.
    """
    written = scaffold.write(directory, site_name, name, force, os.environ)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"next: hpctf validate {written[0]} && hpctf submit {written[0]}")


def _start(run: RunDir, config: ResolvedConfig) -> int:
    """Start one job on ``run``: sbatch for Slurm sites, local processes for local ones."""
    if config.site.scheduler == "local":
        from hpctf import local

        click.echo(f"run directory: {run.path}")
        click.echo(f"running {config.ntasks} local worker(s); logs in {run.logs}")
        status = local.launch(config, run, os.environ, sys.stdout)
        if status == 0:
            click.echo(f"done; run directory: {run.path}")
        elif status == PREEMPTED_EXIT:
            click.echo(f"stopped after a checkpoint; resume with: hpctf resubmit {run.path}")
        else:
            click.echo(f"failed (exit {status}); run directory: {run.path}")
        return status
    job_id = slurm.sbatch(run.script)
    run.record("submitted", job_id=job_id)
    click.echo(f"submitted job {job_id}")
    click.echo(f"run directory: {run.path}")
    return 0


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def resubmit(run_dir: Path) -> None:
    """Start a new job on RUN_DIR; it resumes from the latest checkpoint."""
    run = _run_dir(run_dir)
    config = run.load_config()
    if run.done.exists():
        raise UserError(f"{run.path} is complete ({run.done} exists): nothing to resume")
    if config.site.scheduler == "slurm":
        # Two jobs on one run directory would write the same checkpoints.
        for job in job_history(run.events()):
            if "ended" in job:
                continue
            info = slurm.job_info(job["job_id"])
            state = info.get("JobState", "") if info else ""
            if state and state not in FINAL_STATES:
                raise UserError(
                    f"job {job['job_id']} of {run.path} is still {state}; wait for it, or "
                    f"stop it with: hpctf cancel {run.path}"
                )
    sys.exit(_start(run, config))


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def status(run_dir: Path) -> None:
    """Show the job history of RUN_DIR: job ids, states, restarts, last step."""
    run = _run_dir(run_dir)
    config = run.load_config()
    for job in job_history(run.events()):
        state = "ENDED" if "ended" in job else "PENDING/RUNNING"
        if config.site.scheduler == "slurm" and "ended" not in job:
            info = slurm.job_info(job["job_id"])
            state = info.get("JobState", "?") if info else "UNKNOWN (gone from Slurm)"
        exit_text = f" exit {job['exit_code']}" if "exit_code" in job else ""
        nodes = job.get("nodes") or "-"
        click.echo(f"job {job['job_id']}: {state}{exit_text} starts {job['starts']} nodes {nodes}")
    last = _last_metrics(run)
    click.echo(f"last logged step: {last.get('step', '-')}")
    click.echo(f"done: {run.done.read_text().strip() if run.done.exists() else 'no'}")


def _last_metrics(run: RunDir) -> dict[str, Any]:
    if not run.metrics.exists():
        return {}
    lines = run.metrics.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[-1]) if lines else {}


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Which task's log.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
def logs(run_dir: Path, rank: int, follow: bool) -> None:
    """Print the log of one rank of RUN_DIR (with -f, until the run's jobs have ended)."""
    run = _run_dir(run_dir)
    path = run.rank_log(rank)
    if not path.exists():
        ranks = sorted(p.stem.split("-")[1] for p in run.logs.glob("rank-*.log"))
        raise UserError(
            f"{path}: no log for rank {rank}; ranks with logs: {', '.join(ranks) or 'none yet'}"
        )
    with path.open(encoding="utf-8", errors="replace") as handle:
        while True:
            chunk = handle.read()
            if chunk:
                click.echo(chunk, nl=False)
            elif not follow or run.done.exists() or not has_open_job(run.events()):
                return
            else:
                time.sleep(1)


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def cancel(run_dir: Path) -> None:
    """Cancel the jobs of RUN_DIR that have not ended."""
    run = _run_dir(run_dir)
    if run.load_config().site.scheduler != "slurm":
        raise UserError(f"{run.path} runs on a local site: stop its launcher (Ctrl-C) instead")
    open_jobs = [j["job_id"] for j in job_history(run.events()) if "ended" not in j]
    slurm.cancel(open_jobs)
    run.record("cancelled", jobs=open_jobs)
    click.echo(f"cancelled: {' '.join(open_jobs) or 'nothing (no open jobs)'}")


# --- compute node -----------------------------------------------------------------------------


@cli.command(hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def worker(run_dir: Path) -> None:
    """Train one task of RUN_DIR (started by srun on every task)."""
    from hpctf.runtime import run_worker

    sys.exit(run_worker(run_dir, os.environ))


@cli.command()
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Take port_range and hostname_template from this run's site.",
)
@click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="Take port_range and hostname_template from this site (name or path).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Also run the worker's startup checks: addresses resolve, this task's port is free.",
)
def tfconfig(run_dir: Path | None, site_name: str | None, check: bool) -> None:
    """Print this task's TF_CONFIG JSON; run it inside srun to see what a worker would get.

    The JSON goes to stdout (`export TF_CONFIG=$(hpctf tfconfig)` works); one line about this
    task (node, local id, GPUs) goes to stderr. Without --run-dir or --site the defaults are
    used: port_range 20000-30000 and hostname_template {host}.
    """
    from hpctf.cluster import cluster_spec
    from hpctf.config import Site

    if run_dir is not None and site_name:
        raise UserError("give at most one of --run-dir and --site")
    port_range: tuple[int, int] = Site.model_fields["port_range"].default
    template: str = Site.model_fields["hostname_template"].default
    if run_dir is not None:
        site = _run_dir(run_dir).load_config().site
        port_range, template = site.port_range, site.hostname_template
    elif site_name:
        site = load_named_site(site_name, os.environ)
        port_range, template = site.port_range, site.hostname_template
    spec = cluster_spec(os.environ, port_range, template)
    if check:
        from hpctf.runtime import startup_checks

        startup_checks(spec)
    click.echo(spec.tf_config())
    click.echo(f"hpctf: SLURM_PROCID {spec.task_index}: {spec.describe()}", err=True)


@cli.command("job-start", hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def job_start(run_dir: Path) -> None:
    """Record the start of a batch job in RUN_DIR (called by the batch script)."""
    run = _run_dir(run_dir)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UserError("SLURM_JOB_ID is not set: job-start runs inside a Slurm batch job")
    run.record(
        "started",
        job_id=job_id,
        nodes=os.environ.get("SLURM_JOB_NODELIST"),
        restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    )


@cli.command("job-end", hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--exit-code", type=int, required=True)
def job_end(run_dir: Path, exit_code: int) -> None:
    """Record the end of a batch job's training step in RUN_DIR; requeue it when its ranks
    stopped at an agreed preemption checkpoint, within the site's preemption.max_requeues."""
    run = _run_dir(run_dir)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UserError("SLURM_JOB_ID is not set: job-end runs inside a Slurm batch job")
    run.record("ended", job_id=job_id, exit_code=exit_code)
    if not preempted_in_last_start(run.events(), job_id):
        return
    budget = run.load_config().site.preemption.max_requeues
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts >= budget:
        run.record("requeue-refused", job_id=job_id, restarts=restarts, budget=budget)
        raise UserError(
            f"job {job_id} was requeued {restarts} times, the site's preemption.max_requeues; "
            f"not again: resume with hpctf resubmit {run.path}"
        )
    run.record("requeued", job_id=job_id, restarts=restarts + 1)
    slurm.requeue(job_id)


def main() -> None:
    cli(prog_name="hpctf")
