"""A run's history: its journal read once, as typed events, and everything a reader asks of it
(state, starts, jobs, failed nodes, saves on warning, extensions), derived once on demand.

Every command reads a run's journal once (:func:`read_history`) and hands the
:class:`RunHistory` to whatever needs it; a command that writes a record and reads on (job-end
after its ``ended`` record) extends the history it has with the entry it wrote
(:meth:`RunHistory.plus`) instead of reading the journal again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from hpctf.core.errors import DamagedRecord
from hpctf.core.run import journal
from hpctf.core.run.history import ends
from hpctf.core.run.history.events import (
    Cancelled,
    Created,
    Event,
    Extended,
    Notified,
    Pruned,
    SavedForRestart,
    SavedOnWarning,
    Started,
    Submitted,
    typed,
)
from hpctf.core.run.history.jobs import Job, cancelled_by_user, jobs_of, open_jobs
from hpctf.core.run.history.runstate import RunState, Start, run_state, starts_of
from hpctf.core.run.history.states import EndReason
from hpctf.core.run.rundir import RunDir


@dataclass(frozen=True)
class RunHistory:
    """The typed events of one run's journal, oldest first, and one line per entry left out
    as damaged (:meth:`hpctf.core.run.rundir.RunDir.read_journal`). What is derived from
    them is computed once, when first asked."""

    events: tuple[Event, ...] = ()
    damaged: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, entries: Iterable[Mapping[str, Any] | Event], damaged: Sequence[str] = ()
    ) -> RunHistory:
        """The history of journal entries (as read, or already typed)."""
        return cls(typed(entries), tuple(damaged))

    def plus(self, entry: Mapping[str, Any] | Event) -> RunHistory:
        """This history and one entry more: the one this process has just written."""
        return RunHistory((*self.events, *typed([entry])), self.damaged)

    @cached_property
    def state(self) -> RunState:
        """The run's state from the journal alone (:func:`.runstate.run_state`)."""
        return run_state(self.events)

    @property
    def starts(self) -> tuple[Start, ...]:
        return self.state.starts

    @property
    def last_start(self) -> Start | None:
        return self.state.last

    @property
    def job_ids(self) -> tuple[str, ...]:
        """Every job the journal names, in the order it first did."""
        return self.state.jobs

    @property
    def job(self) -> str | None:
        """The run's current job: the last one submitted or started."""
        return self.state.jobs[-1] if self.state.jobs else None

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        return self.state.failed_nodes

    @cached_property
    def jobs(self) -> tuple[Job, ...]:
        """One row per job (:func:`.jobs.jobs_of`)."""
        return tuple(jobs_of(self.events, self.starts))

    @property
    def open_jobs(self) -> list[str]:
        """The jobs that may still be queued or running: not ended, not cancelled."""
        return open_jobs(self.events, self.jobs)

    def cancelled_by_user(self, job_id: str) -> bool:
        return cancelled_by_user(self.events, job_id)

    @property
    def cancelled_jobs(self) -> tuple[str, ...]:
        """Every job the user cancelled (hpctf cancel, a local Ctrl-C), each once."""
        jobs = (job for e in self.events if isinstance(e, Cancelled) for job in e.jobs)
        return tuple(dict.fromkeys(jobs))

    def closed_last_start(self) -> Start | None:
        """The last start, closed as its next start will close it when it recorded no end
        (its job is back in Slurm's queue)."""
        starts = starts_of(self.events, close_last=True)
        return starts[-1] if starts else None

    @property
    def created(self) -> Created | None:
        return next((e for e in self.events if isinstance(e, Created)), None)

    @property
    def last_time(self) -> str | None:
        """The time of the newest entry (None: an empty journal)."""
        return self.events[-1].time if self.events else None

    @property
    def submissions(self) -> tuple[Submitted, ...]:
        return tuple(e for e in self.events if isinstance(e, Submitted))

    @property
    def extensions(self) -> tuple[Extended, ...]:
        """``resubmit --set train.steps=N`` records, oldest first."""
        return tuple(e for e in self.events if isinstance(e, Extended))

    @cached_property
    def since_last_start(self) -> tuple[Event, ...]:
        return ends.since_last_start(self.events)

    @property
    def saved_on_warning(self) -> SavedOnWarning | None:
        """The chief's save on a warning during the last start, or None."""
        return ends.saved_on_warning(self.since_last_start)

    @property
    def saved_for_restart(self) -> SavedForRestart | None:
        """The chief's save for a planned restart during the last start, or None."""
        return ends.saved_for_restart(self.since_last_start)

    @property
    def pruned(self) -> Pruned | None:
        """Where a search pruned the trial (the chief's record), in any start, or None."""
        return ends.pruned_in(self.events)

    @property
    def since_last_start_pruned(self) -> bool:
        """Whether the chief recorded, during the last start, that a search pruned the trial."""
        return ends.pruned_in(self.since_last_start) is not None

    def notified(self, notice: str, start: int) -> bool:
        """Whether ``notify:``'s message of ``notice`` about the ``start``-th start went out."""
        return any(
            isinstance(e, Notified) and e.notice == notice and e.start == start for e in self.events
        )

    def slurm_job_ids(self, job_id: str) -> list[str]:
        """The SLURM_JOB_ID each start of job ``job_id`` recorded (an array task's own)."""
        return [
            e.slurm_job_id
            for e in self.events
            if isinstance(e, Started) and e.job_id == job_id and e.slurm_job_id
        ]

    def require_whole(self) -> None:
        """A DamagedRecord naming the first damaged journal entry, for commands that act on the
        run's jobs (cancel, resubmit): acting on a partial view could miss a running job."""
        if self.damaged:
            more = f" (and {len(self.damaged) - 1} more)" if len(self.damaged) > 1 else ""
            raise DamagedRecord(
                f"damaged journal entry {self.damaged[0]}{more}: hpctf did not write it; move "
                "it out of the journal directory and run the command again"
            )

    def local_stop(self) -> str:
        """What stopped the last start of a local run (:func:`.ends.local_stop`)."""
        return ends.local_stop(self.events)

    def version_started(self, job_id: str) -> str | None:
        """The hpctf version the latest start of job ``job_id`` recorded (the host's)."""
        started = [e for e in self.events if isinstance(e, Started) and e.job_id == job_id]
        return started[-1].hpctf if started else None

    def end_of_last_start(
        self, exit_code: int, done: bool, walltime_signal: str
    ) -> tuple[EndReason, list[dict[str, Any]]]:
        """Why the last start ended with ``exit_code`` (:func:`.ends.end_of_start`) and the
        nodes that failed a quick check during it."""
        since = self.since_last_start
        return (
            ends.end_of_start(since, exit_code, done, walltime_signal),
            ends.failed_node_checks(since),
        )


