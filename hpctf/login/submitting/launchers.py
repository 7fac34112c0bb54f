"""Starting, cancelling and describing a site's jobs: one :class:`JobLauncher` per kind of
site, :class:`LocalJobs` (the tasks as processes on this machine) and :class:`SlurmJobs`
(sbatch, scancel, scontrol), got with :func:`job_launcher`.

The facts every wing may ask of a site's scheduler (does it warn the workers, does it leave
failed nodes out, may it run a container) are :class:`hpctf.core.scheduler.launcher.Launcher`'s,
which the worker imports; doing things with jobs is the login node's, so that half is here, in
the login wing, keyed by the same kind names (:data:`JOB_LAUNCHERS`), and the worker never
imports it.

A site behind SSH (its ``login:`` key) needs no launcher of its own: the laptop forwards the
whole command to the same hpctf on the cluster's login node (:mod:`hpctf.login.remote`), where
the pipeline and these launchers run as they do here, next to the run directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click

from hpctf.core.errors import PREEMPTED_EXIT, UserError
from hpctf.core.run import journal, ownership
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from hpctf.core.scheduler.launcher import Launcher, LocalLauncher, SlurmLauncher
from hpctf.core.scheduler.launcher import launcher_for as facts_for
from hpctf.core.scheduler.slurm_queries import commented_jobs

if TYPE_CHECKING:  # pydantic's models: not imported for `hpctf status`
    from hpctf.core.run.history import RunHistory
    from hpctf.core.settings.config import ResolvedConfig, Site


@dataclass(frozen=True)
class Caller:
    """Who starts a local run, and so how it talks back: the CLI echoes rank 0's log and
    exits 130 after a Ctrl-C's save; Python (:mod:`hpctf.python_api`) echoes only when asked
    and raises KeyboardInterrupt after the save, as Python code does on Ctrl-C."""

    echo: bool = True
    interrupt: bool = False


CLI = Caller()


class JobLauncher:
    """How a site of one kind starts, cancels and describes a run's jobs."""

    kind: ClassVar[type[Launcher[Any]]]

    def __init__(self, site: Site) -> None:
        self.facts = facts_for(site)

    def start(
        self, run: RunDir, config: ResolvedConfig, exclude: str | None, caller: Caller
    ) -> int:
        """Start one job on ``run``; the start's exit status (0 once the scheduler took it; a
        local site's workers' status)."""
        raise NotImplementedError

    def cancel(self, run: RunDir, job_ids: Sequence[str]) -> list[str]:
        """Stop the run's open jobs ``job_ids``; the ids stopped."""
        raise NotImplementedError

    def describe(self, job_id: str) -> dict[str, str] | None:
        """What the scheduler says of job ``job_id`` now (``JobState``, ``Reason``...), None
        once it knows nothing of it."""
        raise NotImplementedError

    def adopt_unrecorded(self, run: RunDir, history: RunHistory) -> RunHistory:
        """``history`` with every job of ``run`` that the scheduler holds and the journal does
        not know recorded as submitted (none where jobs cannot outlive their submit)."""
        return history


class LocalJobs(JobLauncher):
    """``scheduler: local``: the job's tasks as processes of this one
    (:mod:`hpctf.login.submitting.local`), which ends when they do."""

    kind = LocalLauncher

    def start(
        self, run: RunDir, config: ResolvedConfig, exclude: str | None, caller: Caller
    ) -> int:
        from hpctf.login.submitting import local  # its process handling: local sites only

        self.facts.check_exclude(exclude, run.path)
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
        with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) took stdout with it
            click.echo(_local_end(run, status, local.CANCELLED_EXIT))
        return status

    def cancel(self, run: RunDir, job_ids: Sequence[str]) -> list[str]:
        from hpctf.login.submitting.local_control import cancel_local

        stopped = cancel_local(run)
        return [] if stopped is None else [stopped[0]]

    def describe(self, job_id: str) -> dict[str, str] | None:
        from hpctf.login.submitting.local_control import running

        alive = job_id.isdigit() and running(int(job_id))  # a local job's id: its launcher's pid
        return {"JobId": job_id, "JobState": "RUNNING"} if alive else None


