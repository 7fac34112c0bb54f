"""The run's journal: its schema (the event names), one typed writer per event, the reading of
older names, and the job handle every writer names a job by; an entry as stored (its file's
name and order, its fields, its shape) is :mod:`hpctf.core.run.journal_entries`'.

Every writer and reader of the journal goes through this module: no event name is written
anywhere else in hpctf (a test greps for them). The journal itself is stored by
:meth:`hpctf.core.run.rundir.RunDir.record` (one file per event, written atomically) and read by
:meth:`hpctf.core.run.rundir.RunDir.read_journal`, which hands every entry to :func:`upgraded`, so
run directories written by an older hpctf read as new ones; what the events mean for a run is
decided in :mod:`hpctf.core.run.history`, the one reader of the journal for hpctf's
commands (typed events, a run's state and jobs).

Fields named ``step`` are checkpoint steps: the step a start resumes from (``started``), the
newest checkpoint when a start ended (``ended``), the agreed step the ranks saved on a warning
(``saved_on_warning``), the step saved for a planned restart (``saved_for_restart``), the step
every rank saved when a search pruned the trial (``pruned``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from hpctf.core.run.journal_entries import entry, file_name
from hpctf.core.run.journal_entries import problem as problem  # run_history reads it here
from hpctf.core.version import VERSION


class JournalDir(Protocol):
    """What the writers need of a run directory (:class:`hpctf.core.run.rundir.RunDir` has it):
    a protocol, so that the run directory may use this module to read its journal."""

    @property
    def path(self) -> Path: ...

    def record(self, event: str, *, sync: bool = True, **fields: Any) -> dict[str, Any]: ...

    def checkpoint_step(self) -> int: ...


# The events, by who writes them.
CREATED: Final = "created"  # submit: the run directory was made
SUBMITTED: Final = "submitted"  # submit, resubmit, sweep: sbatch accepted a job
CODE_UPDATED: Final = "code_updated"  # resubmit --update-code
CHECKPOINTS_DISCARDED: Final = "checkpoints_discarded"  # resubmit --from-scratch
EXTENDED: Final = "extended"  # resubmit --set: the run continued with more steps
STARTED: Final = "started"  # job-start, the local launcher: a start, and the step it resumes
SIGNALLED: Final = "signalled"  # job-signal: the batch shell got SIGTERM
NODES_DOWN: Final = "nodes_down"  # job-signal: nodes of the job Slurm says are down or drained
EXCLUDED: Final = "excluded"  # job-signal, job-end: the pending job keeps off those nodes
SAVED_ON_WARNING: Final = "saved_on_warning"  # the chief: every rank saved an agreed step
SAVED_FOR_RESTART: Final = "saved_for_restart"  # the chief: a train.restart_every_steps save
PRUNED: Final = "pruned"  # the chief: a search's pruner stopped the trial; every rank saved
ENVIRONMENT_FAILED: Final = "environment_failed"  # the chief: a full disk at save time
USER_CODE_FAILED: Final = "user_code_failed"  # a rank: the user's code raised
NODE_CHECK_FAILED: Final = "node_check_failed"  # a rank: train.preflight: quick failed a check
PEER_LOST: Final = "peer_lost"  # a rank: another stopped answering in a collective
ENDED: Final = "ended"  # job-end, the local launcher, the chief: why a start ended
REQUEUED: Final = "requeued"  # job-end: hpctf requeued the job
RELEASED: Final = "released"  # job-signal, job-end: Slurm's hold on the requeued job shortened
GAVE_UP: Final = "gave_up"  # job-start, job-end: the run's budgets say no
CANCELLED: Final = "cancelled"  # cancel, a local Ctrl-C: the user stopped the run's jobs
NOT_STARTED: Final = "not_started"  # job-start: another job owns the run; this one ended at once
NOTIFIED: Final = "notified"  # job-end, the local launcher: notify: told the owner of an event

EVENTS: Final = frozenset(
    {
        CREATED,
        SUBMITTED,
        CODE_UPDATED,
        CHECKPOINTS_DISCARDED,
        EXTENDED,
        STARTED,
        SIGNALLED,
        NODES_DOWN,
        EXCLUDED,
        SAVED_ON_WARNING,
        SAVED_FOR_RESTART,
        PRUNED,
        ENVIRONMENT_FAILED,
        USER_CODE_FAILED,
        NODE_CHECK_FAILED,
        PEER_LOST,
        ENDED,
        REQUEUED,
        RELEASED,
        GAVE_UP,
        CANCELLED,
        NOT_STARTED,
        NOTIFIED,
    }
)

# Names older hpctf wrote, read as today's. ``preempted`` was the event for a save on either
# warning, while the end reason ``preempted`` means SIGTERM only; ``node_failed`` stood beside
# the end reason ``node_fail`` for another thing.
OLD_NAMES: Final[Mapping[str, str]] = {
    "preempted": SAVED_ON_WARNING,
    "node_failed": NODES_DOWN,
    "code-updated": CODE_UPDATED,
    "checkpoints-discarded": CHECKPOINTS_DISCARDED,
}


def upgraded(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with an older hpctf's event name replaced by today's (the same dict when it
    has none)."""
    new = OLD_NAMES.get(entry.get("event"))  # type: ignore[arg-type]
    return entry if new is None else {**entry, "event": new}


