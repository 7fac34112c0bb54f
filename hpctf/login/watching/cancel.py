"""``hpctf cancel``: the run's open jobs cancelled, and the cancel recorded in its journal."""

from __future__ import annotations

from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.core.run import journal, run_index
from hpctf.core.run.run_identity import check_not_a_copy, check_owned
from hpctf.login.reading.run_site import run_site_option
from hpctf.login.reading.runs import RunRecord
from hpctf.login.submitting.launchers import job_launcher
from hpctf.login.submitting.local_control import (
    CANCEL_WAIT_S,
    cancel_local,
    local_launcher,
)
from hpctf.login.sweeps.sweep_commands import sweep_cancel
from hpctf.login.sweeps.sweep_dir import is_sweep_dir


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@run_site_option
def cancel(run_dir: Path, site_name: str | None) -> None:
    """Cancel the job of RUN_DIR that has not ended, and record that the user cancelled it:
    the run ends `cancelled` (it is not requeued); `hpctf resubmit` starts it again. On a
    sweep directory: every point's open job, in one scancel. A local run: its launcher gets
    SIGINT, as from Ctrl-C (its workers save an agreed step; a second cancel stops them at
    once), and this waits for it to end."""
    if is_sweep_dir(run_dir):
        sweep_cancel(run_dir)
        return
    run = RunRecord.read(run_dir)
    if not run.slurm:
        _cancel_local(run)
        return
    jobs = cancel_run(run_dir)
    if not jobs:
        run = RunRecord.read(run_dir)
        click.echo(
            f"nothing to cancel: no job of {run.run.path} is open (the run is {run.state.state})"
        )
        return
    click.echo(f"cancelled: {' '.join(jobs)}")


def cancel_run(run_dir: Path) -> list[str]:
    """``hpctf cancel RUN`` and :meth:`hpctf.RunRecord.cancel`: scancel the run's open jobs and
    record it; the jobs cancelled (none when none was open)."""
    run = RunRecord.read(run_dir)
    check_owned(run.run, "cancel")
    check_not_a_copy(run.run)  # a copy's journal names the original's jobs
    run.history.require_whole()  # which jobs are open: from a whole journal
    launcher = job_launcher(run.config.site)
    if not run.slurm:
        return launcher.cancel(run.run, [])  # its launcher records the cancel
    history = launcher.adopt_unrecorded(run.run, run.history)
    open_jobs = launcher.cancel(run.run, history.open_jobs)
    if open_jobs:
        cancelled = history.plus(journal.record_cancelled(run.run, open_jobs))
        run_index.note(run.run, run.config, cancelled)
    return open_jobs


def _cancel_local(run: RunRecord) -> None:
    """A local run: its launcher stopped as by Ctrl-C, waited for, and the saved step said."""
    check_owned(run.run, "cancel")
    check_not_a_copy(run.run)
    run.history.require_whole()
    if local_launcher(run.run, run.history) is not None:
        click.echo(f"cancelling {run.run.path}: the workers save at the next agreed step and stop")
    stopped = cancel_local(run.run)
    if stopped is None:
        click.echo(
            f"nothing to cancel: no launcher of {run.run.path} runs on this host (the run is "
            f"{run.state.state})"
        )
        return
    launcher, step = stopped
    if step is None:
        raise UserError(
            f"the launcher (pid {launcher}) of {run.run.path} did not end within "
            f"{CANCEL_WAIT_S:.0f} s of its SIGINT; hpctf cancel again stops it at once"
        )
    click.echo(f"cancelled at checkpoint step {step}; resume with: hpctf resubmit {run.run.path}")