def _local_end(run: RunDir, status: int, cancelled_exit: int) -> str:
    """What a local start's end is, in one line."""
    if status == 0:
        return f"done; run directory: {run.path}"
    if status in (PREEMPTED_EXIT, cancelled_exit):
        what = "cancelled" if status == cancelled_exit else "stopped"
        return (
            f"{what} at checkpoint step {run.checkpoint_step()}; resume with: "
            f"hpctf resubmit {run.path}"
        )
    return f"failed (exit {status}); run directory: {run.path}"


class SlurmJobs(JobLauncher):
    """``scheduler: slurm``: one sbatch job per start (an array per sweep)."""

    kind = SlurmLauncher

    def submit_script(
        self,
        script: Path,
        extra: Sequence[str] = (),
        quiet: bool = False,
        owner: Path | None = None,
    ) -> str:
        """``sbatch`` ``script`` with ``extra`` options; the job id. The ``SBATCH_*`` variables
        left out of the user's shell are said on stderr (unless ``quiet``). ``owner``: the run
        or sweep directory whose job it is, written in the job's comment
        (:func:`~hpctf.core.run.run_identity.slurm_comment`)."""
        tag = [f"--comment={slurm_comment(owner)}"] if owner is not None else []
        job_id, dropped = slurm.sbatch(script, os.environ, [*tag, *extra])
        if dropped and not quiet:
            click.echo(
                f"note: left out {', '.join(dropped)} from your shell: a run's sbatch options "
                "come from its experiment and site",
                err=True,
            )
        return job_id

    def start(
        self, run: RunDir, config: ResolvedConfig, exclude: str | None, caller: Caller
    ) -> int:
        extra = [f"--exclude={exclude}"] if exclude else []
        job_id = self.submit_script(run.script, extra, owner=run.path)
        journal.record_submitted(run, job_id, exclude=exclude)
        click.echo(f"submitted job {job_id}")
        click.echo(f"run directory: {run.path}")
        return 0

    def cancel(self, run: RunDir, job_ids: Sequence[str]) -> list[str]:
        if job_ids:  # scancel of a job that has just ended succeeds too
            slurm.cancel(job_ids)
        return list(job_ids)

    def describe(self, job_id: str) -> dict[str, str] | None:
        return slurm.job_info(job_id)

    def adopt_unrecorded(self, run: RunDir, history: RunHistory) -> RunHistory:
        """A submit killed while sbatch ran (a busy controller takes seconds) leaves a job in
        Slurm that the journal never heard of: found by its comment, recorded, said.

        Not a job that a live ``hpctf resubmit`` is submitting: that one records its job
        before it hands its claim on the run over to it, so with the claim read first, the
        journal read after it holds the record (seen: two resubmits at one instant, the second
        read the journal before the first's record and wrote the job in it a second time)."""
        from hpctf.core.run.history import read_history  # pydantic's: here, as above

        if history.open_jobs:
            return history
        found = commented_jobs(slurm_comment(run.path))
        if not set(found) - {job.job_id for job in history.jobs}:
            return history
        _, owner = ownership.current(run.path)
        if owner is not None and owner.kind == "submit" and ownership.alive(owner):
            return history
        history = read_history(run)
        known = {job.job_id for job in history.jobs}
        for job_id in (j for j in found if j not in known):
            history = history.plus(journal.record_submitted(run, job_id))
            click.echo(
                f"note: job {job_id} of {run.path} was in Slurm's queue but not in the run's "
                "journal (a submit stopped while sbatch ran); recorded now",
                err=True,
            )
        return history


JOB_LAUNCHERS: dict[str, type[JobLauncher]] = {
    kind.kind.name: kind for kind in (LocalJobs, SlurmJobs)
}


def job_launcher(site: Site) -> JobLauncher:
    """The job launcher of ``site``."""
    return JOB_LAUNCHERS[site.scheduler](site)


def slurm_jobs(site: Site) -> SlurmJobs:
    """The Slurm job launcher of ``site``; a UserError when its jobs are no Slurm jobs."""
    launcher = job_launcher(site)
    if not isinstance(launcher, SlurmJobs):
        raise UserError(f"site {site.name} runs no Slurm jobs")
    return launcher
