"""`--site local`: real TensorFlow worker processes under MultiWorkerMirroredStrategy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DIGITS

pytestmark = pytest.mark.tf
HPCTF = [sys.executable, "-m", "hpctf"]


def only_run_dir(root: Path) -> Path:
    (run_dir,) = root.iterdir()
    return run_dir


def test_digits_on_two_local_workers(runs_root: Path, tmp_path: Path) -> None:
    node_tmp = tmp_path / "node-tmp"  # where non-chief workers put their throwaway saves
    node_tmp.mkdir()
    proc = subprocess.run(
        [*HPCTF, "submit", str(DIGITS), "--site", "local"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(node_tmp)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(runs_root)
    assert f"run directory: {run_dir}" in proc.stdout
    done = json.loads((run_dir / "DONE").read_text())
    assert done["step"] == 300
    assert done["eval"]["accuracy"] >= 0.90
    # Chief-only checkpoints; every rank logged as its own SLURM_PROCID.
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["checkpoint"] + [
        f"ckpt-{s}.{x}" for s in (100, 200, 300) for x in ("data-00000-of-00001", "index")
    ]
    for rank in (0, 1):
        assert (
            f"SLURM_PROCID {rank}: worker {rank} of 2"
            in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        )
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [50, 100, 150, 200, 250, 300]
    assert list(node_tmp.iterdir()) == []  # no worker throwaway checkpoints left
    # Progress lines and TensorBoard events, from the chief only.
    assert re.search(
        r"rank 0: step 300/300 loss \d+\.\d{4} [\d.]+ steps/s \d+ examples/s eta 0m00s",
        (run_dir / "logs" / "rank-0.log").read_text(),
    )
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_interrupted_run_resumes_from_latest_checkpoint(runs_root: Path, tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [
            *HPCTF,
            "submit",
            str(DIGITS),
            "--site",
            "local",
            "--set",
            "train.steps=3000",
            "--set",
            "checkpoint.every_steps=50",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ckpts = list(runs_root.glob("*/checkpoints/ckpt-*.index"))
            if ckpts:
                break
            time.sleep(0.2)
        assert ckpts, "no checkpoint within 120 s"
        launcher.send_signal(signal.SIGTERM)  # the launcher kills its workers, like srun
        assert launcher.wait(timeout=60) != 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
    run_dir = only_run_dir(runs_root)
    assert not (run_dir / "DONE").exists()
    saved = max(
        int(p.name.split("-")[1].split(".")[0])
        for p in (run_dir / "checkpoints").glob("ckpt-*.index")
    )
    assert 0 < saved < 3000

    proc = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir)], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in log
    assert json.loads((run_dir / "DONE").read_text())["step"] == 3000
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    resumed = steps[steps.index(max(s for s in steps if s <= saved)) + 1 :]
    assert resumed and resumed[0] > saved  # no step below the checkpoint is trained twice