def read_history(run: RunDir) -> RunHistory:
    """``run``'s journal, read once (damaged entries left out and named)."""
    entries, damaged = run.read_journal()
    return RunHistory.of(entries, damaged)


def made_in(run: RunDir) -> Path | None:
    """The directory the run's journal says it was created in (None for runs made before this
    was recorded, or without a readable ``created`` record). Reads that one record only: every
    worker of a job asks, and a journal on a parallel filesystem may hold hundreds."""
    try:
        first = min(run.journal.glob(journal.files_of(journal.CREATED)), default=None)
        entry = json.loads(first.read_bytes().decode("utf-8")) if first else None
    except (OSError, ValueError):
        return None
    if journal.problem(entry) is not None or not isinstance(entry, dict):
        return None
    where = entry.get("run_dir")
    return Path(where) if isinstance(where, str) and where else None


def record_end_read(
    run: RunDir, job_id: str, exit_code: int, walltime_signal: str
) -> EndReason:
    """:func:`record_end` for a command that has not read the run's journal yet (the local
    launcher, a chief whose launcher is gone): read once here; returns the reason."""
    return record_end(run, read_history(run), job_id, exit_code, walltime_signal)[0]


def record_end(
    run: RunDir, history: RunHistory, job_id: str, exit_code: int, walltime_signal: str
) -> tuple[EndReason, RunHistory]:
    """A start ended with ``exit_code``: record why (:meth:`RunHistory.end_of_last_start`),
    the checkpoint step reached and the nodes that failed a quick check. ``history`` is the
    run's, read by this command. Returns the reason and the history with the record."""
    reason, checks = history.end_of_last_start(exit_code, run.done.exists(), walltime_signal)
    return reason, history.plus(journal.record_ended(run, job_id, exit_code, reason, checks))
