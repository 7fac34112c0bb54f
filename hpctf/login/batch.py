"""What the batch script runs around srun: ``job-start`` and ``job-end`` record the job in the
run directory's journal, and ``job-end`` requeues a job whose ranks stopped at an agreed
preemption checkpoint. They run on the job's first node but never import TensorFlow."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hpctf.core import slurm
from hpctf.core.errors import UserError
from hpctf.core.rundir import RunDir, preempted_in_last_start


@click.command("job-start", hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def job_start(run_dir: Path) -> None:
    """Record the start of a batch job in RUN_DIR (called by the batch script)."""
    run = RunDir.open(run_dir)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UserError("SLURM_JOB_ID is not set: job-start runs inside a Slurm batch job")
    run.record(
        "started",
        job_id=job_id,
        nodes=os.environ.get("SLURM_JOB_NODELIST"),
        restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    )


@click.command("job-end", hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--exit-code", type=int, required=True)
def job_end(run_dir: Path, exit_code: int) -> None:
    """Record the end of a batch job's training step in RUN_DIR; requeue it when its ranks
    stopped at an agreed preemption checkpoint, within the site's preemption.max_requeues."""
    run = RunDir.open(run_dir)
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


COMMANDS = (job_start, job_end)
