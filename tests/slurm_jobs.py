"""Helpers of the tests that run jobs on the real Slurm test cluster (tests/slurm/cluster.sh):
submit, wait for a checkpoint, a log line or a requeue, show the rank logs, report a fault.
Shared by every real-cluster test module (no test module imports another)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from tests.conftest import DIGITS, HPCTF, checkpoint_steps, submitted

# Steps of the runs that are interrupted: long enough to interrupt after a checkpoint, short
# enough to finish soon after the resume.
LONG = 1500


def submit(env: dict[str, str], *args: str) -> tuple[str, Path]:
    proc = subprocess.run(
        [*HPCTF, "submit", *args], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id, run_dir = submitted(proc.stdout)
    assert job_id, proc.stdout
    return job_id, run_dir


def submit_digits(env: dict[str, str], *sets: str, site: str = "local-slurm") -> tuple[str, Path]:
    """Submit examples/digits to ``site``, each ``KEY=VALUE`` of ``sets`` as a ``--set``."""
    return submit(env, str(DIGITS), "--site", site, *(a for s in sets for a in ("--set", s)))


def wait_for_first_checkpoint(run_dir: Path, timeout: float = 300) -> list[int]:
    """The run's checkpoint steps, once there is one (the rank logs if none comes)."""
    deadline = time.monotonic() + timeout
    while not (steps := checkpoint_steps(run_dir)):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    return steps


def logs_of(run_dir: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((run_dir / "logs").iterdir())
    )


def job_state(job_id: str) -> str | None:
    return (slurm.job_info(job_id) or {}).get("JobState")


def save_to_first_step_s(run_dir: Path, saved_by: str = "preempted") -> float:
    """Seconds from the chief's last save before a requeue (``saved_by``: a preemption, or a
    planned ``restart``) to the first step it logged after the resume, from rank 0's log
    (HH:MM:SS stamps)."""
    lines = (run_dir / "logs" / "rank-0.log").read_text().splitlines()
    saved = max(i for i, line in enumerate(lines) if f"{saved_by}: saved step" in line)
    first = next(line for line in lines[saved:] if re.match(r"\d\d:\d\d:\d\d rank 0: step ", line))

    def seconds(line: str) -> int:
        hours, minutes, secs = (int(part) for part in line[:8].split(":"))
        return hours * 3600 + minutes * 60 + secs

    return (seconds(first) - seconds(lines[saved])) % 86400


# Slurm holds a requeued job ~120 s (BeginTime) unless hpctf releases it: a restart sooner than
# this proves the release.
HELD_S = 110


def wait_for_log(path: Path, text: str, run_dir: Path, deadline: float) -> str:
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    return path.read_text()


def report_fault(case: str, run_dir: Path, **measured: object) -> None:
    """With HPCTF_FAULT_REPORT=FILE, append what a fault test saw: each start's end, the steps
    trained twice (0 when every logged step is unique), the seconds from an end to the next
    start, and what else the test ``measured``. For the README's fault matrix; tests assert on
    the same records."""
    target = os.environ.get("HPCTF_FAULT_REPORT")
    if not target:
        return
    events = RunDir(run_dir).events()
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    steps = [r["step"] for r in map(json.loads, lines) if "loss" in r]
    ends = [(e["reason"], e.get("step")) for e in events if e["event"] == journal.ENDED]
    times = [(e["event"], str(e["time"])) for e in events]
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(
            json.dumps(
                {
                    "case": case,
                    "ends": ends,
                    "events": times,
                    "logged_twice": len(steps) - len(set(steps)),
                    "starts": [e.get("step") for e in events if e["event"] == journal.STARTED],
                    **measured,
                }
            )
            + "\n"
        )
