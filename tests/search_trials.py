"""A search's study and a trial linked from a run directory, for the tests of pruning
(tests/test_pruned_runs.py without TensorFlow, tests/test_pruning_local.py with it); a search's
sweep directory as ``hpctf sweep`` makes it, and a trial's run ended as job-end ends it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, trial_ref_text
from hpctf.core.settings.search import Pruner, Search
from hpctf.login.resolving.loader import load_config
from hpctf.login.sweeps.search_start import SearchPlan, create_search
from tests.conftest import DIGITS


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


SPACE = {
    "train.args.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
    "train.args.hidden": {"type": "categorical", "choices": [8, 16, 32]},
}


def make_search(tmp_path: Path, trials: int = 4, sampler: str = "tpe") -> Path:
    """A search's sweep directory as ``hpctf sweep`` makes it (study, base, script), without
    submitting its array (tests/test_search_agent.py, tests/test_dashboard.py)."""
    experiment = tmp_path / "experiment.yaml"
    text = DIGITS.read_text()
    text = text.replace("train:\n", "train:\n  python_path: [" + str(DIGITS.parent) + "]\n", 1)
    objective = {"metric": "eval.loss", "direction": "minimize"}
    search = {"parameters": SPACE, "objective": objective, "trials": trials, "parallel": 2,
              "sampler": sampler}  # fmt: skip
    experiment.write_text(text + "sweep: " + json.dumps(search) + "\n")
    env = {"HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    config = load_config(experiment, "local-slurm", ["resources.nodes=1"], env).config
    assert config.experiment.sweep is not None
    plan = SearchPlan(config, config.experiment.sweep, trials, 2, "test")
    return create_search(experiment, plan, []).path


def end_run(run_dir: Path, handle: str, reason: str, loss: float | None = None) -> None:
    """What job-start, the chief and job-end leave in a run that ended ``reason``."""
    run = RunDir(run_dir)
    journal.record_started(run, handle, nodes="node1", walltime_signal="USR2")
    if loss is not None:
        with run.metrics.open("a") as out:
            out.write(json.dumps({"step": 10, "eval": {"loss": loss}}) + "\n")
    journal.record_ended(run, handle, 0 if reason == "done" else 75, reason)
