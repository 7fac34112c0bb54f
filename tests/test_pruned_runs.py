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
from hpctf.core.run.history.decisions import after_end, before_start
from hpctf.core.run.history.ends import end_of_start
from hpctf.core.run.history.events import typed
from hpctf.core.run.history.runstate import run_state
from hpctf.core.search.outcome import eval_values, metric_in, objective_value, run_end
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, trial_ref_text
from tests.journal_records import BUDGETS, ended, requeued, started, write_events
from tests.search_trials import intermediate_values, make_trial, search_of


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


def test_the_objective_of_a_fit_script_is_its_val_metric(tmp_path: Path) -> None:
    # model.fit's epochs are recorded with Keras's names (hpctf.compute.script.fit): a trial
    # that ran to its end is judged on its last val_loss, not told FAIL for lacking eval.loss.
    lines = [
        {"step": 32, "loss": 2.0, "accuracy": 0.4},
        {"step": 32, "eval": {"val_loss": 1.5, "val_accuracy": 0.3}},
        {"step": 64, "eval": {"val_loss": 1.1, "val_accuracy": 0.5}},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert objective_value(tmp_path, "eval.loss") == 1.1
    assert objective_value(tmp_path, "eval.accuracy") == 0.5
    assert objective_value(tmp_path, "eval.val_loss") == 1.1  # Keras's own name still reads
    assert metric_in({"step": 1, "eval": {"loss": 0.2, "val_loss": 9.0}}, "eval.loss") == 0.2
    assert metric_in({"step": 1, "val_loss": 9.0}, "loss") is None  # training loss: no fallback


def test_run_end_reads_the_journal(tmp_path: Path) -> None:
    write_events(tmp_path, started(), pruned(), ended(PRUNED, 11, code=0))
    assert run_end(tmp_path) == "pruned"


# --- the worker's link to the study (Optuna, no TensorFlow) ------------------------------------


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


# --- hpctf plot SWEEP of a search -------------------------------------------------------------


def fake_search(sweep: Path) -> None:
    """A search's sweep directory as its agents leave it: the study file, and trials' run
    directories (trial.json, metrics, journal): 0 done, 1 pruned at its first evaluation,
    2 done and better, 3 failed before evaluating, 4 with a damaged trial.json."""
    sweep.mkdir()
    (sweep / "study.journal").write_text("")
    search = search_of("asha")
    curves = {0: [1.0, 0.8, 0.6], 1: [2.0], 2: [0.9, 0.5, 0.3], 3: []}
    for number, values in curves.items():
        run_dir = sweep / f"s-trial-{number:04d}"
        ref = TrialRef(str(sweep / "study.journal"), "search", number, number, {}, search.objective,
                       search.pruner)  # fmt: skip
        run_dir.mkdir()
        (run_dir / TRIAL_FILE).write_text(trial_ref_text(ref))
        lines = [{"step": 10 * i, "eval": {"loss": v}} for i, v in enumerate(values, 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        if number == 1:
            end: list[dict[str, Any]] = [pruned(11, 1, 2.0), ended(PRUNED, 11, code=0)]
        elif number == 3:
            end = [ended("failed", 0, code=1)]
        else:
            end = [ended("done", 30, code=0)]
            (run_dir / "DONE").write_text("{}\n")
        write_events(run_dir, started(), *end)
    (sweep / "s-trial-0004").mkdir()
    (sweep / "s-trial-0004" / TRIAL_FILE).write_text("{")


def test_the_trials_of_a_search_with_their_curves_ends_and_best_so_far(tmp_path: Path) -> None:
    from hpctf.login.watching.search_plot import best_so_far, is_search, search_trials

    fake_search(tmp_path / "s")
    assert is_search(tmp_path / "s") and not is_search(tmp_path / "s" / "s-trial-0000")
    trials, ref = search_trials(tmp_path / "s")
    assert ref is not None and ref.objective.metric == "eval.loss"
    assert [(t.number, t.state, t.value, t.pruned_at) for t in trials] == [
        (0, "done", 0.6, None),
        (1, "pruned", 2.0, (10, 2.0)),  # its last evaluation before the saved step 11
        (2, "done", 0.3, None),
        (3, "failed", None, None),
    ]
    assert best_so_far(trials, "minimize") == [(0, 0.6), (2, 0.3)]
    assert best_so_far(trials, "maximize") == [(0, 0.6), (2, 0.6)]


def test_plot_of_a_search_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from hpctf.cli import cli

    fake_search(tmp_path / "s")
    out = tmp_path / "search.png"
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "s"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    default = CliRunner().invoke(cli, ["plot", str(tmp_path / "s")])
    assert default.exit_code == 0 and (tmp_path / "s" / "search.png").exists()


def test_plot_of_a_search_without_evaluations_says_so(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from hpctf.cli import cli

    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "study.journal").write_text("")
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "no trial has logged an evaluation yet; nothing to plot" in result.output


def test_job_end_of_a_pruned_trial_neither_requeues_nor_gives_up(
    runs_root: Path, fake_sbatch: Path
) -> None:
    """The batch side (fake Slurm commands): the workers exited 0 after the chief's record;
    job-end records the end pruned and asks Slurm for nothing; a start of the same job again
    (a requeue by Slurm itself) ends at once with nothing to do."""
    from click.testing import CliRunner

    from hpctf.cli import cli
    from hpctf.core.errors import NOT_STARTING_EXIT
    from hpctf.core.run.rundir import RunDir
    from tests.conftest import DIGITS
    from tests.fake_slurm import fake_checkpoint, fake_command

    assert CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"]).exit_code == 0
    (run_dir,) = runs_root.iterdir()
    scontrol = fake_command(fake_sbatch.parent / "fakebin", "scontrol", ":")
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]"}
    assert CliRunner().invoke(cli, ["job-start", str(run_dir)], env=env).exit_code == 0
    fake_checkpoint(run_dir / "checkpoints", 11)
    journal.record_pruned(RunDir(run_dir), "4242", 11, 1, "eval.loss", 2.5)
    result = CliRunner().invoke(cli, ["job-end", str(run_dir), "--exit-code", "0"], env=env)
    assert result.exit_code == 0, result.output
    said = "hpctf: job 4242 ended: pruned at evaluation 1 (step 11): eval.loss 2.5\n"
    assert result.output == said
    assert not scontrol.exists() or "requeue" not in scontrol.read_text()
    assert run_end(run_dir) == "pruned"
    again = CliRunner().invoke(cli, ["job-start", str(run_dir)], env=env)
    assert again.exit_code == NOT_STARTING_EXIT, again.output
    assert "ends at once: the search pruned the run at evaluation 1 (step 11)" in again.output


def test_hyperband_takes_the_reports_of_a_trial(tmp_path: Path) -> None:
    """Hyperband (its brackets from the study's name and the trial's number, the same in every
    process) answers the chief at each evaluation without an error."""
    from hpctf.compute.loop.pruning import trial_pruning
    from hpctf.core.search.trial_ref import read_trial_ref

    ref = make_trial(tmp_path / "run", tmp_path, "asha")
    hyperband = {**ref.to_json(), "pruner": {"kind": "hyperband", "min_evals": 1, "max_evals": 9}}
    (tmp_path / "run" / TRIAL_FILE).write_text(json.dumps(hyperband))
    assert (linked := read_trial_ref(tmp_path / "run")) is not None
    assert linked.pruner.kind == "hyperband"
    chief = trial_pruning(tmp_path / "run", chief=True)
    assert chief is not None
    answers = [chief.report(10 * i, i, {"loss": 5.0}, ask=True) for i in (1, 2, 3)]
    assert not chief._broken and True in answers  # far behind the 5 better trials
