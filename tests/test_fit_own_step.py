"""The true numbers for a newcomer's Keras 3 fit script on 2 real local workers
(tests/scripts/fit_own_step.py): a ``train_step`` and ``test_step`` of its own with its own
trackers and an L2 term added by hand, BatchNormalization, a finite shuffled dataset, and a
rank killed mid-fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HPCTF, REPO, submit_script

pytestmark = pytest.mark.tf

SCRIPT = REPO / "tests" / "scripts" / "fit_own_step.py"


def _submit(
    cwd: Path, *args: str, workers: int = 2
) -> tuple[subprocess.CompletedProcess[str], Path]:
    return submit_script(cwd, SCRIPT, args, workers=workers)


def _printed(run_dir: Path, what: str, ranks: int = 2) -> list[Any]:
    """What each rank printed after ``what`` (WEIGHTS, STATE, EVALUATE), rank 0 first."""
    found = []
    for rank in range(ranks):
        text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        (line,) = [line for line in text.splitlines() if line.startswith(what + " ")]
        found.append(json.loads(line.split(" ", 1)[1]))
    return found


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _validation(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r["eval"] for r in _records(run_dir) if "eval" in r}


def _alone(run_dir: Path, kind: str) -> dict[str, float]:
    """The saved weights scored in a process of their own, with no strategy."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "score", str(run_dir / "final.weights.h5"), kind],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("ALONE ")]
    return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]


def test_an_own_train_step_records_what_the_saved_model_scores_and_the_ranks_hold_one_model(
    runs_root: Path, tmp_path: Path
) -> None:
    """The guide's own steps (self.compute_loss, a Mean tracker of their own, an L2 term) with
    BatchNormalization on 2 workers: the recorded val_ce is the saved model's cross-entropy
    scored alone (it was half of it), and both ranks end with the same weights and the same
    moving statistics (they differed by up to 0.0164)."""
    proc, run_dir = _submit(tmp_path, "bn", "repeat", "0.01", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    said = [line for line in log.splitlines() if "has its own train_step and test_step" in line]
    assert len(said) == 1 and "on 2 replicas" in said[0], log
    assert "BatchNormalization statistics are averaged across 2 replicas" in log
    alone = _alone(run_dir, "bn")
    recorded = _validation(run_dir)[64]
    assert recorded["val_ce"] == pytest.approx(alone["ce"], abs=1e-3)
    assert recorded["val_accuracy"] == pytest.approx(alone["accuracy"], abs=1e-3)
    assert recorded["val_l2"] == pytest.approx(alone["l2"], abs=1e-3)
    in_run = _printed(run_dir, "EVALUATE")
    assert in_run[0] == in_run[1]
    assert in_run[0]["ce"] == pytest.approx(alone["ce"], abs=1e-6), "the in-run evaluate"
    weights, state = _printed(run_dir, "WEIGHTS"), _printed(run_dir, "STATE")
    assert weights[0] == weights[1], "the ranks trained two models"
    assert state[0] == state[1], "the ranks' BatchNormalization statistics differ"


def test_an_own_train_step_trains_as_on_one_machine(runs_root: Path, tmp_path: Path) -> None:
    """Gradients averaged, the hand-added L2 term counted once: 2 workers on a global batch of
    32 train the model 1 worker trains on the same batches (the L2 term counted twice and the
    cross-entropy halved, it drifted: 179.0 against 184.1)."""
    two, two_dir = _submit(tmp_path, "plain", "repeat", "0.01", "0")
    one, one_dir = _submit(tmp_path, "plain", "repeat", "0.01", "0", workers=1)
    assert two.returncode == 0 and one.returncode == 0, two.stdout + two.stderr + one.stderr
    assert _printed(two_dir, "WEIGHTS")[0] == pytest.approx(
        _printed(one_dir, "WEIGHTS", ranks=1)[0], rel=1e-4
    )
    for step, values in _validation(one_dir).items():
        assert _validation(two_dir)[step] == pytest.approx(values, abs=1e-4), step


def test_batch_normalization_resumes_as_if_never_stopped(runs_root: Path, tmp_path: Path) -> None:
    """A warning at step 21 of 64, saved at the agreed step and resumed: every evaluation within
    1e-6 of an uninterrupted run's, and the same final model (the moving statistics averaged
    at each save and evaluation, whatever steps they were saved at)."""
    whole, whole_dir = _submit(tmp_path, "bn", "repeat", "0.01", "0")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    stopped, run_dir = _submit(tmp_path, "bn", "repeat", "0.01", "21")
    assert stopped.returncode != 0 and "resume with: hpctf resubmit" in stopped.stdout
    resumed = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir)], capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    (resumed_line,) = [line for line in log.splitlines() if "resumed from" in line]
    saved = int(resumed_line.rsplit(" ", 1)[1])
    assert 21 <= saved < 32, resumed_line  # the agreed step after the warning, inside epoch 2
    assert "Value in checkpoint could not be found" not in log, "restore warnings"
    expected, got = _validation(whole_dir), _validation(run_dir)
    assert sorted(got) == sorted(expected) == [16, 32, 48, 64]
    for step, values in expected.items():
        assert got[step] == pytest.approx(values, abs=1e-6), step
    resumed, uninterrupted = (
        [value for row in _printed(path, "STATE")[0] for value in row]
        for path in (run_dir, whole_dir)
    )
    assert resumed == pytest.approx(uninterrupted, abs=1e-6)


