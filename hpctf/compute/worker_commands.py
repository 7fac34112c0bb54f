"""The compute-node commands: ``worker`` (what srun starts on every task), ``tfconfig``
(each task's TF_CONFIG, for debugging inside an allocation) and ``preflight`` (``hpctf
doctor``'s checks on every task). TensorFlow is imported only once ``worker`` hands over to
:mod:`hpctf.compute.loop.training`, or inside ``preflight``'s checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from hpctf.compute.cluster.peers import PeerLost
from hpctf.core.errors import ENVIRONMENT_EXIT, EnvironmentProblem, UserError, environment_line
from hpctf.core.printable import printable
from hpctf.core.run.rundir import RunDir
from hpctf.core.secrets import redact
from hpctf.core.settings.config import Site


@click.command(hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def worker(run_dir: Path) -> None:
    """Train one task of RUN_DIR (started by srun on every task)."""
    from hpctf.compute.process.leaving import leave
    from hpctf.compute.start.takeover import hand_over

    # A warm standby on this task's slot becomes the worker (TensorFlow imported already):
    # this process relays its signals and leaves as it did.
    if (status := hand_over(run_dir, os.environ)) is not None:
        leave(status)
    _work(run_dir)


@click.command(hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--child", "child_fd", type=int, default=None, hidden=True)
def standby(run_dir: Path, child_fd: int | None) -> None:
    """Keep a warm standby worker of RUN_DIR on this task slot (the batch script starts one
    per slot, once per allocation): it takes the place of a restarted worker
    (hpctf.compute.start.standby)."""
    from hpctf.compute.process.leaving import leave
    from hpctf.compute.start import standby as warm

    if child_fd is None:
        leave(warm.keep(run_dir, os.environ))
    became = warm.wait_for_takeover(run_dir, child_fd)
    if became is None:  # the keeper left
        leave(0)
    _work(became)


def _work(run_dir: Path) -> NoReturn:
    """The worker's life in this process, from its config to its exit."""
    from hpctf.compute.process.leaving import leave
    from hpctf.compute.start.runtime import run_worker

    path = run_dir.resolve()
    try:
        status = run_worker(run_dir, os.environ)
    except PeerLost as exc:
        # A peer died: leave at once, its line first. The interpreter's exit would tear
        # TensorFlow down, which waits on the dead peer (measured on the test cluster: 4-5 s
        # after the error, and srun, so the job's next start, waited for it).
        click.echo(f"Error: {printable(redact(environment_line(exc)))}", err=True)
        leave(ENVIRONMENT_EXIT)
    except Exception as exc:
        if (path / "config.json").exists():
            raise
        # Moved or removed while the job ran: whatever failed first (a metrics line, a save,
        # TensorFlow's own error) is the environment's doing, not a bug in hpctf.
        raise EnvironmentProblem(
            f"the run directory {path} is gone (moved or removed while the job ran); move it "
            f"back and continue with: hpctf resubmit {path}"
        ) from exc
    # Not sys.exit: the interpreter's teardown of TensorFlow can wait many seconds on peers
    # that have already left (hpctf.compute.process.leaving).
    leave(status)


@click.command()
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
    from hpctf.compute.cluster.spec import cluster_spec

    if run_dir is not None and site_name:
        raise UserError("give at most one of --run-dir and --site")
    port_range: tuple[int, int] = Site.model_fields["port_range"].default
    template: str = Site.model_fields["hostname_template"].default
    if run_dir is not None:
        site = RunDir.open(run_dir).load_config().site
        port_range, template = site.port_range, site.hostname_template
    elif site_name:
        # Here, not at the top: every worker imports this module before its first step, and
        # the sites' reading (YAML and its validation) is none of its business.
        from hpctf.core.settings.sites import load_named_site

        site = load_named_site(site_name, os.environ)
        port_range, template = site.port_range, site.hostname_template
    spec = cluster_spec(os.environ, port_range, template)
    if check:
        from hpctf.compute.start.runtime import startup_checks

        startup_checks(spec)
    click.echo(spec.tf_config())
    click.echo(f"hpctf: SLURM_PROCID {spec.task_index}: {spec.describe()}", err=True)


@click.command(hidden=True)
@click.argument("doctor_dir", type=click.Path(path_type=Path, file_okay=False))
def preflight(doctor_dir: Path) -> None:
    """Run `hpctf doctor`'s checks on this task; write them to DOCTOR_DIR/results/."""
    from hpctf.compute.start.preflight import run_preflight

    sys.exit(run_preflight(doctor_dir, os.environ))


COMMANDS = (worker, standby, tfconfig, preflight)
