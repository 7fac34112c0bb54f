"""A search's pruned trial without TensorFlow: the ``pruned`` end in the run's history (its own
state, never requeued, counted as finished), what a trial's run came to
(hpctf/core/search/outcome.py), the worker's link to the study (compute/loop/pruning.py) with a
study that is fine, pruning, or broken."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hpctf.core.errors import PREEMPTED_EXIT
from hpctf.core.run import journal
from hpctf.core.run.history import PRUNED, REASONS, RunHistory
from hpctf.core.run.history.ends import end_of_start
from hpctf.core.run.history.events import typed
from hpctf.core.run.history.runstate import after_end, before_start, run_state
from hpctf.core.search.outcome import eval_values, metric_in, objective_value, run_end
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, trial_ref_text
from hpctf.core.settings.search import Pruner, Search
from tests.journal_records import BUDGETS, ended, requeued, started, write_events


def pruned(step: int = 11, evaluation: int = 1, value: float | None = 2.5) -> dict[str, Any]:
    return {
        "event": journal.PRUNED,
        "job_id": "7",
        "step": step,
        "evaluation": evaluation,
        "metric": "eval.loss",
        "value": value,
    }


def test_a_pruned_start_ends_pruned_and_the_run_is_finished() -> None:
    events = [started(), pruned(), ended(PRUNED, 11, code=0)]
    state = run_state(events)
    assert PRUNED in REASONS
    assert (state.state, state.why) == ("pruned", "at evaluation 1 (step 11): eval.loss 2.5")
    assert state.last is not None and state.last.end_step == 11


def test_the_reason_of_a_start_whose_chief_recorded_a_prune() -> None:
    since = typed([pruned()])
    assert end_of_start(since, 0, False, "USR2") == PRUNED
    # The batch shell died after the save (no exit code) or srun reported 75: still pruned.
    assert end_of_start(since, None, False, "USR2") == PRUNED
    assert end_of_start(since, PREEMPTED_EXIT, False, "USR2") == PRUNED
    # A rank that crashed after the record is a failure; a cancel is a cancel.
    assert end_of_start(since, 1, False, "USR2") == "failed"
    cancelled = typed([pruned(), {"event": journal.CANCELLED, "jobs": ["7"]}])
    assert end_of_start(cancelled, 0, False, "USR2") == "cancelled"
    # Without the record, exit 0 without DONE stays what it was.
    assert end_of_start((), 0, False, "USR2") == "done"


def test_job_end_never_requeues_a_pruned_run_and_job_start_ends_at_once() -> None:
    state = run_state([started(), pruned(), ended(PRUNED, 11, code=0)])
    decision = after_end(state, BUDGETS)
    assert (decision.go, decision.gave_up) == (False, False)
    assert decision.why.startswith("pruned at evaluation 1")
    again = before_start(state, BUDGETS)
    assert (again.go, again.gave_up) == (False, False)
    assert "pruned" in again.why


def test_a_start_killed_after_the_prune_record_is_closed_pruned_at_its_step() -> None:
    """The batch shell died with its node after the chief recorded the prune: the next start
    (here: a requeue by Slurm) closes it as pruned, at the saved step."""
    state = run_state([started(), pruned(step=21, evaluation=2), started(21, job="8")])
    assert state.starts[0].reason == PRUNED and state.starts[0].end_step == 21


def test_a_requeue_after_a_prune_is_no_longer_the_runs_last_word() -> None:
    state = run_state([started(), pruned(), ended(PRUNED, 11, code=0), requeued()])
    assert state.state == "requeued"  # something requeued it anyway: say so, as for any end


def test_the_history_names_where_the_trial_was_pruned() -> None:
    history = RunHistory.of([started(), pruned(value=None), ended(PRUNED, 11, code=0)])
    assert history.pruned is not None and history.pruned.evaluation == 1
    assert history.since_last_start_pruned
    assert history.state.why == "at evaluation 1 (step 11)"


def test_metric_in_and_the_objective_of_a_run(tmp_path: Path) -> None:
    assert metric_in({"step": 10, "eval": {"loss": 0.5}}, "eval.loss") == 0.5
    assert metric_in({"step": 10, "loss": 0.7}, "loss") == 0.7
    assert metric_in({"step": 10, "eval": {"loss": True}}, "eval.loss") is None
    assert metric_in({"step": 10, "eval": {"loss": float("nan")}}, "eval.loss") is None
    assert metric_in({"step": 10, "eval": 3}, "eval.loss") is None
    lines: list[dict[str, Any]] = [
        {"step": 10, "loss": 2.0},
        {"step": 10, "eval": {"loss": 1.5, "accuracy": 0.3}},
        {"step": 20, "eval": {"loss": 1.0, "accuracy": 0.6}},
        {"resumed_from": 10, "time": 0},  # a start that lost step 20: it is logged again
        {"step": 20, "eval": {"loss": 0.9, "accuracy": 0.7}},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert eval_values(lines[:3], "eval.accuracy") == [(10, 0.3), (20, 0.6)]
    assert objective_value(tmp_path, "eval.loss") == 0.9
    assert objective_value(tmp_path, "eval.auc") is None
    assert objective_value(tmp_path / "nowhere", "eval.loss") is None


def test_run_end_reads_the_journal(tmp_path: Path) -> None:
    write_events(tmp_path, started(), pruned(), ended(PRUNED, 11, code=0))
    assert run_end(tmp_path) == "pruned"


# --- the worker's link to the study (Optuna, no TensorFlow) ------------------------------------


def _search(kind: str) -> Search:
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
    search = _search(kind)
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


def test_the_chief_reports_and_asha_prunes_a_trial_far_behind(tmp_path: Path) -> None:
    from hpctf.compute.loop.pruning import trial_pruning

    ref = make_trial(tmp_path / "run", tmp_path, "asha")
    chief = trial_pruning(tmp_path / "run", chief=True)
    other = trial_pruning(tmp_path / "run", chief=False)
    assert chief is not None and other is not None
    assert other.report(10, 1, {"loss": 2.0}, ask=True) is False  # only the chief asks
    assert chief.report(10, 1, {"loss": 2.0, "accuracy": 0.1}, ask=True) is True
    assert chief.candidate is not None and chief.candidate.evaluation == 1
    assert intermediate_values(ref) == {1: 2.0}


def test_no_pruner_never_prunes_and_every_value_is_in_the_study(tmp_path: Path) -> None:
    from hpctf.compute.loop.pruning import trial_pruning

    ref = make_trial(tmp_path / "run", tmp_path, "none")
    chief = trial_pruning(tmp_path / "run", chief=True)
    assert chief is not None
    assert [chief.report(10 * i, i, {"loss": 3.0 - i}, ask=True) for i in (1, 2, 3)] == [False] * 3
    assert intermediate_values(ref) == {1: 2.0, 2: 1.0, 3: 0.0}


def test_a_run_without_trial_json_is_no_trial_and_a_damaged_one_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hpctf.compute.loop.pruning import trial_pruning

    assert trial_pruning(tmp_path, chief=True) is None
    (tmp_path / TRIAL_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        assert trial_pruning(tmp_path, chief=True) is None
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{TRIAL_FILE} is damaged (Expecting property name")
    assert said.endswith("the run is no trial of its search")


@pytest.mark.parametrize("damage", ["garbage", "missing directory", "finished trial"])
def test_a_study_that_cannot_be_used_is_one_warning_and_no_pruning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    from hpctf.compute.loop.pruning import trial_pruning
    from hpctf.core.search.study import open_study

    ref = make_trial(tmp_path / "run", tmp_path, "asha")
    if damage == "garbage":
        Path(ref.journal).write_bytes(b"\x00\x01 not a journal\n{]\n")
    elif damage == "missing directory":
        moved = {**ref.to_json(), "journal": str(tmp_path / "gone" / "study.journal")}
        (tmp_path / "run" / TRIAL_FILE).write_text(json.dumps(moved))
    else:
        open_study(Path(ref.journal), ref.study, ref.pruner).tell(ref.number, 1.0)
    chief = trial_pruning(tmp_path / "run", chief=True)
    assert chief is not None
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        assert chief.report(10, 1, {"loss": 2.0}, ask=True) is False
        assert chief.report(20, 2, {"loss": 2.0}, ask=True) is False  # not asked again
    warnings = [r.getMessage() for r in caplog.records if r.name == "hpctf.worker"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"search trial {ref.number}: not reporting to the study")
    assert warnings[0].endswith("training goes on without pruning")


def test_an_evaluation_without_the_objective_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hpctf.compute.loop.pruning import trial_pruning

    make_trial(tmp_path / "run", tmp_path, "asha")
    chief = trial_pruning(tmp_path / "run", chief=True)
    assert chief is not None
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        assert chief.report(10, 1, {"accuracy": 0.2}, ask=True) is False
    assert "has no 'eval.loss' value" in caplog.text
