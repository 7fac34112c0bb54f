"""How one start of a run ended, from the journal's events since it began (pure): the reasons
a start can end for, :func:`end_of_start` (the batch shell's ``job-end``, and a start closed
without a record), :func:`reason_from_slurm` (a start whose batch shell died, closed from
Slurm's accounting) and the nodes that failed a quick check, over the typed events of
:mod:`.events`. :mod:`.runstate` folds the starts into the run's state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpctf.core.errors import PREEMPTED_EXIT, STALLED_EXIT
from hpctf.core.run.history.events import (
    Cancelled,
    Event,
    NodeCheckFailed,
    Pruned,
    SavedForRestart,
    SavedOnWarning,
    Signalled,
    Started,
)
from hpctf.core.run.history.states import (
    EndReason,
    RunStatus,
)

REASONS = tuple(EndReason)
PRUNED = EndReason.PRUNED  # a search's pruner stopped the trial: saved, finished, never requeued
PLANNED_RESTART = EndReason.RESTART  # train.restart_every_steps: requeued, no budget used
# The walltime signal of a start recorded by an hpctf that did not keep it (the site default).
OLD_WALLTIME_SIGNAL = "USR2"


def end_reason(
    exit_code: int,
    done: bool,
    warned_by: str | None,
    signalled: bool,
    cancelled: bool,
    walltime_signal: str = "USR2",
) -> EndReason:
    """Why a start ended. ``warned_by`` is the signal the ranks saved on (None if they did
    not; ``walltime_signal`` is the site's warning before the time limit), ``signalled``
    whether the batch shell got SIGTERM, ``cancelled`` whether the user cancelled the run
    during this start."""
    if done and exit_code == 0:
        return EndReason.DONE
    # Before the warnings: scancel sends SIGTERM, which the ranks take as a warning and save on.
    if cancelled:
        return EndReason.CANCELLED
    if warned_by is not None or exit_code == PREEMPTED_EXIT:
        return EndReason.TIMEOUT if warned_by == walltime_signal != "TERM" else EndReason.PREEMPTED
    if exit_code == STALLED_EXIT:
        return EndReason.STALLED
    # Only the batch shell's own SIGTERM says "killed from outside": srun reports 143 or 137
    # too when --kill-on-bad-exit ended the other ranks after one of them failed.
    if signalled:
        return EndReason.NODE_FAIL
    return EndReason.FAILED if exit_code != 0 else EndReason.DONE


def since_last_start(events: Sequence[Event]) -> tuple[Event, ...]:
    """The events after the last ``started`` record (all of them when there is none)."""
    last = max((i for i, e in enumerate(events) if isinstance(e, Started)), default=-1)
    return tuple(events[last + 1 :])


def saved_on_warning(events: Sequence[Event]) -> SavedOnWarning | None:
    """The chief's last ``saved_on_warning`` record among ``events``, or None."""
    return next((e for e in reversed(events) if isinstance(e, SavedOnWarning)), None)


def saved_for_restart(events: Sequence[Event]) -> SavedForRestart | None:
    """The chief's last ``saved_for_restart`` record among ``events`` (a planned restart,
    ``train.restart_every_steps``), or None."""
    return next((e for e in reversed(events) if isinstance(e, SavedForRestart)), None)


def pruned_in(events: Sequence[Event]) -> Pruned | None:
    """The chief's ``pruned`` record among ``events`` (a search pruned the trial), or None."""
    return next((e for e in reversed(events) if isinstance(e, Pruned)), None)


def pruning_words(event: Pruned) -> str:
    """Where a trial was pruned, in words: ``at evaluation 2 (step 20): eval.loss 0.4321``."""
    value = "" if event.value is None else f": {event.metric} {event.value:.6g}"
    return f"at evaluation {event.evaluation} (step {event.step}){value}"


def end_of_start(
    events: Sequence[Event], exit_code: int | None, done: bool, walltime_signal: str
) -> EndReason:
    """Why a start ended (:func:`end_reason`), from ``events``, the journal since its
    ``started`` record. ``exit_code`` None: the start recorded no end, its batch shell was
    killed first (Slurm requeued the job: a preemption, a lost node, ``scontrol requeue``);
    then it ended ``preempted`` or ``timeout`` when the ranks saved an agreed step, else
    ``node_fail``. A start whose ranks saved for a planned restart ended ``restart`` unless it
    was cancelled or the run is done. A start whose chief recorded that the search pruned the
    trial ended ``pruned`` unless it was cancelled or a rank failed after the save."""
    cancelled = any(isinstance(e, Cancelled) for e in events)
    if pruned_in(events) is not None and exit_code in (0, None, PREEMPTED_EXIT):
        return EndReason.CANCELLED if cancelled else PRUNED
    if saved_for_restart(events) is not None and exit_code in (None, PREEMPTED_EXIT):
        return EndReason.CANCELLED if cancelled else EndReason.DONE if done else EndReason.RESTART
    saved = saved_on_warning(events)
    warned = None if saved is None else saved.signal or "TERM"
    if exit_code is None:
        if warned is None:
            return EndReason.NODE_FAIL
        exit_code = PREEMPTED_EXIT
    return end_reason(
        exit_code,
        done=done,
        warned_by=warned,
        signalled=any(isinstance(e, Signalled) for e in events),
        cancelled=cancelled,
        walltime_signal=walltime_signal,
    )


def local_stop(events: Sequence[Event]) -> RunStatus:
    """What stopped the last start of a local run, in a word: ``cancelled`` (Ctrl-C, ``hpctf
    cancel``: its launcher recorded it) or ``interrupted`` (SIGTERM or SIGHUP to the launcher,
    or its end). Never "preempted" or "requeued": nothing preempts or requeues a local run."""
    cancelled = any(isinstance(e, Cancelled) for e in since_last_start(events))
    return RunStatus.CANCELLED if cancelled else RunStatus.INTERRUPTED


def failed_node_checks(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Which nodes failed a check of ``train.preflight: quick`` among ``events``: srun's exit
    status cannot say (it reports the ranks it killed afterwards, 143 or 137), the ranks'
    records can."""
    return [
        {"node": e.node, "rank": e.rank, "check": e.check}
        for e in events
        if isinstance(e, NodeCheckFailed)
    ]


def reason_from_slurm(
    slurm_state: str, saved_signal: str | None, done: bool, walltime_signal: str
) -> EndReason:
    """Why a start ended whose batch shell died without a record (with its node), from what
    Slurm (sacct) says of its job: ``slurm_state`` (COMPLETED, FAILED, NODE_FAIL, ...),
    ``saved_signal`` the signal the ranks saved on during that start (None: no save), ``done``
    whether the run is complete, ``walltime_signal`` the site's warning before the time limit."""
    if done and slurm_state == "COMPLETED":
        return EndReason.DONE
    if slurm_state == "CANCELLED":
        return EndReason.CANCELLED
    if saved_signal is not None:
        return EndReason.TIMEOUT if saved_signal == walltime_signal else EndReason.PREEMPTED
    if slurm_state in ("FAILED", "OUT_OF_MEMORY", "COMPLETED"):
        return EndReason.FAILED
    return EndReason.NODE_FAIL  # NODE_FAIL, BOOT_FAIL, TIMEOUT or PREEMPTED without a save
