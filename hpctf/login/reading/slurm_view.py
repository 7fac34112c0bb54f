"""What Slurm says of a run's jobs: ONE ``squeue`` call, then ONE ``sacct`` call for the jobs
slurmctld has forgotten (MinJobAge), however many runs a command shows, so a user with fifty
runs never floods slurmctld; then the run directory's own journal, so a forgotten job still
shows how it ended. Slurm down or slow is one line on stderr, and the journal's view.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from hpctf.core.run.listing import RunFacts
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.scheduler.slurm_queries import (
    JobRecord,
    sacct_jobs,
    shared_user_queue,
    squeue_jobs,
)
from hpctf.login.reading.runs import ACTIVE_RUN_STATES

# Slurm's states of a job back in the queue after a requeue.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


@dataclass
class SlurmView:
    """What Slurm said of some jobs, and what could not be asked (one line for stderr)."""

    records: dict[str, JobRecord]
    answered: bool
    problem: str = ""


# How old a watcher's view of its user's queue may be (logs -f, Run.wait, Sweep.wait): the
# watchers of one user on one host share one squeue --me of at most this age.
WATCH_SHARE_S = 30.0


def slurm_records(
    job_ids: Sequence[str],
    env: Mapping[str, str] | None = None,
    shared_s: float | None = None,
) -> SlurmView:
    """Ask ONE squeue about ``job_ids``, then ONE sacct about the ones squeue no longer knows.
    ``shared_s`` (a watcher of the caller's own jobs): squeue's answer from the user's shared
    queue snapshot of at most that age (:func:`shared_user_queue`) instead of a query of its
    own.

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
        if shared_s is None:
            records.update(squeue_jobs(ids, env))
        else:
            queue = shared_user_queue(_queue_folder(env or os.environ), shared_s, env)
            # Asked of squeue itself: a job the snapshot lacks (submitted after it, or
            # forgotten since), and one it says ended, which a watcher would act on (Slurm may
            # have requeued it since: a node failure).
            fresh = [job for job in ids if job not in queue or queue[job].final]
            records.update({job: queue[job] for job in ids if job not in fresh})
            records.update(squeue_jobs(fresh, env))
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


def _queue_folder(env: Mapping[str, str]) -> Path:
    """Where the user's shared queue snapshot is kept: their own cache."""
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "hpctf" / "queue"


def watch_share(paths: Sequence[str | Path]) -> float | None:
    """How old a watcher's view of the queue may be for the runs at ``paths``
    (:data:`WATCH_SHARE_S`), or None when one of them is not the caller's: squeue --me knows
    only the caller's jobs."""
    try:
        mine = all(os.stat(path).st_uid == os.getuid() for path in paths)
    except OSError:
        return None
    return WATCH_SHARE_S if mine else None


def job_states(runs: Sequence[RunFacts], all_jobs: bool, watching: bool = False) -> SlurmView:
    """What Slurm says of the runs' current jobs (``all_jobs``: every job of each). A watcher
    (``watching``) of the caller's own runs shares the user's queue snapshot
    (:data:`WATCH_SHARE_S`) instead of asking slurmctld each look."""
    ids: list[str] = []
    for run in runs:
        if run.slurm:
            ids.extend(run.state.jobs if all_jobs else [run.job] if run.job else [])
    shared = watch_share([run.path for run in runs]) if watching else None
    view = slurm_records(ids, shared_s=shared)
    if view.problem:
        click.echo(view.problem, err=True)
    return view


def slurm_state(run: RunFacts, job_id: str | None, view: SlurmView) -> dict[str, str] | None:
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
    if job_id in run.cancelled_jobs:
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
