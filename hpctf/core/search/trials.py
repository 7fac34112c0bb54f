"""Asking a search's study for a trial and telling it how one ended (Optuna, imported when a
study is opened), and how a trial's run ended, read from its history.

A trial's end is its run's: ``done`` is COMPLETE with the objective's last evaluation, a run
that ended ``pruned`` is PRUNED, one that failed or gave up is FAIL (and counts toward the
budget, as every trial asked does). A run still queued, running, requeued, preempted or
cancelled is unfinished, and so is one whose job Slurm ended itself (its requeue is Slurm's):
its array task resumes it (the same run directory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpctf.core.run.history import RunStatus, read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.search import study as studies
from hpctf.core.search.outcome import objective_value
from hpctf.core.search.search_dir import ASK_LOCK, STUDY_NAME, held_trials
from hpctf.core.settings.search import Objective, Search

# A run in one of these states will go on (its job is queued, running or requeued) or may be
# resumed (saved on a warning; cancelled by its owner): its trial is not over.
UNFINISHED = frozenset(
    {
        RunStatus.QUEUED,
        RunStatus.RUNNING,
        RunStatus.REQUEUED,
        RunStatus.PREEMPTED,
        RunStatus.CANCELLED,
    }
)

End = Literal["complete", "pruned", "fail"]


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: ``end`` as the study is told, ``value`` (COMPLETE only), ``why``."""

    end: End
    value: float | None = None
    why: str = ""


def outcome(run: RunDir, objective: Objective) -> Outcome | None:
    """How the trial whose run is ``run`` ended, or None while it is unfinished: also when
    its last start failed because Slurm ended the job itself (a preemption whose save did not
    finish, a lost node, ``scontrol requeue``): Slurm requeues the task and its agent resumes
    the trial (the requeue budgets are job-start's to apply); a task Slurm does not bring back
    leaves it to ``hpctf resubmit SWEEP``, as a cancelled one."""
    state = read_history(run).state
    if state.state in UNFINISHED:
        return None
    if state.state == RunStatus.FAILED and state.last is not None and state.last.left_to_slurm:
        return None
    if state.state == RunStatus.DONE:
        value = objective_value(run.path, objective.metric)
        if value is None:
            return Outcome("fail", why=f"done without an evaluation of {objective.metric}")
        return Outcome("complete", value)
    if state.state == RunStatus.PRUNED:
        return Outcome("pruned", why=state.why)
    return Outcome("fail", why=f"{state.state}: {state.why}" if state.why else state.state)


@dataclass(frozen=True)
class Asked:
    """A new trial: its number, Optuna's id of it, its parameters (key path -> value)."""

    number: int
    trial_id: int
    params: dict[str, Any]


# How long an agent may hold the ask lock before a waiting one takes it as left by a killed
# task (Optuna's JournalFileOpenLock, 30 s by default). An ask is a journal replay and a
# sampler's draw: seconds (search-next ignores SIGTERM meanwhile, so only a SIGKILL leaves the
# lock behind); two minutes held is a killed or suspended holder. A suspended one that wakes
# past it finds its trial over the budget and fails it (:func:`ask`).
ASK_LOCK_GRACE_S = 120


def ask(
    sweep: Path, journal: Path, search: Search, budget: int, hold: Callable[[Asked], None]
) -> Asked | None:
    """A trial for an agent, or None when ``budget`` trials have been asked already: a trial
    asked by a task killed before it recorded it (RUNNING, held by no agent: adopted), else a
    new one from the study. ``hold`` records it in the agent's file before the lock is let go,
    so that every RUNNING trial has an agent (:func:`hpctf.core.search.search_dir.held_trials`).
    Counting, asking and recording happen under the sweep's ask lock (an O_EXCL file, as the
    journal's own lock: it holds on NFS and Lustre), so that parallel agents never ask past
    the budget."""
    lib = studies.require_optuna()  # a UserError naming the extra when Optuna is missing
    from optuna.storages.journal import JournalFileOpenLock

    lock = JournalFileOpenLock(str(sweep / ASK_LOCK), grace_period=ASK_LOCK_GRACE_S)
    lock.acquire()
    try:
        with studies.damage_named(journal):
            return _ask_locked(sweep, journal, search, budget, hold, lib)
    finally:
        with contextlib.suppress(RuntimeError):  # taken from us as stale: not ours to remove
            lock.release()


def _ask_locked(
    sweep: Path, journal: Path, search: Search, budget: int, hold: Callable[[Asked], None], lib: Any
) -> Asked | None:
    """:func:`ask`'s work, the ask lock held."""
    study = studies.open_study(journal, STUDY_NAME, search.pruner)
    every = study.get_trials(deepcopy=False)
    asked = _orphan(study, every, held_trials(sweep), search, lib)
    if asked is None:
        if len(every) >= budget:
            return None
        study.sampler = studies.build_sampler(search, len(every))
        trial = study.ask(studies.distributions(search))
        # Optuna's Trial keeps the storage's id private; trial.json records it too.
        asked = Asked(trial.number, trial._trial_id, dict(trial.params))
        if asked.number >= budget:  # our lock was taken from us as stale: past the budget
            study.tell(asked.number, state=lib.trial.TrialState.FAIL, skip_if_finished=True)
            return None
    hold(asked)
    return asked


def _orphan(
    study: Any, every: list[Any], held: set[int] | None, search: Search, lib: Any
) -> Asked | None:
    """A RUNNING trial that no agent holds (its task was killed between the ask and the
    record), to be run by the agent asking now; one whose parameters were not all drawn is
    told FAIL. None when there is none, or when an agent's record cannot be read."""
    if held is None:
        return None
    adopted = None
    for trial in every:
        if trial.state != lib.trial.TrialState.RUNNING or trial.number in held:
            continue
        if set(trial.params) != set(search.parameters):
            study.tell(trial.number, state=lib.trial.TrialState.FAIL, skip_if_finished=True)
        elif adopted is None:
            adopted = Asked(trial.number, trial._trial_id, dict(trial.params))
    return adopted


def tell(journal: Path, search: Search, number: int, ended: Outcome) -> None:
    """Tell the study how trial ``number`` ended (again is no error: a task killed after
    telling tells once more on restart)."""
    lib = studies.require_optuna()
    with studies.damage_named(journal):
        _tell(lib, studies.open_study(journal, STUDY_NAME, search.pruner), number, ended)


def _tell(lib: Any, study: Any, number: int, ended: Outcome) -> None:
    state = {
        "complete": lib.trial.TrialState.COMPLETE,
        "pruned": lib.trial.TrialState.PRUNED,
        "fail": lib.trial.TrialState.FAIL,
    }[ended.end]
    study.tell(number, ended.value if ended.end == "complete" else None, state=state,
               skip_if_finished=True)  # fmt: skip
