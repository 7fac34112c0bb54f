"""A Task run ends with its trained model in the run directory; Keras callbacks write relative
paths into the run directory and learn a metric's direction as under ``fit``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DIGITS, ENTRIES_PATH, HPCTF, REPO

pytestmark = pytest.mark.tf


def test_a_task_run_ends_with_its_model_and_callbacks_write_in_the_run(
    runs_root: Path, tmp_path: Path
) -> None:
    caller = tmp_path / "caller"
    caller.mkdir()
    settings = [
        "train.entry=entries:digits_with_best_checkpoint",
        f"train.python_path={json.dumps(ENTRIES_PATH)}",
        *("train.steps=60", "train.eval_every_steps=20", "train.log_every_steps=20"),
        *("checkpoint.every_steps=30", "train.export_savedmodel=true"),
    ]
    proc = subprocess.run(
        [*HPCTF, "submit", str(DIGITS), "--site", "local"]
        + [arg for setting in settings for arg in ("--set", setting)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=caller,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = runs_root.iterdir()
    assert list(caller.iterdir()) == [], "a callback wrote into the caller's directory"
    # ModelCheckpoint("best.keras") on the chief, in the run; the other rank's note elsewhere.
    assert (run_dir / "best.keras").is_file()
    note = json.loads((run_dir / "note-0.json").read_text())
    assert note == {"cwd": str(run_dir), "op": "greater"}, note  # val_accuracy: maximised
    assert not (run_dir / "note-1.json").exists()
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"trained model saved: {run_dir}/model.keras, {run_dir}/saved_model" in log, log
    assert (run_dir / "saved_model" / "saved_model.pb").is_file()
    assert not list(run_dir.glob(".partial-*"))

    # The model loads and evaluates to the run's last evaluation; the last checkpoint loaded
    # into the Task's model (README's way) holds the same weights.
    done = json.loads((run_dir / "DONE").read_text())
    script = f"""
import json, sys
sys.path[:0] = {[str(REPO / "examples" / "digits")]!r}
import keras, numpy as np, tensorflow as tf, digits
model = keras.models.load_model({str(run_dir / "model.keras")!r})
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
task = digits.build()
results = model.evaluate(task.eval_data().batch(64), return_dict=True, verbose=0)
tf.train.Checkpoint(model=task.model).restore({str(run_dir / "checkpoints" / "ckpt-60")!r}
    ).expect_partial()
same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), task.model.get_weights()))
print(json.dumps({{**results, "same": same}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    print(loaded, done["eval"])
    assert loaded["same"] is True
    assert abs(loaded["accuracy"] - done["eval"]["accuracy"]) < 1e-6
    assert abs(loaded["loss"] - done["eval"]["loss"]) < 1e-5
