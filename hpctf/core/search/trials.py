"""Asking a search's study for a trial and telling it how one ended (Optuna, imported when a
study is opened), and how a trial's run ended, read from its history.

A trial's end is its run's: ``done`` is COMPLETE with the objective's last evaluation, a run
that ended ``pruned`` is PRUNED, one that failed or gave up is FAIL (and counts toward the
budget, as every trial asked does). A run still queued, running, requeued, preempted or
cancelled is unfinished: its array task resumes it (the same run directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.search import study as studies
from hpctf.core.search.outcome import objective_value
from hpctf.core.search.search_dir import ASK_LOCK, STUDY_NAME
from hpctf.core.settings.search import Objective, Search

# A run in one of these states will go on (its job is queued, running or requeued) or may be
# resumed (saved on a warning; cancelled by its owner): its trial is not over.
UNFINISHED = ("queued", "running", "requeued", "preempted", "cancelled")
# The run history's word for a run stopped by the pruner.
PRUNED = "pruned"

End = Literal["complete", "pruned", "fail"]


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: ``end`` as the study is told, ``value`` (COMPLETE only), ``why``."""

    end: End
    value: float | None = None
    why: str = ""


def outcome(run: RunDir, objective: Objective) -> Outcome | None:
    """How the trial whose run is ``run`` ended, or None while it is unfinished."""
    state = read_history(run).state
    if state.state in UNFINISHED:
        return None
    if state.state == "done":
        value = objective_value(run.path, objective.metric)
        if value is None:
            return Outcome("fail", why=f"done without an evaluation of {objective.metric}")
        return Outcome("complete", value)
    if state.state == PRUNED:
        return Outcome("pruned", why=state.why)
    return Outcome("fail", why=f"{state.state}: {state.why}" if state.why else state.state)


@dataclass(frozen=True)
class Asked:
    """A new trial: its number, Optuna's id of it, its parameters (key path -> value)."""

    number: int
    trial_id: int
    params: dict[str, Any]


def ask(sweep: Path, journal: Path, search: Search, budget: int) -> Asked | None:
    """A new trial from the study, or None when ``budget`` trials have been asked already.
    Counting and asking happen under the sweep's ask lock (an O_EXCL file, as the journal's
    own lock: it holds on NFS and Lustre), so that parallel agents never ask past the
    budget."""
    studies.require_optuna()  # a UserError naming the extra when Optuna is missing
    from optuna.storages.journal import JournalFileOpenLock

    lock = JournalFileOpenLock(str(sweep / ASK_LOCK))
    lock.acquire()
    try:
        study = studies.open_study(journal, STUDY_NAME, search.pruner)
        asked = len(study.get_trials(deepcopy=False))
        if asked >= budget:
            return None
        study.sampler = studies.build_sampler(search, asked)
        trial = study.ask(studies.distributions(search))
        # Optuna's Trial keeps the storage's id private; trial.json records it beside the number.
        return Asked(trial.number, trial._trial_id, dict(trial.params))
    finally:
        lock.release()


def tell(journal: Path, search: Search, number: int, ended: Outcome) -> None:
    """Tell the study how trial ``number`` ended (again is no error: a task killed after
    telling tells once more on restart)."""
    lib = studies.require_optuna()
    study = studies.open_study(journal, STUDY_NAME, search.pruner)
    state = {
        "complete": lib.trial.TrialState.COMPLETE,
        "pruned": lib.trial.TrialState.PRUNED,
        "fail": lib.trial.TrialState.FAIL,
    }[ended.end]
    study.tell(number, ended.value if ended.end == "complete" else None, state=state,
               skip_if_finished=True)  # fmt: skip
