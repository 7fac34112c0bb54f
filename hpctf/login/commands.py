"""The login-node commands: validate, render, submit, schema, sites, init, resubmit (status,
runs, logs, cancel and plot are in the modules of those names). None of them imports
TensorFlow; each raises UserError or EnvironmentProblem and leaves the reporting to the CLI edge
(:mod:`hpctf.cli`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import click

from hpctf.core import ownership, slurm, snapshot
from hpctf.core.config import Experiment, ResolvedConfig, Site
from hpctf.core.errors import UserError
from hpctf.core.rundir import (
    RunDir,
    create_run_dir,
    job_history,
    plan_run_dir,
    remove_new_run_dir,
    with_snapshot,
    write_atomic,
)
from hpctf.core.runstate import run_state
from hpctf.core.sites import describe_site, listing, read_site, search_path
from hpctf.core.slurm import FINAL_STATES, SlurmFailure
from hpctf.login import scaffold
from hpctf.login.doctor import doctor
from hpctf.login.launch import new_run, start_run
from hpctf.login.loader import load_config
from hpctf.login.render import explain as explain_script
from hpctf.login.render import render
from hpctf.login.sweep_commands import sweep, sweep_resubmit
from hpctf.login.sweep_dir import is_sweep_dir

# A Slurm node list as scontrol writes one: names, ranges in brackets, commas.
_NODELIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\[\],-]*")

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


@click.command()
@_experiment_arg
@_site_option
@_set_option
def validate(experiment: Path, site_name: str | None, overrides: tuple[str, ...]) -> None:
    """Check EXPERIMENT and its site: every problem, one line each (exit 2). Writes nothing.

    Runs every check that render and submit run (the schema, the site and what it extends,
    conflicting options, the training entry, values the script could not hold) without
    printing a script.
    """
    loaded = load_config(experiment, site_name, overrides, os.environ)
    config = loaded.config
    render(config, plan_run_dir(config).path)  # the checks made while writing the script
    res = config.experiment.resources
    click.echo(
        f"ok: {experiment} on site {config.site.name}: {res.nodes} node(s) x "
        f"{res.tasks_per_node} task(s), {config.gpus_per_node} GPU(s) per node, time {res.time}"
    )


@click.command("render")
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
    loaded = load_config(experiment, site_name, overrides, os.environ)
    config = loaded.config
    run = plan_run_dir(config)
    script = render(config, run.path)
    shown = explain_script(script, config, loaded.origins) if explain else script
    if output is None:
        click.echo(shown, nl=False)
        return
    config = create_run_dir(run, config, script)
    write_atomic(output, script)
    output.chmod(0o755)
    if explain:
        click.echo(shown, nl=False)
    click.echo(f"wrote {output} (run directory {run.path}); submit it with: sbatch {output}")


@click.command()
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
    config = load_config(experiment, site_name, overrides, os.environ).config
    run = plan_run_dir(config)
    script = render(config, run.path)
    if dry_run:
        click.echo(script, nl=False)
        click.echo(
            f"# dry run: nothing written, nothing submitted (run directory would be {run.path})",
            err=True,
        )
        if config.site.scheduler == "slurm" and shutil.which("sbatch"):
            slurm.test_only(script)  # a SlurmFailure carries Slurm's own words
            click.echo("# sbatch --test-only: Slurm accepts this job", err=True)
        return
    run, config, script = new_run(config)
    try:
        status = start_run(run, config)
    except SlurmFailure:
        remove_new_run_dir(run)  # sbatch refused or failed: no run was started
        raise
    sys.exit(status)


@click.command()
@click.argument("kind", type=click.Choice(["experiment", "site"]), default="experiment")
def schema(kind: str) -> None:
    """Print the JSON Schema of experiment files or site files, for editors."""
    model = Experiment if kind == "experiment" else Site
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **model.model_json_schema(),
    }
    click.echo(json.dumps(document, indent=2))


@click.command()
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


@click.command()
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


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--exclude",
    metavar="NODES",
    help="Leave these nodes out of the new job (a Slurm node list, e.g. node[3-4],node7), as "
    "well as the nodes that failed under the run's earlier jobs.",
)
@click.option(
    "--retry-failed-nodes",
    is_flag=True,
    help="Do not leave out the nodes that failed under the run's earlier jobs.",
)
@click.option(
    "--update-code",
    is_flag=True,
    help="Copy the code from the experiment's python_path again (by default every start runs "
    "the copy taken at submit).",
)
def resubmit(
    run_dir: Path, exclude: str | None, retry_failed_nodes: bool, update_code: bool
) -> None:
    """Start a new job on RUN_DIR; it resumes from the latest checkpoint. On a sweep
    directory: one new job array over the points that did not finish."""
    if is_sweep_dir(run_dir):
        options = {"--exclude": exclude, "--retry-failed-nodes": retry_failed_nodes}
        sweep_resubmit(run_dir, {**options, "--update-code": update_code})
        return
    run = RunDir.open(run_dir)
    config = run.load_config()
    if run.done.exists():
        raise UserError(f"{run.path} is complete ({run.done} exists): nothing to resume")
    if exclude is not None and not _NODELIST.fullmatch(exclude):
        raise UserError(f"--exclude {exclude!r} is not a Slurm node list, e.g. node[3-4],node7")
    if exclude and config.site.scheduler != "slurm":
        raise UserError(f"--exclude needs a Slurm site; {run.path} runs on a local one")
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
    # Atomic, unlike the check above: of two resubmits at one instant, one goes on. On Slurm
    # the claim passes to the job sbatch gives; a local run is this process's own.
    slurm_site = config.site.scheduler == "slurm"
    claim = ownership.claim_of("submit" if slurm_site else "local")
    owner = ownership.take(run.path, claim, ownership.alive, wait_for_submit_s=0)
    if owner is not None:
        raise UserError(
            f"{owner.describe()} owns {run.path}; wait for it, or stop it with: "
            f"hpctf cancel {run.path}"
        )
    try:
        status = _resubmit(run, config, exclude, retry_failed_nodes, update_code)
    except BaseException:
        ownership.give_up(run.path, claim)
        raise
    if slurm_site:
        submitted = [e for e in run.events() if e.get("event") == "submitted"]
        ownership.hand_over(run.path, claim, str(submitted[-1]["job_id"]))
    sys.exit(status)


def _resubmit(
    run: RunDir,
    config: ResolvedConfig,
    exclude: str | None,
    retry_failed_nodes: bool,
    update_code: bool,
) -> int:
    if update_code:
        sources = [source.source for source in snapshot.read(run.path)]
        if not sources:
            raise UserError(f"{run.path} has no code snapshot to update")
        config = with_snapshot(config, run, sources)
        run.record("code-updated", sources=sources)
        for source in snapshot.read(run.path):
            click.echo(f"code: {source.describe()}")
    failed = run_state(run.events()).failed_nodes
    if failed and config.site.scheduler == "slurm" and not retry_failed_nodes:
        click.echo(
            f"note: leaving out {','.join(failed)}, which failed under earlier jobs of the run "
            "(--retry-failed-nodes keeps them)",
            err=True,
        )
        exclude = ",".join([*([exclude] if exclude else []), *failed])
    return start_run(run, config, exclude)


COMMANDS = (
    validate,
    render_command,
    submit,
    schema,
    sites,
    init,
    resubmit,
    doctor,
    sweep,
)
