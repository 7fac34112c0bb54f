"""``hpctf resubmit RUN --set train.steps=N`` on a done local run (issue #20 item 3): the next
start resumes at the step the run ended at, reaches N, and trains no step twice. The run
tracks to an MLflow file store (item 2): one MLflow run across both starts, each step once."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DIGITS, HPCTF, run_dir_from

pytestmark = pytest.mark.tf

TINY = ["--set", "resources.nodes=1", "--set", "train.log_every_steps=1",
        "--set", "checkpoint.every_steps=10"]  # fmt: skip


def _hpctf(*args: str) -> str:
    # Without MLFLOW_ALLOW_FILE_STORE: the chief sets it for a file:// store (MLflow >= 3.17).
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    proc = subprocess.run(
        [*HPCTF, *args], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_done_run_extended_resumes_where_it_ended_and_trains_no_step_twice(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"file://{tmp_path / 'mlruns'}"
    run_dir = run_dir_from(_hpctf("submit", str(DIGITS), "--site", "local", *TINY,
                                  "--set", "train.steps=30",
                                  "--set", f"tracking.mlflow.tracking_uri={uri}"))  # fmt: skip
    assert json.loads((run_dir / "DONE").read_text())["step"] == 30

    out = _hpctf("resubmit", str(run_dir), "--set", "train.steps=60")
    assert "extended: train.steps=60; resuming from step 30" in out
    assert json.loads((run_dir / "DONE").read_text())["step"] == 60
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r["step"] for r in map(json.loads, lines) if "loss" in r]
    assert steps == list(range(1, 61)), "a step trained twice or never"
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-30 at step 30" in log
    status = _hpctf("status", str(run_dir))
    assert "run: done" in status and "train.steps 30 -> 60" in status, status

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (tracked,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert tracked.info.status == "FINISHED"
    history = client.get_metric_history(tracked.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 61))
    assert tracked.data.params["train.steps"] == "30"  # logged once, at the first start
