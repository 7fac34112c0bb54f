"""The login-node commands: validate, render, submit, schema, sites, init (resubmit, which also
takes a sweep directory, is :mod:`hpctf.login.sweeps.resubmit_command`'s; status, runs, logs,
cancel and plot are in the modules of those names). None of them imports
TensorFlow; each raises UserError or EnvironmentProblem and leaves the reporting to the CLI edge
(:mod:`hpctf.cli`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from hpctf.core.run.rundir import plan_run_dir
from hpctf.core.safe_files import umask, write_atomic
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import Experiment, Site
from hpctf.core.settings.sites import describe_site, listing, read_site, search_path
from hpctf.login.resolving.advice import advice, search_as_one_run
from hpctf.login.resolving.loader import load_config
from hpctf.login.resolving.search_keys import check_search_keys
from hpctf.login.submitting import scaffold
from hpctf.login.submitting.pipeline import RunJob, submit_run
from hpctf.login.submitting.render import explain as explain_script
from hpctf.login.submitting.render import render

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
    printing a script. Warnings (too few CPUs per GPU for the site, ports among the
    ephemeral ones) go to stderr, one line each, and do not fail it.
    """
    loaded = load_config(experiment, site_name, overrides, os.environ)
    config = loaded.config
    if config.experiment.sweep is not None:  # each parameter a key a trial may set
        check_search_keys(experiment, site_name, overrides, config.experiment.sweep, os.environ)
    render(config, plan_run_dir(config).path)  # the checks made while writing the script
    for line in advice(config):
        click.echo(f"warning: {line}", err=True)
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
    job = RunJob(loaded.config)
    planned = job.plan()
    script = job.render(planned)
    shown = explain_script(script, loaded.config, loaded.origins) if explain else script
    if output is None:
        click.echo(shown, nl=False)
        return
    created = job.create(planned, script)  # another name when a submit of this second took it
    run, script = created.run, created.script
    write_atomic(output, script, mode=0o777 & ~umask())  # executable, as the umask allows
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
    for line in [*advice(config), search_as_one_run(config, experiment)]:
        if line:
            click.echo(f"warning: {line}", err=True)
    submitted = submit_run(config, dry_run=dry_run)
    if not dry_run:
        sys.exit(submitted.result)
    click.echo(submitted.script, nl=False)
    click.echo(
        "# dry run: nothing written, nothing submitted (run directory would be "
        f"{submitted.planned.run.path})",
        err=True,
    )
    if launcher_for(config.site).test_only(submitted.script):  # a SlurmFailure says why not
        click.echo("# sbatch --test-only: Slurm accepts this job", err=True)


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
@click.option(
    "--fit",
    is_flag=True,
    help="train.py is a Keras model.fit script of your own (train.script) instead of a Task.",
)
def init(directory: Path, site_name: str, name: str | None, force: bool, fit: bool) -> None:
    """Start a new experiment in DIRECTORY: a commented experiment.yaml and train.py.

    Both pass `hpctf validate` as written, and train.py trains a small model on made-up data,
    so the first run works before any of it is yours: a Task for hpctf's loop, or with --fit a
    script that calls model.fit with hpctf.keras.callbacks().
    """
    written = scaffold.write(directory, site_name, name, force, os.environ, fit)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"next: hpctf validate {written[0]} && hpctf submit {written[0]}")


COMMANDS = (
    validate,
    render_command,
    submit,
    schema,
    sites,
    init,
)