def test_a_finite_shuffled_input_is_named_before_the_first_step(
    runs_root: Path, tmp_path: Path
) -> None:
    """fit iterates a finite .shuffle() dataset anew every epoch: a resume cannot repeat an
    epoch's order, and the run says so at its start, with what to write instead."""
    proc, run_dir = _submit(tmp_path, "plain", "finite", "0.01", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    warned = [i for i, line in enumerate(log.splitlines()) if "draws a new order every" in line]
    first_step = [i for i, line in enumerate(log.splitlines()) if " step 1/" in line]
    assert warned and first_step and warned[0] < first_step[0], log
    assert "dataset.shuffle(N, seed=S).repeat() and steps_per_epoch=K" in log
    repeat, repeat_dir = _submit(tmp_path, "plain", "repeat", "0.01", "0")
    assert repeat.returncode == 0, repeat.stdout + repeat.stderr
    assert "draws a new order" not in (repeat_dir / "logs" / "rank-0.log").read_text()


def test_a_rank_killed_mid_fit_is_the_environments_one_line(
    runs_root: Path, tmp_path: Path
) -> None:
    """SIGKILL of rank 1 at step 40 of a fit: rank 0 leaves with exit 3 and one line naming
    rank 1 and its host, no TensorFlow traceback on the terminal; status's step is the last
    recorded one."""
    proc, run_dir = _submit(tmp_path, "plain", "repeat", "0.01", "0", "40")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    terminal = proc.stdout + proc.stderr
    (line,) = [line for line in terminal.splitlines() if line.startswith("Error: ")]
    assert line.startswith("Error: rank 1 (localhost:") and "stopped answering" in line, line
    assert "(cause:" not in line and len(line) < 400, line
    assert "a bug in hpctf" not in terminal and "Traceback" not in terminal, terminal
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    # The survivor recorded the loss: the restart's cause is a lost peer, not a crash.
    assert "failed at step 40 (exit 3; no checkpoint, cause peer_lost)" in status, status


def test_a_finished_fit_script_trains_on_through_its_arguments(
    runs_root: Path, tmp_path: Path
) -> None:
    """A done fit-script run is given more epochs through its script's arguments and resumes
    from its last checkpoint; train.epochs, which the script does not read, is refused in one
    line that says how."""
    proc, run_dir = _submit(tmp_path, "plain", "repeat", "0.01", "0", "0", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((run_dir / "DONE").read_text())["step"] == 32
    refused = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir), "--set", "train.epochs=4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    (line,) = refused.stderr.splitlines()
    assert "trains as long as it says itself" in line and "train.script_args=[...]" in line
    more = json.dumps(["plain", "repeat", "0.01", "0", "0", "4"])
    extended = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir), "--set", f"train.script_args={more}"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert extended.returncode == 0, extended.stdout + extended.stderr
    assert json.loads((run_dir / "DONE").read_text())["step"] == 64
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "at step 32" in next(line for line in log.splitlines() if "resumed from" in line)
    assert sorted(_validation(run_dir)) == [16, 32, 48, 64]
