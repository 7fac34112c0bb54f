"""The words a run's history decides, as types: a run's state (:class:`RunStatus`), why one
start ended (:class:`EndReason`) and a search trial's state (:class:`TrialStatus`). Each is
decided once, in this package (:mod:`.runstate`, :mod:`.ends`, :func:`.runstate.as_seen`);
every command, the Python API, notifications and the search read that decision and compare
members, never words (``tests/test_states_typed.py`` fails on a state or a reason compared as
a string outside this package).

The members are ``str`` s: a journal, ``status --json`` and ``sweep.json`` hold their words as
they always did, and a record written by an older hpctf reads back as the same member.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """A member that prints, formats and serialises as its word (``enum.StrEnum`` is 3.11+;
    hpctf supports 3.10)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RunStatus(_Word):
    """A run's state. From the journal alone (:func:`.runstate.run_state`): queued, running,
    requeued, done, preempted (saved, not requeued: ``hpctf resubmit`` resumes it), failed,
    gave_up (over a budget, or a failure that would repeat), cancelled, pruned (a search
    stopped the trial: finished). With what the journal cannot know (:func:`.runstate.as_seen`):
    requeued (Slurm requeued the job itself), interrupted (a local run whose launcher was
    stopped after the ranks saved), failed (a local launcher gone without a word)."""

    QUEUED = "queued"
    RUNNING = "running"
    REQUEUED = "requeued"
    DONE = "done"
    PREEMPTED = "preempted"
    FAILED = "failed"
    GAVE_UP = "gave_up"
    CANCELLED = "cancelled"
    PRUNED = "pruned"
    INTERRUPTED = "interrupted"

    @property
    def final(self) -> bool:
        """Nothing will change this run unless a user resubmits it."""
        return self in FINAL_STATES

    @property
    def active(self) -> bool:
        """Queued, running, or about to run again: a run Slurm or a launcher still holds."""
        return self in ACTIVE_STATES


FINAL_STATES = frozenset(
    {
        RunStatus.DONE,
        RunStatus.FAILED,
        RunStatus.GAVE_UP,
        RunStatus.CANCELLED,
        RunStatus.INTERRUPTED,
        RunStatus.PRUNED,
    }
)
ACTIVE_STATES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.REQUEUED})


class EndReason(_Word):
    """Why one start ended (the table in :mod:`.runstate`)."""

    DONE = "done"
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    RESTART = "restart"
    STALLED = "stalled"
    FAILED = "failed"
    NODE_FAIL = "node_fail"
    CANCELLED = "cancelled"
    PRUNED = "pruned"

    @classmethod
    def of(cls, word: str | None) -> EndReason:
        """The reason a journal's ``ended`` record names; a word this hpctf does not know
        (a damaged record, a newer hpctf's) reads as ``failed``: never as a success."""
        try:
            return cls(word)
        except ValueError:
            return cls.FAILED


PREEMPTION_REASONS = frozenset({EndReason.PREEMPTED, EndReason.TIMEOUT})
FAILURE_REASONS = frozenset({EndReason.STALLED, EndReason.FAILED, EndReason.NODE_FAIL})


class RestartCause(_Word):
    """Why a run started again (inside its allocation or through a requeue), as the history
    decides it from how the start before ended (:attr:`.runstate.Start.cause`), and the budget
    it counts against (:data:`CAUSE_BUDGETS`)."""

    PREEMPTION = "preemption"  # warned by SIGTERM: every rank saved an agreed step
    WALLTIME = "walltime"  # warned before the time limit: every rank saved
    PLANNED = "planned"  # train.restart_every_steps
    WORKER_CRASHED = "worker_crashed"  # a rank exited non-zero (a crash, OOM, a signal)
    PEER_LOST = "peer_lost"  # a rank saw another stop answering in a collective
    NODE_LOST = "node_lost"  # Slurm killed the job without a warning: a node down, a requeue
    STALL = "stall"  # a rank's watchdog saw no progress
    USER_CODE = "user_code"  # the user's code raised: never restarted, theirs to fix
    ENVIRONMENT = "environment"  # a full disk or a read-only filesystem at save time: never


# Which requeue budget each cause counts against (None: none; the two never restarted: none).
CAUSE_BUDGETS: dict[RestartCause, str | None] = {
    RestartCause.PREEMPTION: "preemption",
    RestartCause.WALLTIME: "preemption",
    RestartCause.PLANNED: None,
    RestartCause.WORKER_CRASHED: "failure",
    RestartCause.PEER_LOST: "failure",
    RestartCause.NODE_LOST: "failure",
    RestartCause.STALL: "failure",
    RestartCause.USER_CODE: None,
    RestartCause.ENVIRONMENT: None,
}


class TrialStatus(_Word):
    """A search trial's state, as the study and ``hpctf status SEARCH`` show it: pending (not
    started, or started and not yet running), running, done, failed, pruned."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"

    @classmethod
    def of_run(cls, state: RunStatus) -> TrialStatus:
        """The trial's state from its run's."""
        return _TRIAL_OF_RUN.get(state, cls.PENDING)


_TRIAL_OF_RUN = {
    RunStatus.RUNNING: TrialStatus.RUNNING,
    RunStatus.DONE: TrialStatus.DONE,
    RunStatus.FAILED: TrialStatus.FAILED,
    RunStatus.PRUNED: TrialStatus.PRUNED,
    RunStatus.GAVE_UP: TrialStatus.FAILED,
}
