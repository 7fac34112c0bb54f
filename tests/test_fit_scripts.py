"""A researcher's own ``model.fit`` script on 2 real local workers (tests/scripts/fit_matrix.py):
one model on both, the numbers ``evaluate`` gives, validation in the records, an exact resume
with random layers, and a script without a strategy stopped before its first step."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HPCTF, REPO, submit_script

SCRIPT = REPO / "tests" / "scripts" / "fit_matrix.py"


def _submit(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    keras_2 = ["train.keras=2"] if args[0] == "2" else []
    return submit_script(cwd, SCRIPT, args, *keras_2)


def _printed(run_dir: Path, what: str) -> list[Any]:
    """What each rank printed after ``what`` (WEIGHTS, EVALUATE), rank 0 first."""
    found = []
    for rank in (0, 1):
        text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        (line,) = [line for line in text.splitlines() if line.startswith(what + " ")]
        found.append(json.loads(line.split(" ", 1)[1]))
    return found


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _train(run_dir: Path) -> dict[int, dict[str, float]]:
    records = [r for r in _records(run_dir) if "loss" in r]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"a step recorded twice: {steps}"
    return {r["step"]: r for r in records}


def _validation(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r["eval"] for r in _records(run_dir) if "eval" in r}


def _assert_true_numbers(run_dir: Path, cwd: Path) -> None:
    weights = _printed(run_dir, "WEIGHTS")
    assert weights[0] == weights[1], "the two ranks trained two different models"
    evaluated = _printed(run_dir, "EVALUATE")[0]
    # Learning rate 0: the model never changes, and an epoch of 8 batches of 32 is the 256
    # examples once, so the epoch's mean loss is what evaluate gives on them. Summed over the
    # 2 workers (tf_keras as it comes) it would be twice that.
    train = _train(run_dir)
    for step in (8, 16, 24, 32):
        assert train[step]["loss"] == pytest.approx(evaluated["loss"], rel=1e-3)
        assert train[step]["accuracy"] == pytest.approx(evaluated["accuracy"], rel=1e-3)
    validation = _validation(run_dir)
    assert sorted(validation) == [8, 16, 24, 32]
    assert set(validation[32]) == {"val_loss", "val_accuracy"}
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    assert "eval: step 32: val_accuracy " in status, status
    assert (run_dir / "final.keras").is_file()
    assert not list(cwd.glob("*.keras")), "a rank wrote into the directory hpctf ran from"


@pytest.mark.tf
@pytest.mark.parametrize("keras", ["3", "2"])
def test_fit_trains_one_model_and_records_the_numbers_evaluate_gives(
    keras: str, runs_root: Path, tmp_path: Path
) -> None:
    proc, run_dir = _submit(tmp_path, keras, "plain", "0", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    name = "keras 3." if keras == "3" else "tf_keras 2."
    log = (run_dir / "logs" / "rank-1.log").read_text()
    assert f"{name}" in log and "fit under MultiWorkerMirroredStrategy" in log
    _assert_true_numbers(run_dir, tmp_path)


@pytest.mark.tf
def test_keras_3_fit_with_random_layers_resumes_as_if_never_stopped(
    runs_root: Path, tmp_path: Path
) -> None:
    whole, whole_dir = _submit(tmp_path, "3", "random", "0.01", "0")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    stopped, run_dir = _submit(tmp_path, "3", "random", "0.01", "11")
    assert stopped.returncode != 0 and "resume with: hpctf resubmit" in stopped.stdout
    resumed = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir)], capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    saved = json.loads((run_dir / "DONE").read_text())["step"]
    assert saved == 32
    log = (run_dir / "logs" / "rank-0.log").read_text()
    (resume_line,) = [line for line in log.splitlines() if "resuming fit at epoch" in line]
    assert "passing over" in resume_line

    assert _printed(run_dir, "WEIGHTS")[0] == _printed(whole_dir, "WEIGHTS")[0]
    expected, got = _train(whole_dir), _train(run_dir)
    assert sorted(got) == list(range(1, 33)), "a step trained twice or never"
    for step in range(1, 33):
        # Keras's logs are running means over the epoch, restored with the checkpoint.
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
    validation, expected_validation = _validation(run_dir), _validation(whole_dir)
    assert sorted(validation) == sorted(expected_validation) == [8, 16, 24, 32]
    for step, values in expected_validation.items():
        assert validation[step] == pytest.approx(values, abs=1e-6), step


@pytest.mark.tf
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("none", "1"), "model.fit on 2 workers with a model built outside"),
        (("strategy", "2"), "compile(steps_per_execution=2) fails in Keras 3 under"),
    ],
    ids=["no-strategy", "steps-per-execution"],
)
def test_a_fit_that_cannot_be_one_exact_training_stops_before_its_first_step(
    args: tuple[str, str], said: str, runs_root: Path, tmp_path: Path
) -> None:
    proc, run_dir = _submit(tmp_path, "3", "plain", "0", "0", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if said in line]
    assert len(line) < 320, line
    # status says why, not only "failed (exit 2)": the refusal is the start's recorded reason.
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    assert status.startswith("run: failed (") and said in status.splitlines()[0], status
    assert (
        not (run_dir / "metrics.jsonl").exists()
        or "loss" not in (run_dir / "metrics.jsonl").read_text()
    )
    assert not list(run_dir.glob("*.keras"))


@pytest.mark.parametrize(
    ("version", "workers", "refused"),
    [("3.4.1", 2, True), ("3.4.1", 1, False), ("3.5.0", 2, False), ("3.15.1", 8, False)],
)
def test_keras_before_3_5_is_refused_on_several_workers(
    version: str, workers: int, refused: bool
) -> None:
    from hpctf.compute.compat.keras_fit import check_keras_3
    from hpctf.core.errors import UserError

    if refused:
        with pytest.raises(UserError, match=r"Keras 3.4.1 cannot train on 2 workers.*keras>=3.5"):
            check_keras_3(version, workers)
    else:
        check_keras_3(version, workers)


@pytest.mark.parametrize(
    ("step", "continues", "legacy", "initial", "expected"),
    [
        (0, True, False, 0, (0, 0)),
        (20, True, False, 0, (4, 16)),  # Keras 3: 4 batches in the epoch by call, 16 before
        (20, False, False, 0, (4, 0)),  # a new iterator each epoch: only the epoch's 4
        (20, True, True, 0, (0, 20)),  # tf_keras starts at the batch itself
        (20, False, True, 0, (0, 4)),
        (20, True, False, 1, (4, 8)),  # fit(initial_epoch=1): its iterator began at step 8
    ],
)
def test_a_resumed_fit_passes_over_the_batches_trained_before(
    step: int, continues: bool, legacy: bool, initial: int, expected: tuple[int, int]
) -> None:
    from hpctf.compute.compat.fit_input import FitInput
    from hpctf.compute.script.fit import passed_over

    assert passed_over(step, 8, FitInput(continues, initial), legacy) == expected


def test_random_state_variables_are_the_seed_generators_of_keras_3_models() -> None:
    import keras

    from hpctf.compute.compat.keras_variables import random_state_variables

    flip = keras.layers.RandomFlip("horizontal", seed=1)
    flip.build((None, 4, 4, 3))
    dropout = keras.layers.Dropout(0.5, seed=2)
    dropout.build((None, 48))
    dense = keras.layers.Dense(2)
    dense.build((None, 48))
    found = random_state_variables({"flip": flip, "dropout": dropout, "dense": dense, "step": 3})
    assert len(found) == 2
    assert all(v.path.endswith("seed_generator_state") for v in found)
