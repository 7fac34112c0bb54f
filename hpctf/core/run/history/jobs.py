"""The run's jobs, folded from its starts (:func:`.runstate.starts_of`): one row per job for
``hpctf status``, and the jobs ``hpctf cancel`` and ``resubmit`` must look at."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpctf.core.run.history.events import Cancelled, Event, Submitted
from hpctf.core.run.history.runstate import Start


@dataclass(frozen=True)
class Job:
    """One job of the run, folded from its starts: how often it started, on which nodes, and
    whether its last start ended for good (not requeued since)."""

    job_id: str
    starts: int = 0
    nodes: str | None = None
    ended: bool = False
    exit_code: int | None = None


def jobs_of(events: Sequence[Event], starts: Sequence[Start]) -> list[Job]:
    """One row per job of the run, in the order they were submitted or started: its starts
    (1 + requeues), the last start's nodes, whether that start ended (and was not requeued).
    ``starts``: :func:`.runstate.starts_of` of ``events``."""
    jobs: dict[str, Job] = {}
    for event in events:
        if isinstance(event, Submitted) and event.job_id is not None:
            jobs.setdefault(event.job_id, Job(event.job_id))
    for start in starts:
        job = jobs.get(start.job_id) or Job(start.job_id)
        ended = start.ended_at is not None and not start.requeued
        jobs[start.job_id] = Job(
            start.job_id,
            starts=job.starts + 1,
            nodes=start.nodes,
            ended=ended,
            exit_code=start.exit_code if ended else None,
        )
    return list(jobs.values())


def cancelled_by_user(events: Sequence[Event], job_id: str) -> bool:
    """Whether the user cancelled job ``job_id`` (hpctf cancel, a local Ctrl-C)."""
    return any(isinstance(e, Cancelled) and job_id in e.jobs for e in events)


def open_jobs(events: Sequence[Event], jobs: Sequence[Job]) -> list[str]:
    """The run's jobs (``jobs``: :func:`jobs_of` them) that may still be queued or running:
    not ended, not cancelled."""
    return [
        job.job_id for job in jobs if not job.ended and not cancelled_by_user(events, job.job_id)
    ]
