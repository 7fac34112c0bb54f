"""What the batch script runs around srun, never importing TensorFlow.

``job-start`` records the start (and the checkpoint step it resumes from) and refuses to go on
once the run has given up or Slurm restarted it past its failure budget; ``job-signal`` is the
batch shell's SIGTERM trap; ``job-end`` records why the start ended (done, preempted, timeout,
stalled, failed, node_fail, cancelled) and requeues the job when the run's budgets allow
(:mod:`hpctf.core.runstate` decides, from the journal alone).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import click

from hpctf.core import journal, slurm
from hpctf.core.config import ResolvedConfig
from hpctf.core.errors import GAVE_UP_EXIT, UserError
from hpctf.core.run_identity import check_not_a_copy
from hpctf.core.rundir import RunDir
from hpctf.core.runstate import Budgets, after_end, before_start, run_state

_run_dir_argument = click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))


def budgets(config: ResolvedConfig) -> Budgets:
    preemption = config.site.preemption
    return Budgets(preemption=preemption.max_requeues, failure=preemption.max_failure_requeues)


def _job_id(command: str) -> str:
    """This job's id as the journal and Slurm commands take it (:func:`journal.job_handle`)."""
    job_id = journal.job_handle(os.environ)
    if not job_id:
        raise UserError(f"SLURM_JOB_ID is not set: {command} runs inside a Slurm batch job")
    return job_id


class _GaveUp(click.ClickException):
    exit_code = GAVE_UP_EXIT


@click.command("job-start", hidden=True)
@_run_dir_argument
def job_start(run_dir: Path) -> None:
    """Record the start of a batch job in RUN_DIR; exit 1 if the run must not go on."""
    run = RunDir.open(run_dir)
    check_not_a_copy(run)
    job_id = _job_id("job-start")
    config = run.load_config()
    decision = before_start(run_state(run.events()), budgets(config))
    journal.record_started(
        run,
        job_id,
        nodes=os.environ.get("SLURM_JOB_NODELIST"),
        walltime_signal=config.site.preemption.signal,
        slurm_job_id=os.environ["SLURM_JOB_ID"] if "_" in job_id else None,
        restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    )
    if decision.go:
        return
    if decision.gave_up:
        journal.record_gave_up(run, job_id, decision.why)
        raise _GaveUp(f"hpctf: not starting job {job_id}: {decision.why}")
    click.echo(f"hpctf: not starting job {job_id}: {decision.why}")


@click.command("job-signal", hidden=True)
@_run_dir_argument
@click.argument("name")
def job_signal(run_dir: Path, name: str) -> None:
    """Record that the batch shell got signal NAME (its trap calls this); record the job's
    nodes that Slurm says are down or drained, and keep the job off them when Slurm requeued
    it (:func:`exclude_failed_nodes`)."""
    run = RunDir.open(run_dir)
    job_id = _job_id("job-signal")
    journal.record_signalled(run, job_id, name)
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        return
    try:
        failed = slurm.unusable_nodes(nodes)
    except (slurm.SlurmFailure, UserError) as exc:
        click.echo(f"hpctf: cannot tell whether a node of job {job_id} failed: {exc}", err=True)
        return
    if failed:
        journal.record_nodes_down(run, job_id, failed, name)
        exclude_failed_nodes(run, job_id)


def exclude_failed_nodes(run: RunDir, job_id: str) -> None:
    """Keep job ``job_id``, pending again after a requeue, off every node that failed under the
    run (its ExcNodeList); record it. A job that is not pending (it ended for good) is left as
    it is, with a line on stderr: ``hpctf resubmit`` leaves those nodes out as well."""
    nodes = run_state(run.events()).failed_nodes
    if not nodes:
        return
    try:
        slurm.exclude_nodes(job_id, nodes)
    except (slurm.SlurmFailure, UserError) as exc:
        click.echo(f"hpctf: job {job_id} keeps its nodes: {exc}", err=True)
        return
    journal.record_excluded(run, job_id, nodes)
    click.echo(f"hpctf: job {job_id} will not start on failed node(s) {','.join(nodes)}")


@click.command("job-end", hidden=True)
@_run_dir_argument
@click.option("--exit-code", type=int, required=True)
def job_end(run_dir: Path, exit_code: int) -> None:
    """Record why the batch job's training step ended in RUN_DIR; requeue it when the run's
    budgets allow, recording the requeue only once Slurm has accepted it."""
    run = RunDir.open(run_dir)
    config = run.load_config()
    job_id = _job_id("job-end")
    run.record_end(job_id, exit_code, config.site.preemption.signal)
    decision = after_end(run_state(run.events()), budgets(config))
    if decision.go:
        # scontrol requeue ends this very job: Slurm sends SIGTERM to the batch script's
        # processes, this one included (SIGKILL after KillWait). Hold it off until the requeue
        # Slurm accepted is recorded; a SlurmFailure leaves no "requeued" record behind.
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            slurm.requeue(job_id)
            journal.record_requeued(run, job_id, decision.why)
            exclude_failed_nodes(run, job_id)
        finally:
            signal.signal(signal.SIGTERM, previous)
        click.echo(f"hpctf: job {job_id} requeued: {decision.why}")
    elif not decision.gave_up:
        click.echo(f"hpctf: job {job_id} ended: {decision.why}")
    elif decision.gave_up:
        journal.record_gave_up(run, job_id, decision.why)
        message = f"hpctf: job {job_id} not requeued: {decision.why}"
        if "hpctf resubmit" not in decision.why:  # a full disk's line already says it
            message += f"; after a fix, resume with hpctf resubmit {run.path}"
        raise _GaveUp(message)


COMMANDS = (job_start, job_signal, job_end)
