"""``tracking: mlflow`` (issue #20 item 2) with the real MLflow client: a file store across two
starts of one run (one tracker run, every step once, parameters once), a tracker that is down
(training's calls return at once, exit within the flush bound), and validate naming a missing
package. The chief's side under TensorFlow is in tests/test_extend_local.py."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient  # hpctf[dev] brings mlflow-skinny

from hpctf.cli import cli
from hpctf.compute.records.tracking import start_tracking
from hpctf.compute.records.tracking import tracker as tracking
from hpctf.compute.records.tracking.mlflow_run import is_file_store
from hpctf.core.run.rundir import RunDir
from hpctf.login.resolving import tracking_check
from tests import wandb_records
from tests.conftest import DIGITS, write


def rendered_run(tmp_path: Path, uri: str | None = None, *sets: str) -> RunDir:
    """A run directory (render -o: nothing submitted) whose experiment tracks to MLflow at
    ``uri`` (and ``sets``: ``--set`` values)."""
    script = tmp_path / "job.sbatch"
    tracking = [f"tracking.mlflow.tracking_uri={uri}"] if uri else []
    result = CliRunner().invoke(cli, [
        "render", str(DIGITS), "--site", "local", "-o", str(script), "--set", "env.TOKEN=secret",
        *(arg for value in [*tracking, *sets] for arg in ("--set", value)),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "runs").iterdir()
    return RunDir(path)


def test_one_mlflow_run_across_starts_every_step_once_params_once(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unset: the tracker sets it for a file store, which MLflow >= 3.17 refuses without it.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
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

    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
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


@pytest.mark.parametrize(
    "uri, store",
    [("file:///scratch/mlruns", True), ("/scratch/mlruns", True), ("mlruns", True),
     ("http://mlflow:5000", False), ("sqlite:///mlflow.db", False), ("databricks", False)],
)  # fmt: skip
def test_which_uris_are_mlflow_file_stores(uri: str, store: bool) -> None:
    assert is_file_store(uri) is store


def test_one_wandb_run_across_a_preemption_and_a_resubmit_every_step_once_params_once(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (hpctf[dev] or hpctf[wandb])")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # not in ~
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    run = rendered_run(tmp_path, None, "tracking.wandb.project=hpctf-test")
    # Start 1 (Slurm job 101): steps 1-6, an evaluation at 6; a warned preemption, no DONE.
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    (first,) = start_tracking(run, run.load_config())
    for step in range(1, 7):
        first.log(step, {"loss": 1.0 / step})
    first.log(6, {"accuracy": 0.5}, "eval")
    first.close()
    # Start 2 (job 102, a resubmit) resumes from a checkpoint at step 4: 5 and 6 come again.
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    (second,) = start_tracking(run, run.load_config())
    for step in range(5, 11):
        second.log(step, {"loss": 1.0 / step})
    second.log(6, {"accuracy": 0.6}, "eval")  # logged by start 1 already
    second.log(10, {"accuracy": 0.9}, "eval")
    write(run.done, '{"step": 10}\n')
    second.close()

    starts = wandb_records.offline_starts(run.path)
    kept = json.loads((run.path / "tracking" / "wandb.json").read_text())
    assert [s.run_id for s in starts] == [kept["run_id"]] * 2  # one W&B run, two starts
    assert {s.project for s in starts} == {"hpctf-test"}
    rows = [row for s in starts for row in s.history]
    assert [row["_step"] for row in rows] == list(range(1, 11))  # every step once, in order
    assert [row["loss"] for row in rows] == [1.0 / step for step in range(1, 11)]
    evals = [(row["_step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]
    assert evals == [(6, 0.5), (10, 0.9)]
    params = [u for s in starts for u in s.config_updates if "train.steps" in u]
    assert len(params) == 1 and params[0]["train.steps"] == "300"  # once, at start 1
    assert params[0]["site"] == "local" and not any(k.startswith("env") for k in params[0])
    tags = [next(u for u in s.config_updates if "hpctf.run_dir" in u) for s in starts]
    assert [t["hpctf.slurm_jobs"] for t in tags] == ["101", "102"]
    assert all(t["hpctf.run_dir"] == str(run.path) for t in tags)
    # The end state: start 1 preempted (W&B resumes it), start 2 done.
    assert [(s.preempting, s.exit_code, s.summary["hpctf.end"]) for s in starts] == [
        (True, 1, "stopped"), (False, 0, "done")
    ]  # fmt: skip


def test_a_tracker_that_is_down_never_holds_training_up(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(tracking, "RETRY_PAUSE_S", 0.01)
    run = rendered_run(tmp_path, "http://127.0.0.1:9")  # the discard port: refused
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        # Timed from after the start: importing mlflow alone can take seconds on a loaded
        # machine, and is no step's cost.
        starting = time.monotonic()
        (tracker,) = start_tracking(run, run.load_config())
        started = time.monotonic() - starting
        slowest = 0.0
        for step in range(1, 1001):
            began = time.monotonic()
            tracker.log(step, {"loss": 0.5})
            slowest = max(slowest, time.monotonic() - began)
        closing = time.monotonic()
        tracker.close()
        closed = time.monotonic() - closing
    assert started < 15.0, started  # the import at most: the server is tried in the background
    # 1,000 steps queued, none waited on the server (a refused connect, retried): the
    # slowest call is bounded by the GIL's switch interval (5 ms) while the sender thread
    # runs, not by a network timeout. A total would count every switch on a loaded machine.
    assert slowest < 0.5, slowest
    assert closed < tracking.FLUSH_S + 1.0, closed
    warned = [r.getMessage() for r in caplog.records]
    assert any("tracker mlflow failed (training goes on; retrying)" in w for w in warned), warned


class SlowBackend:
    """A tracker that takes 20 ms a step: behind a chief that logs every step."""

    name = "slow"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.ended: list[bool] = []

    def start(self, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> str:
        return "r1"

    def log_params(self, params: Mapping[str, str]) -> None:
        pass

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        time.sleep(0.02)
        self.steps.append(step)

    def finish(self, done: bool) -> None:
        self.ended.append(done)


def test_a_backlog_at_exit_is_left_out_and_the_end_state_still_sent(
    runs_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the end state, W&B's own exit hook would end a preempted start as finished."""
    run = rendered_run(tmp_path)
    backend = SlowBackend()
    tracker = tracking.Tracker(run, backend, run.load_config())
    for step in range(1, 501):  # 10 s of calls queued
        tracker.log(step, {"loss": 0.5})
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hpctf.worker"):
        tracker.close()
    assert time.monotonic() - began < tracking.FLUSH_S + 0.1
    assert backend.ended == [False]  # no DONE: stopped, to be resumed
    assert 0 < len(backend.steps) < 500 and backend.steps == sorted(set(backend.steps))
    kept = json.loads((run.path / "tracking" / "slow.json").read_text())
    assert kept["last_step"]["train"] == backend.steps[-1]  # the next start goes on from there
    (said,) = [r.getMessage() for r in caplog.records]
    assert "not sent within 1.5 s at exit; steps left out" in said, said


@pytest.mark.parametrize("tracker, key", [("mlflow", "experiment"), ("wandb", "project")])
def test_validate_names_a_missing_tracker_package(
    runs_root: Path, monkeypatch: pytest.MonkeyPatch, tracker: str, key: str
) -> None:
    monkeypatch.setitem(tracking_check.PACKAGES, tracker, ("hpctf_no_such_module", "pip x"))
    result = CliRunner().invoke(
        cli, ["validate", str(DIGITS), "--set", f"tracking.{tracker}.{key}=e"]
    )
    assert result.exit_code == 2
    assert f"tracking.{tracker}: the hpctf_no_such_module package is not installed here: pip x" in (
        result.output
    )
    assert len(result.output.strip().splitlines()) == 1, result.output
