"""The tutorial's ``model.fit`` script (examples/keras_fit) under hpctf on the real Slurm test
cluster: 2 nodes, ``scontrol requeue`` mid-fit, back by itself at the saved step."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from tests.conftest import HPCTF, REPO, checkpoint_steps, wait_for_job
from tests.slurm_jobs import logs_of, submit

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

KERAS_FIT = REPO / "examples" / "keras_fit" / "experiment.yaml"
EPOCHS = 20  # x 20 steps: long enough to requeue after a checkpoint, short enough to finish soon


def test_keras_fit_runs_on_two_nodes_and_comes_back_from_a_requeue(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env, str(KERAS_FIT), "--site", "local-slurm", "--set", f"train.script_args=['{EPOCHS}']"
    )
    deadline = time.monotonic() + 300
    while not checkpoint_steps(run_dir):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True)
    assert wait_for_job(job_id)["JobState"] == "COMPLETED", logs_of(run_dir)

    total = EPOCHS * 20
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank-*.log")))
    assert logs.count("Number of replicas: 2") == 4, logs  # 2 ranks, 2 starts
    # One model: the chief's; the other rank saved into a directory it removed.
    assert [p.name for p in run_dir.rglob("model.keras")] == ["model.keras"]
    assert (run_dir / "model.keras").is_file()
    assert json.loads((run_dir / "DONE").read_text())["step"] == total
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [record["step"] for record in map(json.loads, lines) if "step" in record]
    assert len(steps) == len(set(steps)) and steps[-1] == total, steps  # no step logged twice
    events = RunDir(run_dir).events()
    (preempted,) = [e for e in events if e["event"] == journal.SAVED_ON_WARNING]
    ends = [e["reason"] for e in events if e["event"] == "ended"]
    assert ends == ["preempted", "done"], events
    (resumed,) = [e for e in events if e["event"] == "started"][1:]
    assert resumed["step"] == preempted["step"]
    assert f"resumed from {run_dir}/checkpoints/ckpt-{preempted['step']}" in logs
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert status.startswith("run: done; requeues after preemption 1/20, after failures 0/3")
    assert f"progress: step {total}/{total}" in status, status
