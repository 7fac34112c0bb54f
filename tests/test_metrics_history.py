"""Each step once in a run's history, whatever the stop: metrics.jsonl's records past the
step a start resumed from are superseded (hpctf.core.run.metrics_history)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

import hpctf
from hpctf.core.run.metrics_history import by_step, effective_history, metric_records
from tests.conftest import DIGITS, HPCTF, checkpoint_steps, run_dir_from


def test_records_past_a_resumed_step_are_superseded_and_markers_left_out() -> None:
    raw = [
        {"resumed_from": 0, "time": 1.0},
        *({"step": s, "loss": 1.0} for s in (10, 20, 30)),
        {"step": 20, "eval": {"accuracy": 0.5}},
        {"resumed_from": 20, "time": 2.0},
        {"step": 30, "loss": 0.5},
        {"resumed_from": 0, "time": 3.0},  # a start from scratch: nothing earlier stays
        {"step": 10, "loss": 0.9},
    ]
    assert effective_history(raw) == [{"step": 10, "loss": 0.9}]
    assert effective_history(raw[:7]) == [
        {"step": 10, "loss": 1.0},
        {"step": 20, "loss": 1.0},
        {"step": 20, "eval": {"accuracy": 0.5}},
        {"step": 30, "loss": 0.5},
    ]
    assert by_step(effective_history(raw[:7])) == [
        {"step": 10, "loss": 1.0},
        {"step": 20, "loss": 1.0, "eval": {"accuracy": 0.5}},
        {"step": 30, "loss": 0.5},
    ]


def test_a_tail_read_after_the_marker_keeps_what_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": s, "loss": 1.0} for s in range(1, 200)] + [{"resumed_from": 150}]
    lines += [{"step": s, "loss": 0.5} for s in range(151, 400)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    steps = [r["step"] for r in metric_records(path)]
    assert steps == list(range(1, 400))
    tail = [r["step"] for r in metric_records(path, tail_bytes=2000)]
    assert tail == list(range(400 - len(tail), 400)) and len(tail) > 20


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.tf
def test_after_killed_workers_and_a_resubmit_each_step_is_logged_once(
    runs_root: Path, tmp_path: Path
) -> None:
    sets = ["train.steps=150", "train.log_every_steps=1", "checkpoint.every_steps=20"]
    sets += ["train.preemption_check_every_steps=100000", "train.eval_every_steps=20"]
    settings = [a for s in sets for a in ("--set", s)]
    launcher = subprocess.Popen(
        [*HPCTF, "submit", str(DIGITS), "--site", "local", *settings],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    assert launcher.stdout is not None
    run_dir = run_dir_from(launcher.stdout.readline())
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    # Killed at once, with steps logged past the last checkpoint (40): they never were saved.
    while not (metrics.exists() and '"step": 47,' in metrics.read_text()):
        assert time.monotonic() < deadline and launcher.poll() is None, "no training"
        time.sleep(0.05)
    pids = [int(p) for p in (run_dir / "logs").glob("rank-*.log") for p in [_pid(p)]]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    launcher.communicate(timeout=60)
    while any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    killed_at = max(r["step"] for r in logged if "step" in r)
    saved = checkpoint_steps(run_dir)[-1]
    assert saved < killed_at, (saved, killed_at)

    proc = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    raw = [json.loads(line) for line in metrics.read_text().splitlines()]
    raw_counts = Counter(r["step"] for r in raw if "loss" in r)
    assert any(raw_counts[s] == 2 for s in range(saved + 1, killed_at + 1))  # logged twice
    rows = hpctf.run(run_dir).metrics(frame=False)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 151)), "twice or never"
    assert [r["step"] for r in rows if "eval" in r] == [*range(20, 150, 20), 150]
    status = subprocess.run(
        [*HPCTF, "status", "--json", str(run_dir)], capture_output=True, text=True, check=True
    )
    (shown,) = json.loads(status.stdout)["runs"]
    rows_loss = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    assert shown["step"] == 150 and shown["loss"] == rows_loss[-1][1]
    losses = dict(rows_loss)
    assert [step for step, _ in shown["losses"]] == sorted({step for step, _ in shown["losses"]})
    assert all(losses[step] == loss for step, loss in shown["losses"]), rows_loss[:3]


def _pid(log: Path) -> str:
    found = re.search(r"rank \d+: host \S+ pid (\d+)", log.read_text())
    assert found, log
    return found.group(1)
