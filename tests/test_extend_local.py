"""``hpctf resubmit RUN --set train.steps=N`` on a done local run (issue #20 item 3): the next
start resumes at the step the run ended at, reaches N, and trains no step twice."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DIGITS, HPCTF, run_dir_from

pytestmark = pytest.mark.tf

TINY = ["--set", "resources.nodes=1", "--set", "train.log_every_steps=1",
        "--set", "checkpoint.every_steps=10"]  # fmt: skip


def _hpctf(*args: str) -> str:
    proc = subprocess.run([*HPCTF, *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_done_run_extended_resumes_where_it_ended_and_trains_no_step_twice(
    runs_root: Path,
) -> None:
    run_dir = run_dir_from(_hpctf("submit", str(DIGITS), "--site", "local", *TINY,
                                  "--set", "train.steps=30"))  # fmt: skip
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
