"""A run's state, derived from its journal alone: a pure function, and the requeue decision.

The journal holds one event per fact (:meth:`hpctf.core.rundir.RunDir.record`): ``submitted``,
``started`` (with the checkpoint step the start resumes from), ``preempted`` (the chief saved
an agreed step after a warning), ``signalled`` (the batch shell got SIGTERM), ``node_failed``
(nodes of the job that Slurm said were down or drained when it was killed), ``ended`` (with
its reason, exit code and step), ``requeued``, ``gave_up``, ``cancelled``, ``not_started`` (a
job that found the run owned by another ended at once: no start of the run). Nothing else is
consulted, so ``hpctf status`` and the batch script always agree on what happened.

Ends, by reason:

========== ========================================================== ====================
reason     what happened                                              budget it uses
========== ========================================================== ====================
done       training complete                                          --
preempted  warned by SIGTERM (preemption); all ranks saved one step   preemption
timeout    warned by the walltime signal; all ranks saved one step    preemption
stalled    a rank's watchdog saw no progress (exit 124)               failure, if advanced
failed     a rank exited non-zero (a crash, an exception, OOM)        failure, if advanced
node_fail  the job was killed from outside without a warning: a node  failure
           lost, ``scontrol requeue``, an unwarned preemption
cancelled  ``hpctf cancel`` or scancel                                --
========== ========================================================== ====================

A start that the environment stopped (the chief recorded ``environment_failed``: a full disk
at save time) is not requeued: it would fail again at the next save.
A crash or a stall is requeued only when the run advanced (its checkpoint step grew) during
that start: an entry that raises at step 0 gives up at once instead of burning allocations. A
node failure is not the code's fault and is retried within the failure budget alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctf.core.errors import PREEMPTED_EXIT, STALLED_EXIT

REASONS = ("done", "preempted", "timeout", "stalled", "failed", "node_fail", "cancelled")
PREEMPTION_REASONS = frozenset({"preempted", "timeout"})
FAILURE_REASONS = frozenset({"stalled", "failed", "node_fail"})


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

    @property
    def advanced(self) -> bool:
        return self.end_step is not None and self.end_step > self.step


@dataclass(frozen=True)
class RunState:
    """``state`` is one of queued, running, requeued, done, failed, gave_up, cancelled."""

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


def end_reason(
    exit_code: int,
    done: bool,
    warned_by: str | None,
    signalled: bool,
    cancelled: bool,
    walltime_signal: str = "USR2",
) -> str:
    """Why a start ended. ``warned_by`` is the signal the ranks saved on (None if they did
    not; ``walltime_signal`` is the site's warning before the time limit), ``signalled``
    whether the batch shell got SIGTERM, ``cancelled`` whether the user cancelled the run
    during this start."""
    if done and exit_code == 0:
        return "done"
    # Before the warnings: scancel sends SIGTERM, which the ranks take as a warning and save on.
    if cancelled:
        return "cancelled"
    if warned_by is not None or exit_code == PREEMPTED_EXIT:
        return "timeout" if warned_by == walltime_signal != "TERM" else "preempted"
    if exit_code == STALLED_EXIT:
        return "stalled"
    # Only the batch shell's own SIGTERM says "killed from outside": srun reports 143 or 137
    # too when --kill-on-bad-exit ended the other ranks after one of them failed.
    if signalled:
        return "node_fail"
    return "failed" if exit_code != 0 else "done"


def starts_of(events: Sequence[Mapping[str, Any]]) -> list[Start]:
    """Every start of every job of the run, in order, with how each ended.

    A start whose job was started again without an ``ended`` record had its batch shell killed
    before it could say so (Slurm requeued it: a preemption, a node failure, ``scontrol
    requeue``): it ended ``preempted`` (or ``timeout`` for a USR2 warning) at the step the
    chief recorded, when the ranks saved an agreed step; ``node_fail`` otherwise.
    """
    starts: list[dict[str, Any]] = []
    saved: Mapping[str, Any] | None = None
    for event in events:
        kind = event.get("event")
        if kind == "started":
            if starts and starts[-1]["reason"] is None:
                _close_unended(starts[-1], saved)
            saved = None
            starts.append(
                {
                    "job_id": str(event.get("job_id")),
                    "step": int(event.get("step") or 0),
                    "reason": None,
                    "exit_code": None,
                    "end_step": None,
                    "nodes": event.get("nodes"),
                    "environment": None,
                }
            )
        elif kind == "preempted":
            saved = event
        elif kind == "environment_failed" and starts and starts[-1]["reason"] is None:
            starts[-1]["environment"] = str(event.get("why") or "the environment failed")
        elif kind == "ended" and starts and starts[-1]["reason"] is None:
            starts[-1]["reason"] = event.get("reason") or "failed"
            starts[-1]["exit_code"] = event.get("exit_code")
            starts[-1]["end_step"] = event.get("step")
    return [Start(**start) for start in starts]


def _close_unended(start: dict[str, Any], saved: Mapping[str, Any] | None) -> None:
    if saved is None:
        start["reason"] = "node_fail"
        return
    start["reason"] = "timeout" if saved.get("signal") == "USR2" else "preempted"
    start["end_step"] = saved.get("step")


def reason_from_slurm(slurm_state: str, saved_signal: str | None, done: bool) -> str:
    """Why a start ended whose batch shell died without a record (with its node), from what
    Slurm (sacct) says of its job: ``slurm_state`` (COMPLETED, FAILED, NODE_FAIL, ...),
    ``saved_signal`` the signal the ranks saved on during that start (None: no save), ``done``
    whether the run is complete."""
    if done and slurm_state == "COMPLETED":
        return "done"
    if slurm_state == "CANCELLED":
        return "cancelled"
    if saved_signal is not None:
        return "timeout" if saved_signal == "USR2" else "preempted"
    if slurm_state in ("FAILED", "OUT_OF_MEMORY", "COMPLETED"):
        return "failed"
    return "node_fail"  # NODE_FAIL, BOOT_FAIL, TIMEOUT or PREEMPTED without a save


def run_state(events: Sequence[Mapping[str, Any]]) -> RunState:
    """The run's state from its journal alone (pure; table-tested)."""
    starts = starts_of(events)
    state, why = _state(events, starts)
    return RunState(
        state,
        why,
        tuple(starts),
        preemption_requeues=sum(1 for s in starts[:-1] if s.reason in PREEMPTION_REASONS),
        failure_requeues=sum(1 for s in starts[:-1] if s.reason in FAILURE_REASONS),
        jobs=tuple(dict.fromkeys(str(e["job_id"]) for e in events if e.get("job_id") is not None)),
        failed_nodes=failed_nodes(events),
    )


def failed_nodes(events: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every node a ``node_failed`` record names, first failure first, each once."""
    nodes: dict[str, None] = {}
    for event in events:
        if event.get("event") == "node_failed":
            nodes.update(dict.fromkeys(str(n) for n in event.get("nodes") or ()))
    return tuple(nodes)


def _state(events: Sequence[Mapping[str, Any]], starts: Sequence[Start]) -> tuple[str, str]:
    if any(start.reason == "done" for start in starts):
        return "done", ""
    # The last word since the last start: the budget's, the user's, a new submission, a requeue.
    # A job that found the run owned by another ended at once: its submission says nothing.
    not_started = {e.get("job_id") for e in events if e.get("event") == "not_started"}
    word = next(
        (
            e
            for e in reversed(_since_last_start(events))
            if e.get("event") in ("gave_up", "cancelled", "submitted", "requeued")
            and not (e.get("event") == "submitted" and e.get("job_id") in not_started)
        ),
        None,
    )
    kind = word.get("event") if word is not None else None
    if word is not None and kind == "gave_up":
        return "gave_up", str(word.get("why", ""))
    if kind == "cancelled":
        return "cancelled", "cancelled by the user"
    if not starts or kind == "submitted":
        return "queued", ""
    last = starts[-1]
    if last.reason is None:
        return "running", ""
    if kind == "requeued":
        return "requeued", f"after {last.reason}"
    return "failed", f"{last.reason} (exit {last.exit_code})"


def _since_last_start(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    last = max((i for i, e in enumerate(events) if e.get("event") == "started"), default=-1)
    return list(events[last + 1 :])


@dataclass(frozen=True)
class Decision:
    """Whether to go on (requeue the job that ended; let a start proceed), whether the run has
    given up for good, and why, in words for the log and the journal."""

    go: bool
    gave_up: bool
    why: str


def after_end(state: RunState, budgets: Budgets, slurm_ends_it: bool = False) -> Decision:
    """Whether hpctf should requeue the start that just ended, within the run's budgets.

    ``state`` must include the ended start as its last one (:func:`run_state` of the journal
    after the ``ended`` record). ``slurm_ends_it``: the batch shell got SIGTERM, so Slurm is
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
    if slurm_ends_it or reason == "node_fail":
        return Decision(False, False, f"{reason}: Slurm ended the job and requeues it if it can")
    if last.environment is not None:
        # A full disk or a read-only filesystem stays so: a requeue would fail at the next save.
        return Decision(False, True, f"{reason}: {last.environment}")
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
    if state.state == "gave_up":
        return Decision(False, True, f"the run gave up: {state.why}")
    failures = sum(1 for s in state.starts if s.reason in FAILURE_REASONS or s.reason is None)
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
