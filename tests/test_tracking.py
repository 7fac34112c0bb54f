"""``tracking: mlflow`` (issue #20 item 2) with the real MLflow client: a file store across two
starts of one run (one tracker run, every step once, parameters once), a tracker that is down
(training's calls return at once, exit within the flush bound), and validate naming a missing
package. The chief's side under TensorFlow is in tests/test_extend_local.py."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient  # hpctf[dev] brings mlflow-skinny

from hpctf.cli import cli
from hpctf.compute.records import tracking
from hpctf.compute.records.tracking import start_tracking
from hpctf.core.run.rundir import RunDir
from hpctf.login.resolving import tracking_check
from tests.conftest import DIGITS, write


def rendered_run(tmp_path: Path, uri: str) -> RunDir:
    """A run directory (render -o: nothing submitted) whose experiment tracks to ``uri``."""
    script = tmp_path / "job.sbatch"
    result = CliRunner().invoke(cli, [
        "render", str(DIGITS), "--site", "local", "-o", str(script),
        "--set", f"tracking.mlflow.tracking_uri={uri}", "--set", "env.TOKEN=secret",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "runs").iterdir()
    return RunDir(path)


def test_one_mlflow_run_across_starts_every_step_once_params_once(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, deprecated
    uri = f"file://{tmp_path / 'mlruns'}"
    run = rendered_run(tmp_path, uri)
    # Start 1: steps 1-6, an evaluation at 5; stopped without DONE (a preemption).
    (first,) = start_tracking(run, run.load_config())
    for step in range(1, 7):
        first.log(step, {"loss": 1.0 / step})
    first.log(5, {"accuracy": 0.5}, "eval")
    first.close()
    # Start 2 resumes from a checkpoint at step 4: steps 5 and 6 come again, left out.
    (second,) = start_tracking(run, run.load_config())
    for step in range(5, 11):
        second.log(step, {"loss": 1.0 / step})
    second.log(5, {"accuracy": 0.6}, "eval")  # logged by start 1 already
    second.log(10, {"accuracy": 0.9}, "eval")
    write(run.done, '{"step": 10}\n')
    second.close()

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("digits")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"
    kept = json.loads((run.path / "tracking" / "mlflow.json").read_text())
    assert found.info.run_id == kept["run_id"] and kept["params_logged"]
    steps = [m.step for m in client.get_metric_history(found.info.run_id, "loss")]
    assert sorted(steps) == list(range(1, 11))
    evals = client.get_metric_history(found.info.run_id, "eval/accuracy")
    assert sorted((m.step, m.value) for m in evals) == [(5, 0.5), (10, 0.9)]
    params = found.data.params
    assert params["train.steps"] == "300" and params["site"] == "local"
    assert not any(key.startswith("env") for key in params)  # env may hold tokens
    assert found.data.tags["hpctf.run_dir"] == str(run.path)


def test_a_tracker_that_is_down_never_holds_training_up(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(tracking, "RETRY_PAUSE_S", 0.01)
    run = rendered_run(tmp_path, "http://127.0.0.1:9")  # the discard port: refused
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        (tracker,) = start_tracking(run, run.load_config())
        for step in range(1, 1001):
            tracker.log(step, {"loss": 0.5})
        logged = time.monotonic() - began
        tracker.close()
    assert logged < 1.0, logged  # 1,000 steps queued, none waited on the server
    assert time.monotonic() - began < tracking.FLUSH_S + 2.0
    warned = [r.getMessage() for r in caplog.records]
    assert any("tracker mlflow failed (training goes on; retrying)" in w for w in warned), warned


def test_validate_names_a_missing_tracker_package(
    runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(tracking_check.PACKAGES, "mlflow", ("hpctf_no_such_module", "pip x"))
    result = CliRunner().invoke(
        cli, ["validate", str(DIGITS), "--set", "tracking.mlflow.experiment=e"]
    )
    assert result.exit_code == 2
    assert "tracking.mlflow: the hpctf_no_such_module package is not installed here: pip x" in (
        result.output
    )
