"""The run's jobs, folded from its starts (:func:`hpctf.core.run.runstate.starts_of`): one row per
job for ``hpctf status``, and the jobs ``hpctf cancel`` and ``resubmit`` must look at."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpctf.core.run import journal
from hpctf.core.run.runstate import starts_of


@dataclass(frozen=True)
class Job:
    """One job of the run, folded from its starts: how often it started, on which nodes, and
    whether its last start ended for good (not requeued since)."""

    job_id: str
    starts: int = 0
    nodes: str | None = None
    ended: bool = False
    exit_code: int | None = None


def jobs_of(events: Sequence[Mapping[str, Any]]) -> list[Job]:
    """One row per job of the run, in the order they were submitted or started: its starts
    (1 + requeues), the last start's nodes, whether that start ended (and was not requeued)."""
    jobs: dict[str, Job] = {}
    for event in events:
        if event.get("event") == journal.SUBMITTED and event.get("job_id") is not None:
            jobs.setdefault(str(event["job_id"]), Job(str(event["job_id"])))
    for start in starts_of(events):
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


def cancelled_by_user(events: Sequence[Mapping[str, Any]], job_id: str) -> bool:
    """Whether the user cancelled job ``job_id`` (hpctf cancel, a local Ctrl-C)."""
    return any(e.get("event") == journal.CANCELLED and job_id in e.get("jobs", ()) for e in events)


def open_jobs(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The run's jobs that may still be queued or running: not ended, not cancelled."""
    return [
        job.job_id
        for job in jobs_of(events)
        if not job.ended and not cancelled_by_user(events, job.job_id)
    ]
