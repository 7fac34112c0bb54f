"""A search's study and a trial linked from a run directory, for the tests of pruning
(tests/test_pruned_runs.py without TensorFlow, tests/test_pruning_local.py with it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
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


# What the search's array task does (login/sweeps, #33): make the trial's run directory, put its
# trial.json in, start it. Here with the one submission pipeline, on the site given.
_START_TRIAL = """
import os, shutil, sys
from pathlib import Path
from hpctf.login.resolving.loader import load_config
from hpctf.login.submitting.pipeline import RunJob
experiment, site, run_dir, trial, *sets = sys.argv[1:]
config = load_config(Path(experiment), site, sets, os.environ).config
job = RunJob(config, path=Path(run_dir))
planned = job.plan()
created = job.create(planned, job.render(planned))
shutil.copy(trial, Path(run_dir) / "trial.json")
sys.exit(job.start(created))
"""


def start_trial(
    cwd: Path,
    staged: Path,
    experiment: Path,
    *sets: str,
    site: str = "local",
    env: Mapping[str, str] | None = None,
) -> tuple[Path, str]:
    """Start ``experiment`` as the trial linked from ``staged`` (a trial.json) in
    ``cwd/runs/trial-0``; its run directory and what the start printed (a local site: the
    whole run; Slurm: the submission)."""
    run_dir = cwd / "runs" / "trial-0"
    proc = subprocess.run(
        [sys.executable, "-c", _START_TRIAL, str(experiment), site, str(run_dir), str(staged),
         *sets],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env=None if env is None else dict(env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr  # pruned is success-like
    return run_dir, proc.stdout + proc.stderr
