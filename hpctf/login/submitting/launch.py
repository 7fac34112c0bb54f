"""Starting a run: a new run directory with its frozen config and script, and one job on it
(sbatch on Slurm sites, local worker processes on local ones). Shared by ``submit``,
``resubmit`` and the sweeps.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from hpctf.core.errors import PREEMPTED_EXIT
from hpctf.core.run import journal, snapshot
from hpctf.core.run.rundir import (
    RunDir,
    RunDirTaken,
    create_run_dir,
    plan_run_dir,
    remove_new_run_dir,
)
from hpctf.core.scheduler import slurm
from hpctf.core.scheduler.launcher import LocalLauncher, SlurmLauncher, launcher_for
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.render import render


def new_run(config: ResolvedConfig) -> tuple[RunDir, ResolvedConfig, str]:
    """Create a new run directory and its script; the frozen config comes back with them.

    Two submits of one experiment in the same second plan the same directory: the one that
    loses the race plans the next free name and renders again (the script names its run
    directory)."""
    for _ in range(10):
        run = plan_run_dir(config)
        script = render(config, run.path)
        try:
            frozen = create_run_dir(run, config, script)
        except RunDirTaken:
            continue
        warn_if_writable_by_others(run.path)
        warn_left_out(run.path)
        return run, frozen, script
    raise RunDirTaken(f"no free run directory under {plan_run_dir(config).path.parent}")


def warn_if_writable_by_others(path: Path) -> None:
    """Say so on stderr when ``path`` (a new run or sweep directory) is group- or
    world-writable, as a umask of 002 makes it: whoever can write a run directory can replace
    its script, config and code, and so runs code as the run's owner at its next start."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "world" if mode & stat.S_IWOTH else "group"
        click.echo(
            f"warning: {path} is {who}-writable (mode {stat.S_IMODE(mode):o}; umask "
            f"{_umask():03o}): whoever can write it runs code as you at its next start; "
            f"chmod go-w {path}, and set umask 022 before hpctf submit",
            err=True,
        )


def warn_left_out(path: Path) -> None:
    """Name, on stderr, the source-like files the code snapshot of run ``path`` left out for
    their size: at submit, not as an ImportError or a missing file on the cluster."""
    for source in snapshot.read(path):
        for name in source.too_big:
            click.echo(
                f"warning: {Path(source.source) / name} is over the {snapshot.MAX_FILE >> 20} "
                "MiB hpctf copies per file and is not in the run's code snapshot: read it from "
                "its own path (an absolute path in train.args), or make it smaller",
                err=True,
            )
        for name in source.holds_secret:
            click.echo(
                f"warning: {Path(source.source) / name} holds a secret of this run's config, "
                "kept in the code snapshot readable by you alone (0400): move it into env: "
                "under a secret name",
                err=True,
            )


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it
    os.umask(mask)
    return mask


@dataclass(frozen=True)
class Caller:
    """Who starts a local run, and so how it talks back: the CLI echoes rank 0's log and
    exits 130 after a Ctrl-C's save; Python (:mod:`hpctf.python_api`) echoes only when asked
    and raises KeyboardInterrupt after the save, as Python code does on Ctrl-C."""

    echo: bool = True
    interrupt: bool = False


CLI = Caller()


def start_run(
    run: RunDir, config: ResolvedConfig, exclude: str | None = None, caller: Caller = CLI
) -> int:
    """Start one job on ``run`` with the site's launcher: sbatch for Slurm sites
    (``exclude``: nodes to leave out), local processes for local ones."""
    launcher = launcher_for(config.site)
    launcher.check_exclude(exclude, run.path)
    return _STARTS[launcher.name](run, config, exclude, caller)


def _start_local(run: RunDir, config: ResolvedConfig, exclude: str | None, caller: Caller) -> int:
    from hpctf.login.submitting import local

    click.echo(f"run directory: {run.path}")
    where = "" if caller.echo else "; echo=True shows rank 0's here"
    click.echo(f"running {config.ntasks} local worker(s); logs in {run.logs}{where}")
    sink = sys.stdout if caller.echo else None
    try:
        status = local.launch(config, run, os.environ, sink, interrupt=caller.interrupt)
    except local.Interrupted as stop:  # the workers saved; the run's end is recorded
        raise KeyboardInterrupt(
            f"cancelled at checkpoint step {run.checkpoint_step()}; resume with: "
            f"hpctf resubmit {run.path}"
        ) from stop
    if status == 0:
        said = f"done; run directory: {run.path}"
    elif status in (PREEMPTED_EXIT, local.CANCELLED_EXIT):
        what = "cancelled" if status == local.CANCELLED_EXIT else "stopped"
        said = (
            f"{what} at checkpoint step {run.checkpoint_step()}; resume with: "
            f"hpctf resubmit {run.path}"
        )
    else:
        said = f"failed (exit {status}); run directory: {run.path}"
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) took stdout with it
        click.echo(said)
    return status


def _start_slurm(run: RunDir, config: ResolvedConfig, exclude: str | None, _: Caller) -> int:
    extra = [f"--exclude={exclude}"] if exclude else []
    job_id, dropped = slurm.sbatch(run.script, os.environ, extra)
    if dropped:
        click.echo(
            f"note: left out {', '.join(dropped)} from your shell: a run's sbatch options come "
            "from its experiment and site",
            err=True,
        )
    journal.record_submitted(run, job_id, exclude=exclude)
    click.echo(f"submitted job {job_id}")
    click.echo(f"run directory: {run.path}")
    return 0


# How each launcher (hpctf.core.scheduler.launcher) starts a job: here, not in the launcher type,
# since the worker imports that type and never the local launcher's process handling.
_STARTS = {LocalLauncher.name: _start_local, SlurmLauncher.name: _start_slurm}


def submit_config(config: ResolvedConfig, caller: Caller = CLI) -> tuple[RunDir, int]:
    """``hpctf submit`` and :func:`hpctf.submit`: a new run directory for ``config`` and its
    first job; the run and the start's exit status (0 once sbatch took the job; a local
    site's workers' status). A job sbatch refused leaves no run directory behind."""
    run, config, _ = new_run(config)
    try:
        status = start_run(run, config, caller=caller)
    except SlurmFailure:
        remove_new_run_dir(run)  # sbatch refused or failed: no run was started
        raise
    return run, status
