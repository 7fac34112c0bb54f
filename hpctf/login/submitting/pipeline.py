"""The one way a job is submitted: plan -> render (once) -> create -> start.

:func:`submit` runs those four stages for any :class:`Job`; ``--dry-run`` stops after render,
before anything is written. Two kinds of job go through it:

- :class:`RunJob`, a run directory and its first job: ``hpctf submit`` and
  :func:`hpctf.submit` (both call :func:`submit_run`). ``hpctf resubmit`` and a sweep's local
  points start an existing run directory with :func:`start`, the same last stage; a sweep's
  points are created with :func:`create_points` (the first three stages for all of them at
  once, their code one shared snapshot; no start: their job is one array).
- ``hpctf doctor``'s test job (:class:`hpctf.login.doctor.doctor_commands.DoctorJob`): its own
  directory and template, started by the same launchers (:mod:`.launchers`).

The script is rendered once per submit; only a lost race for the planned run directory (two
submits of one experiment in the same second) plans and renders again, since the script names
its run directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import click

from hpctf.core.run import snapshot, snapshot_files
from hpctf.core.run.rundir import (
    RunDir,
    RunDirTaken,
    create_run_dir,
    create_run_dirs_sharing_code,
    plan_run_dir,
    remove_new_run_dir,
)
from hpctf.core.scheduler.launcher import launcher_for as facts_for
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.launchers import CLI, Caller, job_launcher
from hpctf.login.submitting.render import render

Planned = TypeVar("Planned")
Created = TypeVar("Created")
Result = TypeVar("Result", covariant=True)


class Job(Protocol[Planned, Created, Result]):
    """One kind of job, as the pipeline's stages see it."""

    def plan(self) -> Planned:
        """Where the job will live; creates nothing."""
        ...

    def render(self, planned: Planned) -> str:
        """The job's batch script for ``planned``: pure, every check of the script made."""
        ...

    def create(self, planned: Planned, script: str) -> Created:
        """Write the job's directory and ``script``; on failure nothing is left behind."""
        ...

    def start(self, created: Created) -> Result:
        """Start the job with the site's launcher."""
        ...


@dataclass(frozen=True)
class Submitted(Generic[Planned, Created, Result]):
    """What :func:`submit` did: the plan and the script always; the created job and the
    start's result unless it was a dry run."""

    planned: Planned
    script: str
    created: Created | None = None
    result: Result | None = None


def submit(
    job: Job[Planned, Created, Result], dry_run: bool = False
) -> Submitted[Planned, Created, Result]:
    """Plan, render once, and (unless ``dry_run``) create and start ``job``."""
    planned = job.plan()
    script = job.render(planned)
    if dry_run:
        return Submitted(planned, script)
    created = job.create(planned, script)
    return Submitted(planned, script, created, job.start(created))


# --- a run directory --------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRun:
    """A run directory: planned (``config`` as resolved), or created (``config`` frozen, its
    python_path pointing at the code snapshot; ``script``: the batch script written there)."""

    run: RunDir
    config: ResolvedConfig
    script: str = ""


@dataclass(frozen=True)
class RunJob:
    """A new run directory for ``config`` and its first job (:class:`Job`)."""

    config: ResolvedConfig
    caller: Caller = CLI
    path: Path | None = None  # a run directory chosen by the caller
    warn: bool = True  # said once by a caller that makes many

    def plan(self) -> NewRun:
        run = RunDir(self.path) if self.path is not None else plan_run_dir(self.config)
        return NewRun(run, self.config)

    def render(self, planned: NewRun) -> str:
        return render(planned.config, planned.run.path)

    def create(self, planned: NewRun, script: str) -> NewRun:
        """The run directory; a lost race for its name (another submit of the same second)
        plans the next free name and renders for it, up to ten times."""
        for _ in range(10):
            try:
                frozen = create_run_dir(planned.run, self.config, script)
            except RunDirTaken:
                if self.path is not None:
                    raise
                planned = self.plan()
                script = self.render(planned)
                continue
            if self.warn:
                warn_if_writable_by_others(planned.run.path)
                warn_if_nodes_shared(self.config)
                warn_left_out(planned.run.path)
            return replace(planned, config=frozen, script=script)
        raise RunDirTaken(f"no free run directory under {planned.run.path.parent}")

    def start(self, created: NewRun) -> int:
        """The first job; a job the scheduler refused leaves no run directory behind."""
        try:
            return start(created.run, created.config, caller=self.caller)
        except SlurmFailure:
            remove_new_run_dir(created.run)  # sbatch refused or failed: no run was started
            raise


def submit_run(
    config: ResolvedConfig, dry_run: bool = False, caller: Caller = CLI
) -> Submitted[NewRun, NewRun, int]:
    """``hpctf submit`` and :func:`hpctf.submit`: a new run directory for ``config`` and its
    first job. ``result`` is the start's exit status (0 once sbatch took the job; a local
    site's workers' status)."""
    return submit(RunJob(config, caller), dry_run)


def create_points(
    configs: Sequence[ResolvedConfig], paths: Sequence[Path], code_store: Path,
    scripts: Sequence[str] | None = None,
) -> None:  # fmt: skip
    """A sweep's points: the run directory ``paths[i]`` for ``configs[i]`` with its script
    ``scripts[i]`` (default: each rendered once), all created at once with one code snapshot
    in ``code_store`` (:func:`hpctf.core.run.rundir.create_run_dirs_sharing_code`), not
    started: their job is one array."""
    if scripts is None:
        scripts = [render(config, path) for config, path in zip(configs, paths, strict=True)]
    points = zip(paths, configs, scripts, strict=True)
    create_run_dirs_sharing_code([(RunDir(p), c, s) for p, c, s in points], code_store)


def start(
    run: RunDir, config: ResolvedConfig, exclude: str | None = None, caller: Caller = CLI
) -> int:
    """Start one job on ``run`` with the site's launcher: sbatch for Slurm sites
    (``exclude``: nodes to leave out), local processes for local ones. The pipeline's last
    stage, and all of ``hpctf resubmit``'s."""
    return job_launcher(config.site).start(run, config, exclude, caller)


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


def warn_if_nodes_shared(config: ResolvedConfig) -> None:
    """Say so on stderr when a Slurm job may share a node with other users' jobs: they reach
    its workers' TensorFlow ports over loopback, unauthenticated, and run ops as you
    (docs/reference/security.md); TensorFlow lets hpctf bind them nowhere else."""
    site, exclusive = config.site, config.experiment.resources.exclusive
    if not facts_for(site).slurm or not site.shared_nodes or exclusive:
        return
    click.echo(
        f"warning: on site {site.name} other users' jobs may share this job's nodes and reach "
        "its TensorFlow ports (run code as you while it runs): set resources.exclusive: true "
        "(or user), or shared_nodes: false in a site whose nodes are given whole",
        err=True,
    )


def warn_left_out(path: Path) -> None:
    """Name, on stderr, the source-like files the code snapshot of run ``path`` left out for
    their size: at submit, not as an ImportError or a missing file on the cluster."""
    for source in snapshot.read(path):
        for name in source.too_big:
            click.echo(
                f"warning: {Path(source.source) / name} is over the "
                f"{snapshot_files.MAX_FILE >> 20} MiB hpctf copies per file and is not in the "
                "run's code snapshot: read it from its own path (an absolute path in "
                "train.args), or make it smaller",
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
