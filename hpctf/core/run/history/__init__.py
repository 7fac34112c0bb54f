"""A run's history: the one reader and interpreter of its journal (pure but for
:func:`read_history`). :mod:`.events` types the journal's entries, :mod:`.ends` says how one
start ended, :mod:`.runstate` folds the starts into the run's state and decides requeues,
:mod:`.jobs` folds them into jobs, and :class:`RunHistory` (:mod:`.run_history`) holds one
run's typed events and all of that, read once per command. No other module looks at an
entry's event name (a test says so)."""

from hpctf.core.run.history.ends import (
    FAILURE_REASONS,
    PLANNED_RESTART,
    PREEMPTION_REASONS,
    PRUNED,
    REASONS,
    end_reason,
    reason_from_slurm,
)
from hpctf.core.run.history.jobs import Job
from hpctf.core.run.history.run_history import (
    RunHistory,
    made_in,
    read_history,
    record_end,
    record_end_read,
)
from hpctf.core.run.history.runstate import (
    Budgets,
    Decision,
    RunState,
    Start,
    after_end,
    before_start,
)

__all__ = [
    "FAILURE_REASONS",
    "PLANNED_RESTART",
    "PREEMPTION_REASONS",
    "PRUNED",
    "REASONS",
    "Budgets",
    "Decision",
    "Job",
    "RunHistory",
    "RunState",
    "Start",
    "after_end",
    "before_start",
    "end_reason",
    "made_in",
    "read_history",
    "reason_from_slurm",
    "record_end",
    "record_end_read",
]
