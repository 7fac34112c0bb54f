"""A run's history: the one reader and interpreter of its journal (pure but for
:func:`read_history`). :mod:`.events` types the journal's entries, :mod:`.ends` says how one
start ended, :mod:`.runstate` folds the starts into the run's state,
:mod:`.decisions` decides requeues, :mod:`.states` types the words all of them decide,
:mod:`.jobs` folds them into jobs, and :class:`RunHistory` (:mod:`.run_history`) holds one
run's typed events and all of that, read once per command. No other module looks at an
entry's event name (a test says so)."""

from hpctf.core.run.history.decisions import (
    Budgets,
    Decision,
    after_end,
    before_start,
    lost_in_allocation,
    spare_refusal,
)
from hpctf.core.run.history.ends import (
    PLANNED_RESTART,
    PRUNED,
    REASONS,
    end_reason,
    reason_from_slurm,
)
from hpctf.core.run.history.jobs import Job
from hpctf.core.run.history.outside_view import as_seen
from hpctf.core.run.history.run_history import (
    RunHistory,
    made_in,
    read_history,
    record_end,
    record_end_read,
)
from hpctf.core.run.history.runstate import RunState, Start
from hpctf.core.run.history.states import (
    ACTIVE_STATES,
    FAILURE_REASONS,
    FINAL_STATES,
    PREEMPTION_REASONS,
    EndReason,
    RestartCause,
    RunStatus,
    TrialStatus,
)

__all__ = [
    "ACTIVE_STATES",
    "FAILURE_REASONS",
    "FINAL_STATES",
    "PLANNED_RESTART",
    "PREEMPTION_REASONS",
    "PRUNED",
    "REASONS",
    "Budgets",
    "Decision",
    "EndReason",
    "Job",
    "RestartCause",
    "RunHistory",
    "RunState",
    "RunStatus",
    "Start",
    "TrialStatus",
    "after_end",
    "as_seen",
    "before_start",
    "end_reason",
    "lost_in_allocation",
    "made_in",
    "read_history",
    "reason_from_slurm",
    "record_end",
    "record_end_read",
    "spare_refusal",
]
