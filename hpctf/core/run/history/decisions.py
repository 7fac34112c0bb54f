"""Whether a run goes on, pure: after a start ended (:func:`after_end`: requeue it?) and
before a start proceeds (:func:`before_start`), within the run's budgets, from its state
(:mod:`.runstate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpctf.core.run.history.ends import PLANNED_RESTART, PRUNED
from hpctf.core.run.history.runstate import RunState, Start, spends_failure_budget
from hpctf.core.run.history.states import (
    FAILURE_REASONS,
    PREEMPTION_REASONS,
    EndReason,
    RestartCause,
    RunStatus,
)


@dataclass(frozen=True)
class Budgets:
    """How many times one run may be requeued, by kind of end."""

    preemption: int
    failure: int



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
    if reason in (EndReason.DONE, EndReason.CANCELLED):
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
    return _after_failure(state, budgets, last)


# Not the code's fault: a start that made no progress is tried again (within the failure
# budget) unless the one before it ended so too, for the same cause.
_OUTSIDE_CAUSES = frozenset({RestartCause.NODE_LOST, RestartCause.PEER_LOST})


def _after_failure(state: RunState, budgets: Budgets, last: Start) -> Decision:
    """A crash, a stall or a lost peer: requeue within the failure budget; a crash or a stall
    without progress, or a lost peer twice in a row without progress, stops with one line
    naming the cause instead of looping (a lost node: Slurm requeues the job, and
    :func:`before_start` stops it so)."""
    reason, cause, used = last.reason, last.cause, state.failure_requeues
    if cause in _OUTSIDE_CAUSES:
        if (looping := _lost_twice(state.starts)) is not None:
            return looping
    elif not last.advanced:
        return Decision(
            False,
            True,
            f"{reason} without progress (checkpoint step {last.step} -> {last.end_step}): "
            "not requeued; fix the cause and run hpctf resubmit",
        )
    if used >= budgets.failure:
        return Decision(False, True, f"{reason}: {used} failure requeues used of {budgets.failure}")
    return Decision(True, False, f"{reason}: requeue {used + 1} of {budgets.failure}")


def _lost_twice(starts: Sequence[Start]) -> Decision | None:
    """The stop of a run whose last two starts ended for the same outside cause (a lost node,
    a lost peer) without progress: a third would loop on it."""
    if len(starts) < 2:
        return None
    before, last = starts[-2], starts[-1]
    if last.cause not in _OUTSIDE_CAUSES or before.cause != last.cause:
        return None
    if last.advanced or before.advanced:
        return None
    return Decision(
        False,
        True,
        f"{last.reason} ({last.cause}) twice in a row without progress (checkpoint step "
        f"{last.step}): stopped instead of starting again; fix the cause and run hpctf resubmit",
    )


def lost_in_allocation(starts: Sequence[Start]) -> tuple[str, ...]:
    """The nodes lost under the last start's allocation, first lost first, each once: under
    every start of its job with its Slurm restart count (hpctf's restarts in the same
    allocation keep both; a requeue is a new allocation)."""
    if not starts:
        return ()
    last = starts[-1]
    same = (
        s for s in starts if s.job_id == last.job_id and s.restart_count == last.restart_count
    )
    return tuple(dict.fromkeys(node for start in same for node in start.lost_nodes))


def spare_refusal(lost: Sequence[str], spare_nodes: int) -> str | None:
    """Why the workers cannot start again in this allocation once ``lost`` nodes are gone from
    it (``resources.spare_nodes``: ``spare_nodes``), or None while a spare is left for each."""
    if len(lost) <= spare_nodes:
        return None
    return (
        f"no spare node left ({len(lost)} lost in this allocation: {','.join(lost)}; "
        f"resources.spare_nodes {spare_nodes})"
    )


def before_start(state: RunState, budgets: Budgets) -> Decision:
    """Whether a new start may go on, from the state before it is recorded: not after the run
    gave up (unless resubmitted) or completed, and not past a budget, whoever requeued the job.
    A start still running in the journal was killed without a word (a lost node,
    ``scontrol requeue``): it counts as a failure."""
    if state.state == RunStatus.DONE:
        return Decision(False, False, "the run is complete")
    if state.state == RunStatus.PRUNED:
        return Decision(False, False, f"the search pruned the run {state.why}".strip())
    if state.state == RunStatus.GAVE_UP:
        return Decision(False, True, f"the run gave up: {state.why}")
    if (looping := _lost_twice(state.starts)) is not None:  # Slurm requeued it: hpctf stops
        return looping
    failures = sum(1 for s in state.starts if spends_failure_budget(s) or s.reason is None)
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
