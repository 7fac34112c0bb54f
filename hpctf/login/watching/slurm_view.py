"""What Slurm says of a run's jobs: ONE ``squeue`` call, then ONE ``sacct`` call for the jobs
slurmctld has forgotten (MinJobAge), however many runs a command shows, so a user with fifty
runs never floods slurmctld; then the run directory's own journal, so a forgotten job still
shows how it ended. Slurm down or slow is one line on stderr, and the journal's view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import click

from hpctf.core.run.jobs import cancelled_by_user
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.scheduler.slurm_queries import JobRecord, sacct_jobs, squeue_jobs
from hpctf.login.watching.runs import ACTIVE_RUN_STATES, Run

# Slurm's states of a job back in the queue after a requeue.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


@dataclass
class SlurmView:
    """What Slurm said of some jobs, and what could not be asked (one line for stderr)."""

    records: dict[str, JobRecord]
    answered: bool
    problem: str = ""


def slurm_records(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> SlurmView:
    """Ask ONE squeue about ``job_ids``, then ONE sacct about the ones squeue no longer knows.

    A failing query (Slurm down, slow, not installed) is no error here: what was learned is
    returned, with ``problem`` saying in one line what could not be asked.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return SlurmView({}, True)
    records: dict[str, JobRecord] = {}
    problems = []
    answered = True
    try:
        records.update(squeue_jobs(ids, env))
    except SlurmFailure as exc:
        problems.append(f"squeue: {exc}")
        answered = False
    missing = [i for i in ids if i not in records]
    if missing:
        try:
            records.update(sacct_jobs(missing, env))
        except SlurmFailure as exc:
            problems.append(f"sacct: {exc}")
    problem = ""
    if problems:
        problem = (
            f"hpctf: Slurm did not answer ({'; '.join(problems)}); "
            "showing what the run directories recorded"
        )
    return SlurmView(records, answered, problem)


def job_states(runs: Sequence[Run], all_jobs: bool) -> SlurmView:
    ids: list[str] = []
    for run in runs:
        if run.slurm:
            ids.extend(run.state.jobs if all_jobs else [run.job] if run.job else [])
    view = slurm_records(ids)
    if view.problem:
        click.echo(view.problem, err=True)
    return view


def slurm_state(run: Run, job_id: str | None, view: SlurmView) -> dict[str, str] | None:
    """The state of one job of ``run``: Slurm's word when squeue or sacct knows the job, else
    the end the journal recorded (``ENDED`` and its reason), else UNKNOWN. None on local
    sites."""
    if not run.slurm:
        return None
    if job_id is None:
        return {"state": "", "reason": "not submitted", "source": "journal"}
    record = view.records.get(job_id)
    if record is not None:
        state = {"state": record.state, "reason": record.reason, "source": record.source}
        if record.state in REQUEUED_STATES and record.start:
            state["start"] = record.start  # squeue's expected start of a pending job
        return state
    starts = [s for s in run.state.starts if s.job_id == job_id]
    requeued = job_id == run.job and run.state.state in ACTIVE_RUN_STATES  # not over yet
    if starts and starts[-1].reason is not None and not requeued:
        return {"state": "ENDED", "reason": starts[-1].reason, "source": "journal"}
    if cancelled_by_user(run.events, job_id):
        return {"state": "ENDED", "reason": "cancelled", "source": "journal"}
    reason = "gone from Slurm" if view.answered else "Slurm did not answer"
    return {"state": "UNKNOWN", "reason": reason, "source": "journal"}


def slurm_text(state: Mapping[str, str] | None) -> str:
    if state is None:
        return "local"
    if not state["state"]:
        return "-"
    reason = f" ({state['reason']})" if state["reason"] else ""
    return f"{state['state']}{reason}"
