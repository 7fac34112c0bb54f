"""A search's trial on two real TensorFlow workers (``--site local``): the chief reports every
evaluation to the study; a prune is agreed at one step by both ranks, saved, and the run ends
``pruned`` with exit 0; a pruner that never prunes lets the run finish with every evaluation in
the study; a study that cannot be read is one warning line and the run trains on."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from hpctf.core.run.rundir import RunDir
from hpctf.core.search.trial_ref import TRIAL_FILE
from tests.conftest import DIGITS, HPCTF, REPO, checkpoint_steps
from tests.search_trials import intermediate_values, make_trial, start_trial

CUSTOM_LOOP = REPO / "examples" / "custom_loop" / "experiment.yaml"

pytestmark = pytest.mark.tf

# A tiny run: 24 steps, an evaluation every 6 (4 in all, the last one at the end).
TINY = [
    "train.steps=24",
    "train.eval_every_steps=6",
    "train.log_every_steps=6",
    "checkpoint.every_steps=12",
    "train.args.hidden=16",
]


def _start_trial(
    tmp_path: Path, staged: Path, *sets: str, script: Path = DIGITS
) -> tuple[Path, str]:
    return start_trial(tmp_path, staged, script, *sets)


def _status(run_dir: Path) -> str:
    return subprocess.run(
        [*HPCTF, "status", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout


def _pruned_lines(run_dir: Path, rank: int) -> list[str]:
    log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
    return re.findall(r"the search pruned this trial: saved step (\d+)", log)


def test_a_trial_far_behind_is_pruned_at_one_step_on_both_ranks(
    runs_root: Path, tmp_path: Path
) -> None:
    runs_root.mkdir()  # the study beside the trial's run directory, as in a search's sweep
    ref = make_trial(tmp_path / "staged", runs_root, "asha")
    run_dir, said = _start_trial(tmp_path, tmp_path / "staged" / TRIAL_FILE, *TINY)
    # ASHA (min_evals 1) prunes at the first evaluation (step 6); the vote rides in step 7, at
    # which both ranks stop and save.
    assert _pruned_lines(run_dir, 0) == _pruned_lines(run_dir, 1) == ["7"], said
    assert checkpoint_steps(run_dir) == [7]
    assert not (run_dir / "DONE").exists()
    (record,) = [e for e in RunDir(run_dir).events() if e["event"] == "pruned"]
    assert (record["step"], record["evaluation"], record["metric"]) == (7, 1, "eval.loss")
    assert intermediate_values(ref) == {1: record["value"]}
    ended = [e for e in RunDir(run_dir).events() if e["event"] == "ended"]
    assert [(e["reason"], e["exit_code"]) for e in ended] == [("pruned", 0)]
    assert _status(run_dir).startswith("run: pruned (at evaluation 1 (step 7): eval.loss ")
    runs = subprocess.run(
        [*HPCTF, "runs", "--json"], capture_output=True, text=True, check=True
    ).stdout
    assert [row["state"] for row in json.loads(runs)["runs"]] == ["pruned"], runs
    if importlib.util.find_spec("matplotlib") is not None:  # hpctf[plot]: the pruning drawn
        for what in (run_dir, runs_root):  # the run with its prune marked; the search
            out = tmp_path / f"{what.name}.png"
            drawn = subprocess.run([*HPCTF, "plot", str(what), "-o", str(out)], check=False,
                                   capture_output=True, text=True)  # fmt: skip
            assert drawn.stdout == f"wrote {out}\n", drawn.stdout + drawn.stderr


def test_a_trial_no_pruner_stops_runs_to_its_end_with_every_evaluation_in_the_study(
    runs_root: Path, tmp_path: Path
) -> None:
    ref = make_trial(tmp_path / "staged", tmp_path, "none")
    run_dir, said = _start_trial(tmp_path, tmp_path / "staged" / TRIAL_FILE, *TINY)
    assert json.loads((run_dir / "DONE").read_text())["step"] == 24
    values = intermediate_values(ref)
    assert sorted(values) == [1, 2, 3, 4], said
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {m["step"] // 6: m["eval"]["loss"] for m in metrics if "eval" in m}
    assert values == pytest.approx(evals)
    assert _status(run_dir).startswith("run: done")


def test_a_trial_whose_study_is_damaged_trains_on_with_one_warning(
    runs_root: Path, tmp_path: Path
) -> None:
    ref = make_trial(tmp_path / "staged", tmp_path, "asha")
    Path(ref.journal).write_bytes(b"\x00 not a journal {]\n")
    run_dir, _ = _start_trial(
        tmp_path, tmp_path / "staged" / TRIAL_FILE, *TINY, "resources.nodes=1"
    )
    assert json.loads((run_dir / "DONE").read_text())["step"] == 24
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert log.count("not reporting to the study") == 1, log
    assert "training goes on without pruning" in log


def test_a_fit_scripts_trial_is_pruned_at_an_epochs_end_on_both_ranks(
    runs_root: Path, tmp_path: Path
) -> None:
    """hpctf.keras.callbacks(): the epoch's val_loss is the objective's eval.loss; both ranks
    take the chief's vote at the first epoch's end (step 8), save it and stop fit; the script
    goes on after fit and exits 0; the run ends pruned, without DONE."""
    ref = make_trial(tmp_path / "staged", tmp_path, "asha")
    script = REPO / "tests" / "scripts" / "fit_matrix.py"
    sets = ["resources.tasks_per_node=2", "checkpoint.every_steps=1000"]
    sets.append('train.script_args=["3", "plain", "0.01", "0"]')
    run_dir, said = _start_trial(tmp_path, tmp_path / "staged" / TRIAL_FILE, *sets, script=script)
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "the search pruned this trial: saved step 8; the run ends pruned" in log, said
        assert "fit ended at step 8" in log
    assert checkpoint_steps(run_dir) == [8]
    assert not (run_dir / "DONE").exists()
    (record,) = [e for e in RunDir(run_dir).events() if e["event"] == "pruned"]
    assert (record["step"], record["evaluation"]) == (8, 1)
    assert intermediate_values(ref) == {1: record["value"]}
    assert _status(run_dir).startswith("run: pruned (at evaluation 1 (step 8): eval.loss ")


def test_a_custom_loops_trial_is_pruned_at_one_step_on_both_ranks(
    runs_root: Path, tmp_path: Path
) -> None:
    """``train.loop: custom``: the loop's ``session.evaluated(step, results)`` tells the study;
    both ranks take the chief's vote at that evaluation (step 6), save it and leave; the run
    ends pruned, exit 0, as a trial of hpctf's loop does."""
    runs_root.mkdir()
    ref = make_trial(tmp_path / "staged", runs_root, "asha")
    sets = [s for s in TINY if not s.startswith("train.args.")]
    run_dir, said = _start_trial(tmp_path, tmp_path / "staged" / TRIAL_FILE, *sets,
                                 script=CUSTOM_LOOP)  # fmt: skip
    assert _pruned_lines(run_dir, 0) == _pruned_lines(run_dir, 1) == ["6"], said
    assert checkpoint_steps(run_dir) == [6]
    assert not (run_dir / "DONE").exists()
    (record,) = [e for e in RunDir(run_dir).events() if e["event"] == "pruned"]
    assert (record["step"], record["evaluation"], record["metric"]) == (6, 1, "eval.loss")
    assert intermediate_values(ref) == {1: record["value"]}
    ended = [e for e in RunDir(run_dir).events() if e["event"] == "ended"]
    assert [(e["reason"], e["exit_code"]) for e in ended] == [("pruned", 0)]
    assert _status(run_dir).startswith("run: pruned (at evaluation 1 (step 6): eval.loss ")