def files_of(event: str) -> str:
    """A glob for the files of ``event``'s entries (:func:`file_name`)."""
    return f"*-{event}.json"


def job_handle(env: Mapping[str, str]) -> str | None:
    """The id the journal and Slurm commands take for the job of ``env`` (a job's own SLURM_*
    variables, or a local launch's); None outside a job.

    For a task of a job array (a sweep's point) that is ``<array>_<task>``, as sbatch's
    submission names it and squeue shows it. The task's own SLURM_JOB_ID is unique, but the
    last task to start gets the array's own id, and ``scontrol requeue <array id>`` requeued
    every task of the array on the test cluster (Slurm 22.05), as scancel and ``scontrol
    update`` act on all of them: the trap of Lightning-AI/pytorch-lightning#15022. The batch
    shell (job-start, job-end, the requeue), every rank (:class:`hpctf.compute.cluster.spec.
    ClusterSpec`) and ``hpctf cancel`` all use this handle."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


# The writers, one per event: the fields each event carries, named and typed. Each returns
# the entry it wrote (a command reading on extends its history with it).


def record_created(run: JournalDir, experiment: str, site: str) -> dict[str, Any]:
    return run.record(CREATED, **created_fields(run, experiment, site))


def created_fields(run: JournalDir, experiment: str, site: str) -> dict[str, Any]:
    """The fields of ``created``."""
    # run_dir: hpctf.core.run.run_identity refuses a copy of the run directory by it.
    return {"experiment": experiment, "site": site, "run_dir": str(run.path)}


def created_file(run: JournalDir, experiment: str, site: str) -> tuple[str, dict[str, Any]]:
    """The file name and entry of ``created`` for a writer that makes a run directory's files
    itself (a sweep's points, all made at once with one sync)."""
    name = file_name(time.time_ns(), os.getpid(), CREATED)
    return name, entry(CREATED, created_fields(run, experiment, site))


def record_submitted(
    run: JournalDir,
    job_id: str,
    exclude: str | None = None,
    array_job_id: str | None = None,
    array_task_id: int | None = None,
    sync: bool = True,
) -> dict[str, Any]:
    event, fields = submitted(job_id, exclude, array_job_id, array_task_id)
    return run.record(event, sync=sync, **fields)


def submitted(
    job_id: str,
    exclude: str | None = None,
    array_job_id: str | None = None,
    array_task_id: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """The event and fields of ``submitted``, for a writer that records it itself (a sweep's
    points, all at once: :func:`hpctf.core.run.bulk_create.record_unsynced`)."""
    fields: dict[str, Any] = {"job_id": job_id}
    if exclude:
        fields["exclude"] = exclude
    if array_job_id is not None:
        fields.update(array_job_id=array_job_id, array_task_id=array_task_id)
    return SUBMITTED, fields


def record_code_updated(run: JournalDir, sources: Sequence[str]) -> dict[str, Any]:
    return run.record(CODE_UPDATED, sources=list(sources))


def record_extended(
    run: JournalDir, changes: Mapping[str, Any], previous_done: Any
) -> dict[str, Any]:
    return run.record(EXTENDED, changes=dict(changes), previous_done=previous_done)


def record_checkpoints_discarded(run: JournalDir, moved_to: str) -> dict[str, Any]:
    return run.record(CHECKPOINTS_DISCARDED, moved_to=moved_to)


def record_started(
    run: JournalDir,
    job_id: str,
    nodes: str | None,
    walltime_signal: str,
    slurm_job_id: str | None = None,
    restart_count: int | None = None,
) -> dict[str, Any]:
    """A job (or a local launch) starts, from the run's newest checkpoint step; the site's
    walltime signal is kept with it, so a start killed before it could record its end is told
    a timeout from a preemption by the journal alone."""
    fields: dict[str, Any] = {"slurm_job_id": slurm_job_id} if slurm_job_id else {}
    if restart_count is not None:
        fields["restart_count"] = restart_count

    return run.record(
        STARTED,
        job_id=job_id,
        step=run.checkpoint_step(),
        nodes=nodes,
        walltime_signal=walltime_signal,
        hpctf=VERSION,  # the host's; a worker in a container compares its own with it
        **fields,
    )


def record_signalled(run: JournalDir, job_id: str, signal: str) -> dict[str, Any]:
    return run.record(SIGNALLED, job_id=job_id, signal=signal)


def record_nodes_down(
    run: JournalDir, job_id: str, nodes: Sequence[str], signal: str
) -> dict[str, Any]:
    return run.record(NODES_DOWN, job_id=job_id, nodes=list(nodes), signal=signal)


def record_excluded(run: JournalDir, job_id: str, nodes: Sequence[str]) -> dict[str, Any]:
    return run.record(EXCLUDED, job_id=job_id, nodes=list(nodes))


def record_saved_on_warning(
    run: JournalDir, job_id: str, step: int | None, signal: str
) -> dict[str, Any]:
    """The chief: every rank saved agreed step ``step`` (None: a ``train.script`` that exited
    for a requeue) after warning ``signal`` (as the site names it: USR2, TERM)."""
    return run.record(SAVED_ON_WARNING, job_id=job_id, step=step, signal=signal)


def record_saved_for_restart(run: JournalDir, job_id: str, step: int) -> dict[str, Any]:
    """The chief: every rank saved ``step``, a multiple of ``train.restart_every_steps``, and
    the job ends for a requeue (exit 75)."""
    return run.record(SAVED_FOR_RESTART, job_id=job_id, step=step)


def record_pruned(
    run: JournalDir, job_id: str, step: int, evaluation: int, metric: str, value: float | None
) -> dict[str, Any]:
    """The chief: the search's pruner stopped this trial after its ``evaluation``-th
    evaluation (``metric`` was ``value``); every rank saved agreed step ``step`` and the
    run ends ``pruned`` (its workers exit 0)."""
    return run.record(
        PRUNED, job_id=job_id, step=step, evaluation=evaluation, metric=metric, value=value
    )


def record_environment_failed(run: JournalDir, job_id: str, why: str) -> dict[str, Any]:
    return run.record(ENVIRONMENT_FAILED, job_id=job_id, why=why)


def record_user_code_failed(
    run: JournalDir, job_id: str, node: str, rank: int, error: str, at: str | None, line: str
) -> dict[str, Any]:
    return run.record(
        USER_CODE_FAILED, job_id=job_id, node=node, rank=rank, error=error, at=at, line=line
    )


def record_peer_lost(
    run: JournalDir, job_id: str, node: str, rank: int, line: str
) -> dict[str, Any]:
    """A rank (on ``node``) saw another stop answering in a collective; ``line`` names it."""
    return run.record(PEER_LOST, job_id=job_id, node=node, rank=rank, line=line)


def record_node_check_failed(
    run: JournalDir, job_id: str, node: str, rank: int, check: str, detail: str, fix: str
) -> dict[str, Any]:
    return run.record(
        NODE_CHECK_FAILED, job_id=job_id, node=node, rank=rank, check=check, detail=detail, fix=fix
    )


def record_ended(
    run: JournalDir,
    job_id: str,
    exit_code: int,
    reason: str,
    node_checks_failed: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A start ended with ``exit_code`` for ``reason``, at the run's newest checkpoint step."""
    extra: dict[str, Any] = (
        {"node_checks_failed": list(node_checks_failed)} if node_checks_failed else {}
    )
    return run.record(
        ENDED,
        job_id=job_id,
        exit_code=exit_code,
        reason=reason,
        step=run.checkpoint_step(),
        **extra,
    )


def record_ended_by_slurm(
    run: JournalDir, job_id: str, exit_code: int | None, reason: str, slurm_state: str
) -> dict[str, Any]:
    """A start whose batch shell died without recording its end, closed at the next start from
    what Slurm's accounting says of its job (``source: sacct``)."""
    return run.record(
        ENDED,
        job_id=job_id,
        exit_code=exit_code,
        reason=reason,
        step=run.checkpoint_step(),
        source="sacct",
        slurm_state=slurm_state,
    )


def record_released(run: JournalDir, job_id: str, after_s: float) -> dict[str, Any]:
    return run.record(RELEASED, job_id=job_id, after_s=after_s)


def record_not_started(run: JournalDir, job_id: str, owner: str) -> dict[str, Any]:
    return run.record(NOT_STARTED, job_id=job_id, owner=owner)


def record_requeued(
    run: JournalDir, job_id: str, why: str, in_place: bool = False
) -> dict[str, Any]:
    """``in_place``: no Slurm requeue; the batch script started the workers again in the
    same allocation (job-end's RELAUNCH_EXIT)."""
    fields = {"in_place": True} if in_place else {}
    return run.record(REQUEUED, job_id=job_id, why=why, **fields)


def record_gave_up(run: JournalDir, job_id: str, why: str) -> dict[str, Any]:
    return run.record(GAVE_UP, job_id=job_id, why=why)


def record_cancelled(run: JournalDir, jobs: Sequence[str]) -> dict[str, Any]:
    return run.record(CANCELLED, jobs=[str(job) for job in jobs])


def record_notified(
    run: JournalDir, job_id: str, notice: str, start: int, via: str
) -> dict[str, Any]:
    """``notify:``'s message of event ``notice`` for the run's ``start``-th start (counted
    from 1) went out ``via`` a webhook: a retried job-end sends it no second time."""
    return run.record(NOTIFIED, job_id=job_id, notice=notice, start=start, via=via)
