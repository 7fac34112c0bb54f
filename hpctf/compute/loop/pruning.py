"""A search's trial in hpctf's loop: each evaluation told to the study, and pruning agreed by
every rank at one step.

A run whose directory holds ``RUN/trial.json`` (:mod:`hpctf.core.search.trial_ref`) is a trial
of a search. At every evaluation of ``train.eval_every_steps`` the chief reports the objective's
value to the study as the trial's intermediate value at resource = the evaluation's index (1,
2, ...: the step over ``train.eval_every_steps``, the same after a resume) and asks the
search's pruner whether to stop. The chief's vote rides in the next step's own reduction
(:meth:`hpctf.compute.loop.step_flags.StepFlags.vote_prune`): the loop runs that step alone and
every rank reads the agreed vector after it, so every rank decides at the same step without a
collective of its own. A pruned run saves that step on every rank, the chief records
``pruned`` in the journal (the step, the evaluation, the value) and every rank exits 0: the
run ends ``pruned`` (:mod:`hpctf.core.run.history`), finished, never requeued.

The study is opened once per run, on the chief, at the first evaluation; Optuna is imported
only then. A study that cannot be reached or read (a damaged journal, a missing sweep
directory, the trial already finished in it) is one warning line and the run trains on as if
it were no trial: a run never fails because of its study.

Every rank reads ``trial.json`` itself (it is written once, before the run's first start), so
every rank knows alike whether the run is a trial; a run without it pays nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.core.run import journal
from hpctf.core.search.outcome import metric_in
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, read_trial_ref

log = logging.getLogger("hpctf.worker")


@dataclass(frozen=True)
class PruningPoint:
    """Where the pruner stopped the trial: the evaluation's step and index, and its value."""

    eval_step: int
    evaluation: int
    value: float


class TrialPruning:
    """The chief's link to the trial in its study, and what every rank needs to agree on a
    prune (made by :func:`trial_pruning`)."""

    def __init__(self, ref: TrialRef, chief: bool) -> None:
        self.ref = ref
        self.chief = chief
        self._trial: Any = None  # optuna.Trial, on the chief once the study is open
        self._broken = False  # the study failed once: said once, never asked again
        self.candidate: PruningPoint | None = None  # the chief's vote, until agreed

    @property
    def metric(self) -> str:
        return self.ref.objective.metric

    def report(self, step: int, evaluation: int, results: dict[str, float], ask: bool) -> bool:
        """Chief only (others: False): tell the study the objective's value in ``results`` (an
        evaluation's, as recorded under ``eval``) at ``evaluation``; with ``ask``, whether the
        pruner stops the trial here. Never raises for the study's sake."""
        if not self.chief or self._broken:
            return False
        value = metric_in({"eval": results, **results}, self.metric)
        if value is None:
            self._give_up(f"the evaluation at step {step} has no {self.metric!r} value")
            return False
        try:
            trial = self._open()
            trial.report(value, evaluation)
            prune = ask and bool(trial.should_prune())
        except Exception as exc:  # the study's file, lock or state: never the run's end
            self._give_up(f"{type(exc).__name__}: {exc}")
            return False
        if prune:
            self.candidate = PruningPoint(step, evaluation, value)
        return prune

    def _open(self) -> Any:
        if self._trial is None:
            import optuna  # only a trial's chief, at its first evaluation

            from hpctf.core.search.study import open_study

            ref = self.ref
            study = open_study(Path(ref.journal), ref.study, ref.pruner)
            self._trial = optuna.trial.Trial(study, ref.trial_id)
        return self._trial

    def _give_up(self, why: str) -> None:
        self._broken = True
        log.warning(
            "search trial %d: not reporting to the study %s (%s): %s; training goes on "
            "without pruning",
            self.ref.number,
            self.ref.study,
            self.ref.journal,
            why,
        )

    def record(self, run: journal.JournalDir, job_id: str, step: int) -> None:
        """Chief: every rank saved ``step`` after the agreed prune; say where in the journal."""
        point = self.candidate
        evaluation, value = (0, None) if point is None else (point.evaluation, point.value)
        journal.record_pruned(run, job_id, step, evaluation, self.metric, value)


def trial_pruning(run_dir: Path, chief: bool) -> TrialPruning | None:
    """The run's trial when ``run_dir`` holds ``trial.json`` (None: no trial; a damaged file
    is one warning line on each rank and no trial)."""
    try:
        ref = read_trial_ref(run_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s is damaged (%s): the run is no trial of its search", TRIAL_FILE, exc)
        return None
    if ref is None:
        return None
    if chief:
        log.info(
            "search trial %d of study %s: reporting %s at every evaluation (pruner %s)",
            ref.number,
            ref.study,
            ref.objective.metric,
            ref.pruner.kind,
        )
    return TrialPruning(ref, chief)


def evaluation_index(step: int, eval_every_steps: int) -> int:
    """The evaluation's index, 1 for the first: a resumed run counts as the one before it."""
    return step // eval_every_steps
