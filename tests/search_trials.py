"""A search's study and a trial linked from a run directory, for the tests of pruning
(tests/test_pruned_runs.py without TensorFlow, tests/test_pruning_local.py with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, trial_ref_text
from hpctf.core.settings.search import Pruner, Search


def search_of(kind: str) -> Search:
    return Search.model_validate(
        {
            "parameters": {"train.args.lr": {"type": "float", "low": 0.001, "high": 0.1}},
            "objective": {"metric": "eval.loss", "direction": "minimize"},
            "trials": 10,
            "pruner": {"kind": kind, "min_evals": 1, "reduction_factor": 3},
        }
    )


def make_trial(
    run_dir: Path, sweep_dir: Path, kind: str, better: int = 5, evals: int = 10
) -> TrialRef:
    """A study in ``sweep_dir`` with ``better`` completed trials far better than any real one
    at every evaluation (so ASHA prunes a new trial at its first), and a new trial linked from
    ``run_dir/trial.json`` (as the search's array task writes it)."""
    optuna = pytest.importorskip("optuna")
    from hpctf.core.search.study import JOURNAL_FILE, create_study

    journal_file = sweep_dir / JOURNAL_FILE
    search = search_of(kind)
    study = create_study(journal_file, "search", search)
    for _ in range(better):
        study.add_trial(
            optuna.trial.create_trial(
                value=0.0,
                intermediate_values={i: 0.0 for i in range(1, evals + 1)},
                # As ASHA leaves a trial that passed its rungs (evaluations 1, 3, 9, ...).
                system_attrs={f"completed_rung_{rung}": 0.0 for rung in range(4)},
            )
        )
    trial = study.ask()
    ref = TrialRef(
        journal=str(journal_file),
        study="search",
        number=trial.number,
        trial_id=trial._trial_id,
        params={},
        objective=search.objective,
        pruner=search.pruner,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TRIAL_FILE).write_text(trial_ref_text(ref))
    return ref


def intermediate_values(ref: TrialRef) -> dict[int, float]:
    from hpctf.core.search.study import open_study

    study = open_study(Path(ref.journal), ref.study, Pruner())
    (trial,) = [t for t in study.get_trials(deepcopy=False) if t._trial_id == ref.trial_id]
    return dict(trial.intermediate_values)
