"""A run's state as every command shows it: the journal's (:func:`.runstate.run_state`) with
what the journal cannot know, given by the command that asked Slurm's queue or this host
(:func:`as_seen`, pure; the one place those are decided)."""

from __future__ import annotations

from dataclasses import replace

from hpctf.core.run.history.runstate import RunState
from hpctf.core.run.history.states import (
    FAILURE_REASONS,
    PREEMPTION_REASONS,
    EndReason,
    RunStatus,
)


def as_seen(
    state: RunState,
    *,
    local: bool,
    launcher_gone: str | None = None,
    path: str = "",
    slurm_requeued: bool = False,
    closed_reason: EndReason | None = None,
) -> RunState:
    """The run's state as every command shows it: the journal's, with what the journal cannot
    know, given by the caller that asked (the one place these are decided).

    - ``launcher_gone`` (a local run the journal says is running): the local launcher, in
      words, is gone from this host without recording how its start ended (killed, a full
      disk): the run ``failed``, resumed by ``hpctf resubmit PATH``.
    - A local run saved and stopped by a signal to its launcher (SIGTERM, SIGHUP, the launcher
      killed) was ``interrupted``: nothing preempts or requeues a local run (a Ctrl-C or
      ``hpctf cancel`` is ``cancelled``).
    - ``slurm_requeued``: Slurm's queue holds the job again (Slurm requeued it itself after a
      node failure, a preemption or ``scontrol requeue``) while the journal says its start
      failed, was preempted or, its batch shell killed first, is still running: the run is
      ``requeued``, its last start closed for ``closed_reason`` as its next start will close
      it. A requeue counts against its budget as soon as it is decided.
    """
    if launcher_gone is not None and state.state == RunStatus.RUNNING:
        state = replace(
            state,
            state=RunStatus.FAILED,
            why=f"{launcher_gone} is gone without recording how its start ended (killed, or a "
            f"full disk?); its rank logs say the rest; continue with: hpctf resubmit {path}",
        )
    elif local and state.state == RunStatus.PREEMPTED:
        state = replace(
            state, state=RunStatus.INTERRUPTED, why=f"its launcher was stopped; {state.why}"
        )
    requeuable = (RunStatus.FAILED, RunStatus.PREEMPTED, RunStatus.RUNNING)
    if slurm_requeued and state.state in requeuable:
        state = replace(state, state=RunStatus.REQUEUED, why=f"by Slurm after {closed_reason}")
    if state.state == RunStatus.REQUEUED and state.last is not None:
        state = replace(
            state,
            preemption_requeues=state.preemption_requeues
            + (closed_reason in PREEMPTION_REASONS),
            failure_requeues=state.failure_requeues + (closed_reason in FAILURE_REASONS),
        )
    return state
