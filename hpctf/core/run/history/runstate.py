"""A run's state, derived from its journal alone (:func:`run_state`, pure); as seen with what
the journal cannot know in :mod:`.outside_view`, the requeue decisions in :mod:`.decisions`.

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
    OLD_WALLTIME_SIGNAL,
    PLANNED_RESTART,
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
    PeerLost,
    Pruned,
    Requeued,
    Signalled,
    Started,
    Submitted,
    UserCodeFailed,
    typed,
)
from hpctf.core.run.history.states import (
    FAILURE_REASONS,
    PREEMPTION_REASONS,
    EndReason,
    RestartCause,
    RunStatus,
)


@dataclass(frozen=True)
class Start:
    """One start of a job: what it resumed from and how it ended (None: not ended yet)."""

    job_id: str
    step: int
    reason: EndReason | None = None
    exit_code: int | None = None
    end_step: int | None = None
    nodes: str | None = None
    # What the chief said when the environment stopped the start (a full disk at save time).
    environment: str | None = None
    # The line of the first rank that recorded an exception raised in the user's code.
    user_code: str | None = None
    # Where a search pruned the trial during this start, in words (pruning_words).
    pruned: str | None = None
    # The line of the first rank that saw another stop answering (a lost peer).
    peer_lost: str | None = None
    # The nodes found lost under it (``nodes_down``: Slurm said so when it ended), in order.
    lost_nodes: tuple[str, ...] = ()
    # Slurm's SLURM_RESTART_COUNT at the start: the starts of one allocation share it and
    # their job id (hpctf's restarts in the same allocation; a requeue counts one more).
    restart_count: int | None = None
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
    def cause(self) -> RestartCause | None:
        """Why the run would start again after this start (None: it ended for good, or has
        not ended): the one place a restart's cause is decided."""
        reason = self.reason
        if reason is None or reason in (EndReason.DONE, EndReason.CANCELLED, PRUNED):
            return None
        if self.user_code is not None:
            return RestartCause.USER_CODE
        if self.environment is not None:
            return RestartCause.ENVIRONMENT
        if self.lost_nodes and reason in FAILURE_REASONS:
            return RestartCause.NODE_LOST
        if reason == EndReason.FAILED and self.peer_lost is not None:
            return RestartCause.PEER_LOST
        return _CAUSES[reason]

    @property
    def left_to_slurm(self) -> bool:
        """Slurm ended this start itself (the batch shell got SIGTERM: a preemption, a lost
        node, ``scontrol requeue``) or it ended without a word (``node_fail``) and it did not
        end well: whether the job comes back is Slurm's to say (its requeue), not hpctf's."""
        return self.reason not in (EndReason.DONE, EndReason.CANCELLED, PRUNED) and (
            self.signalled or self.reason == EndReason.NODE_FAIL
        )


_CAUSES = {
    EndReason.PREEMPTED: RestartCause.PREEMPTION,
    EndReason.TIMEOUT: RestartCause.WALLTIME,
    EndReason.RESTART: RestartCause.PLANNED,
    EndReason.FAILED: RestartCause.WORKER_CRASHED,
    EndReason.STALLED: RestartCause.STALL,
    EndReason.NODE_FAIL: RestartCause.NODE_LOST,
}


@dataclass(frozen=True)
class RunState:
    """A run's state (:class:`~.states.RunStatus`, whose docstring says what each means) and
    why, its starts, the requeues it used and the nodes that failed under it."""

    state: RunStatus
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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunState:
        """The state ``dataclasses.asdict`` wrote (the run index's rows), typed again; a
        KeyError, TypeError or ValueError when ``data`` is not that."""
        starts = tuple(
            Start(
                **{
                    **s,
                    "reason": None if s["reason"] is None else EndReason(s["reason"]),
                    "lost_nodes": tuple(s.get("lost_nodes", ())),
                }
            )
            for s in data["starts"]
        )
        return cls(
            **{
                **data,
                "state": RunStatus(data["state"]),
                "starts": starts,
                "jobs": tuple(data["jobs"]),
                "failed_nodes": tuple(data["failed_nodes"]),
            }
        )


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
                    restart_count=event.restart_count,
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
    if isinstance(event, PeerLost) and start.peer_lost is None:
        return replace(start, peer_lost=event.line or f"rank {event.rank}: a peer was lost")
    if isinstance(event, Ended) and start.reason is None:
        return replace(
            start,
            reason=EndReason.of(event.reason),
            exit_code=event.exit_code,
            end_step=event.step,
            ended_at=event.time,
        )
    if isinstance(event, Signalled):
        return replace(start, signalled=True)
    if isinstance(event, NodesDown):
        lost = dict.fromkeys((*start.lost_nodes, *event.nodes))
        return replace(start, lost_nodes=tuple(lost))
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
        failure_requeues=sum(1 for s in starts[:-1] if spends_failure_budget(s)),
        jobs=tuple(dict.fromkeys(str(e.job_id) for e in events if e.job_id is not None)),
        failed_nodes=failed_nodes(events),
    )


def spends_failure_budget(start: Start) -> bool:
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


def _state(events: Sequence[Event], starts: Sequence[Start]) -> tuple[RunStatus, str]:
    if any(start.reason == EndReason.DONE for start in starts[_starts_before_extension(events) :]):
        return RunStatus.DONE, ""
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
        return RunStatus.GAVE_UP, word.why
    if isinstance(word, Cancelled):
        return RunStatus.CANCELLED, "cancelled by the user"
    if not starts or isinstance(word, Submitted):
        return RunStatus.QUEUED, ""
    last = starts[-1]
    if last.reason is None:
        return RunStatus.RUNNING, ""
    if isinstance(word, Requeued):
        return RunStatus.REQUEUED, f"after {last.reason}"
    return _ended(last)


def _ended(last: Start) -> tuple[RunStatus, str]:
    """The state of a run whose last start ended and nothing came after it."""
    if last.user_code is not None:
        return RunStatus.FAILED, last.user_code
    if last.reason == PRUNED:
        return RunStatus.PRUNED, last.pruned or ""
    if last.reason == PLANNED_RESTART:  # saved, and the requeue did not happen
        why = f"saved step {last.end_step} to restart; hpctf resubmit resumes it"
        return RunStatus.PREEMPTED, why
    if last.reason in PREEMPTION_REASONS:  # saved, and nothing requeued it (a local SIGTERM)
        return RunStatus.PREEMPTED, f"saved step {last.end_step}; hpctf resubmit resumes it"
    # Said once: "failed (exit 1)", not "failed (failed (exit 1))".
    if last.reason == EndReason.FAILED:
        return RunStatus.FAILED, exit_text(last.exit_code)
    return RunStatus.FAILED, f"{last.reason} ({exit_text(last.exit_code)})"


def _starts_before_extension(events: Sequence[Event]) -> int:
    """How many starts came before the last ``extended`` record (``resubmit --set
    train.steps=``): a done run extended is done again only once a later start is."""
    last = max((i for i, e in enumerate(events) if isinstance(e, Extended)), default=-1)
    return sum(1 for e in events[: last + 1] if isinstance(e, Started))
