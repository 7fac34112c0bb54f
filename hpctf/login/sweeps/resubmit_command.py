"""``hpctf resubmit``: a run directory (:func:`hpctf.login.submitting.resubmit.resubmit_run`)
or a sweep directory (:func:`hpctf.login.sweeps.sweep_commands.sweep_resubmit`). Here, in the
sweeps' room, because it tells the two apart: the submitting room knows nothing of sweeps."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.login.reading.run_site import run_site_option
from hpctf.login.submitting.resubmit import resubmit_run
from hpctf.login.sweeps.sweep_commands import sweep_resubmit
from hpctf.login.sweeps.sweep_dir import is_sweep_dir


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
@click.option(
    "--from-scratch",
    is_flag=True,
    help="Start again from step 0: the run's checkpoints are moved aside to "
    "checkpoints-discarded-<time>/ (nothing is deleted).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Continue the run with a new train.steps (or epochs, log/eval cadence, "
    "checkpoint.every_steps, keep), also a done one (repeatable).",
)
@run_site_option
def resubmit(
    run_dir: Path,
    exclude: str | None,
    retry_failed_nodes: bool,
    update_code: bool,
    from_scratch: bool,
    overrides: tuple[str, ...],
    site_name: str | None,
) -> None:
    """Start a new job on RUN_DIR; it resumes from the latest checkpoint. On a sweep
    directory: one new job array over the points that did not finish.

    With --set, continue the run (done or stopped) with keys that change neither the model nor
    the batch script: train.steps (more steps than it has), train.epochs,
    train.log_every_steps, train.eval_every_steps, checkpoint.every_steps, checkpoint.keep.
    The change is recorded in the run's journal; `hpctf status` shows it."""
    if is_sweep_dir(run_dir):
        if from_scratch or overrides:
            raise UserError("--from-scratch and --set take one run directory, not a sweep")
        options = {"--exclude": exclude, "--retry-failed-nodes": retry_failed_nodes}
        sys.exit(sweep_resubmit(run_dir, {**options, "--update-code": update_code}))
    sys.exit(
        resubmit_run(run_dir, exclude, retry_failed_nodes, update_code, from_scratch, overrides)
    )
