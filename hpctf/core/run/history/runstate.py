"""A run's state, derived from its journal alone: a pure function, and the requeue decision.

The journal holds one event per fact (:mod:`hpctf.core.run.journal` names them and writes them):
``submitted``, ``started`` (with the checkpoint step the start resumes from and the site's
walltime signal), ``saved_on_warning`` (the chief saved an agreed step after a warning),
``signalled`` (the batch shell got SIGTERM), ``nodes_down`` (nodes of the job that Slurm said
were down or drained when it was killed), ``ended`` (with its reason, exit code and step),
``requeued``, ``gave_up``, ``cancelled``, ``not_started`` (a job that found the run owned by
another ended at once: no start of the run). This package (:mod:`hpctf.core.run.history`) is the
one interpreter of it: :mod:`.events` types the entries, :mod:`.ends` says how one start ended
(:func:`~.ends.end_of_start`), this module gives every start with its times
(:func:`starts_of`) and the run's state (:func:`run_state`), :mod:`.jobs` folds the starts
into jobs; the commands that show a run (status, logs, cancel) take a
:class:`~hpctf.core.run.history.RunHistory` and derive their views from it. Nothing else is
consulted, so
``hpctf status`` and the batch script always agree on what happened; the one exception is what
Slurm's queue adds to the view of ``hpctf status`` (a job that Slurm requeued itself before its
batch shell could say so), applied in one place:
:func:`hpctf.login.reading.run_report.with_slurm_queue`.

Ends, by reason:

========== ========================================================== ====================
reason     what happened                                              budget it uses
========== ========================================================== ====================
done       training complete                                          --
preempted  warned by SIGTERM (preemption); all ranks saved one step   preemption
timeout    warned by the walltime signal; all ranks saved one step    preemption
restart    a planned restart (``train.restart_every_steps``); all     --
           ranks saved that step
stalled    a rank's watchdog saw no progress (exit 124)               failure, if advanced
failed     a rank exited non-zero (a crash, an exception, OOM)        failure, if advanced
node_fail  the job was killed from outside without a warning: a node  failure
           lost, ``scontrol requeue``, an unwarned preemption
cancelled  ``hpctf cancel`` or scancel                                --
pruned     a search's pruner stopped the trial; all ranks saved one   -- (finished, never
           step and exited 0                                          requeued)
========== ========================================================== ====================

A start that the environment stopped (the chief recorded ``environment_failed``: a full disk
at save time) is not requeued: it would fail again at the next save. Nor is a start that the
user's code stopped (a rank recorded ``user_code_failed``: the entry, a data function, a loss
raised): it would raise again; its line is the run's why.
A crash or a stall is requeued only when the run advanced (its checkpoint step grew) during
that start: an entry that raises at step 0 gives up at once instead of burning allocations. A
node failure is not the code's fault and is retried within the failure budget alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpctf.core.errors import exit_text
from hpctf.core.run.history.ends import (
    FAILURE_REASONS,
    OLD_WALLTIME_SIGNAL,
    PLANNED_RESTART,
    PREEMPTION_REASONS,
    PRUNED,
    end_of_start,
    pruned_in,
    pruning_words,
    saved_on_warning,
    since_last_start,
)
from hpctf.core.run.history.events import (
    Cancelled,
    Ended,
    EnvironmentFailed,
    Event,
    Extended,
    GaveUp,
    NodesDown,
    NotStarted,
    Pruned,
    Requeued,
    Signalled,
    Started,
    Submitted,
    UserCodeFailed,
    typed,
)


@dataclass(frozen=True)
class Budgets:
    """How many times one run may be requeued, by kind of end."""

    preemption: int
    failure: int


@dataclass(frozen=True)
class Start:
    """One start of a job: what it resumed from and how it ended (None: not ended yet)."""

    job_id: str
    step: int
    reason: str | None = None
    exit_code: int | None = None
    end_step: int | None = None
    nodes: str | None = None
    # What the chief said when the environment stopped the start (a full disk at save time).
    environment: str | None = None
    # The line of the first rank that recorded an exception raised in the user's code.
    user_code: str | None = None
    # Where a search pruned the trial during this start, in words (pruning_words).
    pruned: str | None = None
    # When it started, when it recorded its end (None: it did not), its last record's time.
    started_at: str = ""
    ended_at: str | None = None
    last_at: str = ""
    # hpctf requeued its job after it ended; job-start refused to go on (it ran no worker);
    # the batch shell got SIGTERM (Slurm is ending the job itself).
    requeued: bool = False
    refused: bool = False
    signalled: bool = False

    @property
    def advanced(self) -> bool:
        return self.end_step is not None and self.end_step > self.step

    @property
    def left_to_slurm(self) -> bool:
        """Slurm ended this start itself (the batch shell got SIGTERM: a preemption, a lost
        node, ``scontrol requeue``) or it ended without a word (``node_fail``) and it did not
        end well: whether the job comes back is Slurm's to say (its requeue), not hpctf's."""
        return self.reason not in ("done", "cancelled", PRUNED) and (
            self.signalled or self.reason == "node_fail"
        )


@dataclass(frozen=True)
class RunState:
    """``state`` is one of queued, running, requeued, done, preempted (saved, not requeued),
    failed, gave_up, cancelled, pruned (a search stopped the trial: finished)."""

    state: str
    why: str = ""
    starts: tuple[Start, ...] = ()
    preemption_requeues: int = 0
    failure_requeues: int = 0
    jobs: tuple[str, ...] = field(default=())
    # Nodes that failed under one of the run's jobs, in the order they did: every later start
    # leaves them out (the requeued job's ExcNodeList, resubmit's --exclude).
    failed_nodes: tuple[str, ...] = ()

    @property
    def last(self) -> Start | None:
        return self.starts[-1] if self.starts else None


def starts_of(events: Sequence[Event | Mapping[str, Any]], close_last: bool = False) -> list[Start]:
    """Every start of every job of the run, in order, with how each ended and when
    (``events``: typed, or journal entries, parsed here).

    A start whose job was started again without an ``ended`` record had its batch shell killed
    before it could say so: it is closed by :func:`~.ends.end_of_start` with no exit code, at
    the step the chief recorded when the ranks saved an agreed step. ``close_last``: close the
    last start so too, when something outside the journal says its job is back in the queue.
    """
    starts: list[Start] = []
    since: list[Event] = []
    walltime = OLD_WALLTIME_SIGNAL
    for event in typed(events):
        if isinstance(event, Started):
            _close(starts, since, walltime)
            since = []
            walltime = event.walltime_signal or OLD_WALLTIME_SIGNAL
            starts.append(
                Start(
                    job_id=str(event.job_id),
                    step=event.step,
                    nodes=event.nodes,
                    started_at=event.time,
                    last_at=event.time,
                )
            )
            continue
        since.append(event)
        if starts:
            starts[-1] = _with(replace(starts[-1], last_at=event.time), event, len(since) == 1)
            if isinstance(event, Requeued):
                _mark_requeued(starts, str(event.job_id))
    if close_last:
        _close(starts, since, walltime)
    return starts


def _close(starts: list[Start], since: Sequence[Event], walltime: str) -> None:
    """Close the last start if it recorded no end: its batch shell was killed first."""
    if starts and starts[-1].reason is None:
        saved = pruned_in(since) or saved_on_warning(since)
        starts[-1] = replace(
            starts[-1],
            reason=end_of_start(since, None, False, walltime),
            end_step=None if saved is None else saved.step,
        )


def _with(start: Start, event: Event, first: bool) -> Start:
    """``start`` with what ``event``, recorded during it, says (``first``: the first event
    after the start)."""
    if isinstance(event, EnvironmentFailed) and start.reason is None:
        return replace(start, environment=event.why or "the environment failed")
    if isinstance(event, UserCodeFailed) and start.user_code is None:
        return replace(start, user_code=event.line or "your code raised an exception")
    if isinstance(event, Ended) and start.reason is None:
        return replace(
            start,
            reason=event.reason or "failed",
            exit_code=event.exit_code,
            end_step=event.step,
            ended_at=event.time,
        )
    if isinstance(event, Signalled):
        return replace(start, signalled=True)
    if isinstance(event, Pruned) and start.pruned is None:
        return replace(start, pruned=pruning_words(event))
    if isinstance(event, GaveUp) and first and event.job_id == start.job_id:
        return replace(start, refused=True)
    return start


def _mark_requeued(starts: list[Start], job_id: str) -> None:
    for i in range(len(starts) - 1, -1, -1):
        if starts[i].job_id == job_id:
            starts[i] = replace(starts[i], requeued=True)
            return


def run_state(events: Sequence[Event | Mapping[str, Any]]) -> RunState:
    """The run's state from its journal alone (pure; table-tested; ``events``: typed, or
    journal entries, parsed here)."""
    events = typed(events)
    starts = starts_of(events)
    state, why = _state(events, starts)
    return RunState(
        state,
        why,
        tuple(starts),
        preemption_requeues=sum(1 for s in starts[:-1] if s.reason in PREEMPTION_REASONS),
        failure_requeues=sum(1 for s in starts[:-1] if _spends_failure_budget(s)),
        jobs=tuple(dict.fromkeys(str(e.job_id) for e in events if e.job_id is not None)),
        failed_nodes=failed_nodes(events),
    )


def _spends_failure_budget(start: Start) -> bool:
    """A crash, stall or node failure does; an exception from the user's code does not (it is
    never requeued, and a resubmit after a fix starts with the whole budget)."""
    return start.reason in FAILURE_REASONS and start.user_code is None


def failed_nodes(events: Sequence[Event]) -> tuple[str, ...]:
    """Every node a ``nodes_down`` record names, first failure first, each once."""
    nodes: dict[str, None] = {}
    for event in events:
        if isinstance(event, NodesDown):
            nodes.update(dict.fromkeys(event.nodes))
    return tuple(nodes)


# The records that may have the last word on a run since its last start.
_LAST_WORDS = (GaveUp, Cancelled, Submitted, Requeued)


def _state(events: Sequence[Event], starts: Sequence[Start]) -> tuple[str, str]:
    if any(start.reason == "done" for start in starts[_starts_before_extension(events) :]):
        return "done", ""
    # The last word since the last start: the budget's, the user's, a new submission, a requeue.
    # A job that found the run owned by another ended at once: its submission says nothing.
    not_started = {e.job_id for e in events if isinstance(e, NotStarted)}
    word = next(
        (
            e
            for e in reversed(since_last_start(events))
            if isinstance(e, _LAST_WORDS)
            and not (isinstance(e, Submitted) and e.job_id in not_started)
        ),
        None,
    )
    if isinstance(word, GaveUp):
        return "gave_up", word.why
    if isinstance(word, Cancelled):
        return "cancelled", "cancelled by the user"
    if not starts or isinstance(word, Submitted):
        return "queued", ""
    last = starts[-1]
    if last.reason is None:
        return "running", ""
    if isinstance(word, Requeued):
        return "requeued", f"after {last.reason}"
    return _ended(last)


def _ended(last: Start) -> tuple[str, str]:
    """The state of a run whose last start ended and nothing came after it."""
    if last.user_code is not None:
        return "failed", last.user_code
    if last.reason == PRUNED:
        return PRUNED, last.pruned or ""
    if last.reason == PLANNED_RESTART:  # saved, and the requeue did not happen
        return "preempted", f"saved step {last.end_step} to restart; hpctf resubmit resumes it"
    if last.reason in PREEMPTION_REASONS:  # saved, and nothing requeued it (a local SIGTERM)
        return "preempted", f"saved step {last.end_step}; hpctf resubmit resumes it"
    if last.reason == "failed":  # said once: "failed (exit 1)", not "failed (failed (exit 1))"
        return "failed", exit_text(last.exit_code)
    return "failed", f"{last.reason} ({exit_text(last.exit_code)})"


def _starts_before_extension(events: Sequence[Event]) -> int:
    """How many starts came before the last ``extended`` record (``resubmit --set
    train.steps=``): a done run extended is done again only once a later start is."""
    last = max((i for i, e in enumerate(events) if isinstance(e, Extended)), default=-1)
    return sum(1 for e in events[: last + 1] if isinstance(e, Started))


@dataclass(frozen=True)
class Decision:
    """Whether to go on (requeue the job that ended; let a start proceed), whether the run has
    given up for good, and why, in words for the log and the journal."""

    go: bool
    gave_up: bool
    why: str


def after_end(state: RunState, budgets: Budgets) -> Decision:
    """Whether hpctf should requeue the start that just ended, within the run's budgets.

    ``state`` must include the ended start as its last one (:func:`run_state` of the journal
    after the ``ended`` record). When the batch shell got SIGTERM (``Start.signalled``), Slurm is
    ending this job itself (a preemption, a lost node, ``scontrol requeue``, scancel) and
    requeues it where its configuration says so; hpctf does not requeue it a second time, and
    the next start checks the budgets (:func:`before_start`).
    """
    last = state.last
    if last is None or last.reason is None:
        return Decision(False, False, "no ended start")
    reason = last.reason
    if reason in ("done", "cancelled"):
        return Decision(False, False, reason)
    if reason == PRUNED:  # finished: the search frees the task for its next trial
        return Decision(False, False, f"pruned {last.pruned or ''}".strip())
    if last.left_to_slurm:
        return Decision(False, False, f"{reason}: Slurm ended the job and requeues it if it can")
    if last.environment is not None:
        # A full disk or a read-only filesystem stays so: a requeue would fail at the next save.
        return Decision(False, True, f"{reason}: {last.environment}")
    if last.user_code is not None and reason in FAILURE_REASONS:
        # An exception from the user's code raises again at the next start: no requeue.
        return Decision(
            False, True, f"{last.user_code}; not requeued: fix it and run hpctf resubmit"
        )
    if reason == PLANNED_RESTART:  # as many as the run's steps call for: no budget
        done = sum(1 for s in state.starts if s.reason == PLANNED_RESTART)
        return Decision(True, False, f"restart {done} (train.restart_every_steps): no budget used")
    if reason in PREEMPTION_REASONS:
        used = state.preemption_requeues
        if used >= budgets.preemption:
            return Decision(
                False, True, f"{reason}: {used} preemption requeues used of {budgets.preemption}"
            )
        return Decision(True, False, f"{reason}: requeue {used + 1} of {budgets.preemption}")
    used = state.failure_requeues
    if reason != "node_fail" and not last.advanced:
        return Decision(
            False,
            True,
            f"{reason} without progress (checkpoint step {last.step} -> {last.end_step}): "
            "not requeued; fix the cause and run hpctf resubmit",
        )
    if used >= budgets.failure:
        return Decision(False, True, f"{reason}: {used} failure requeues used of {budgets.failure}")
    return Decision(True, False, f"{reason}: requeue {used + 1} of {budgets.failure}")


def before_start(state: RunState, budgets: Budgets) -> Decision:
    """Whether a new start may go on, from the state before it is recorded: not after the run
    gave up (unless resubmitted) or completed, and not past a budget, whoever requeued the job.
    A start still running in the journal was killed without a word (a lost node,
    ``scontrol requeue``): it counts as a failure."""
    if state.state == "done":
        return Decision(False, False, "the run is complete")
    if state.state == PRUNED:
        return Decision(False, False, f"the search pruned the run {state.why}".strip())
    if state.state == "gave_up":
        return Decision(False, True, f"the run gave up: {state.why}")
    failures = sum(1 for s in state.starts if _spends_failure_budget(s) or s.reason is None)
    preemptions = sum(1 for s in state.starts if s.reason in PREEMPTION_REASONS)
    if failures > budgets.failure:
        return Decision(
            False,
            True,
            f"restarted {failures} times after failures, over the budget of {budgets.failure} "
            "(the site's preemption.max_failure_requeues)",
        )
    if preemptions > budgets.preemption:
        return Decision(
            False,
            True,
            f"requeued {preemptions} times after preemption, over the budget of "
            f"{budgets.preemption} (the site's preemption.max_requeues)",
        )
    return Decision(True, False, "ok")
