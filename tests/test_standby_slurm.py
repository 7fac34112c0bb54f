"""The warm standby on the real Slurm test cluster (hpctf.compute.start.standby): a SIGKILLed
rank's restart inside the allocation is taken over by the standbys that imported TensorFlow
beforehand, and a killed task (the thin stand-in srun started) leaves no worker behind. One run
serves every assertion: two crashes, three starts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpctf.core.run.metrics_history import metric_records
from hpctf.core.run.rundir import RunDir
from tests.conftest import checkpoint_steps, paced
from tests.slurm_jobs import logs_of, submit_digits, wait_for_log

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

FIRST_STEP = re.compile(r"rank (\d): first step (\d+) after ([0-9.]+) s \([^)]*\): (.*)$", re.M)
READY = re.compile(r"standby (\d+) ready")
HOST_PID = re.compile(r"rank \d: host \S+ pid (\d+) ")


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _until(check, what: str, run_dir: Path, deadline: float, poll: float = 0.1):  # type: ignore[no-untyped-def]
    while not (got := check()):
        assert time.monotonic() < deadline, f"no {what}:\n{logs_of(run_dir)}"
        time.sleep(poll)
    return got


def _thin_tasks(run_dir: Path) -> dict[int, int]:
    """The pids of ``hpctf worker RUN_DIR`` processes (srun's tasks; a standby that took over
    runs as ``hpctf standby``) by their SLURM_PROCID."""
    found = {}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if proc.name.isdigit() and b"worker" in argv and os.fsencode(run_dir) in argv:
                environ = (proc / "environ").read_bytes().split(b"\0")
                rank = next(v for v in environ if v.startswith(b"SLURM_PROCID="))
                found[int(rank.split(b"=")[1])] = int(proc.name)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_standby_takes_a_killed_ranks_place_and_dies_with_its_task(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit_digits(
        env,
        *paced(0.03),  # it trains until the kills
        "train.steps=1000000",
        "train.log_every_steps=1",
        "checkpoint.every_seconds=2",
        "checkpoint.every_steps=null",
        "checkpoint.keep=50",
    )
    logs = run_dir / "logs"
    rank0, rank1 = logs / "rank-0.log", logs / "rank-1.log"
    deadline = time.monotonic() + 240
    try:
        wait_for_log(rank1, " pid ", run_dir, deadline)
        # Each slot's standby imports once its worker has trained a step: wait for both.
        ready = _until(
            lambda: (
                all(READY.search(_text(logs / f"standby-{r}.log")) for r in (0, 1))
                and checkpoint_steps(run_dir)
            ),
            "standby ready and a checkpoint",
            run_dir,
            deadline,
        )
        assert ready
        standby1 = int(READY.findall(_text(logs / "standby-1.log"))[-1])
        first_pid = int(HOST_PID.findall(_text(rank1))[-1])
        assert first_pid != standby1
        os.kill(first_pid, signal.SIGKILL)  # the "nodes" share this machine's process table
        _until(
            lambda: len(FIRST_STEP.findall(_text(rank1))) >= 2, "second start", run_dir, deadline
        )
        # The second start of rank 1 is the standby, TensorFlow imported before the crash.
        assert int(HOST_PID.findall(_text(rank1))[-1]) == standby1, _text(rank1)[-3000:]
        second = FIRST_STEP.findall(_text(rank1))[-1]
        phases = dict(p.rsplit(" ", 2)[:2] for p in second[3].split(", "))
        assert "standby takeover" in phases, second
        assert float(phases["tensorflow import"]) < 1.5, second  # the context's start only

        # A save of this start first: a crash without progress would end the run (no restart).
        resumed = int(re.findall(r"resumed from \S+ at step (\d+)", _text(rank0))[-1])
        _until(lambda: checkpoint_steps(run_dir)[-1] > resumed, "a save", run_dir, deadline)
        # SIGKILL the thin task srun started for rank 1: its worker (the standby) goes too.
        _until(lambda: len(_thin_tasks(run_dir)) == 2, "two thin tasks", run_dir, deadline)
        os.kill(_thin_tasks(run_dir)[1], signal.SIGKILL)  # rank 1's, relaying to standby1
        gone_by = time.monotonic() + 5
        while _alive(standby1) and time.monotonic() < gone_by:
            time.sleep(0.05)
        assert not _alive(standby1), "the worker outlived its killed task"
        # The third start: the standbys consumed, not yet replaced, so it imports TensorFlow
        # itself (the fallback), or takes a replacement that was ready; either way it trains.
        _until(lambda: len(FIRST_STEP.findall(_text(rank0))) >= 3, "third start", run_dir, deadline)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, check=False)
    events = RunDir(run_dir).events()
    assert [e["event"] for e in events].count("started") == 3, logs_of(run_dir)
    assert [e.get("in_place") for e in events if e["event"] == "requeued"] == [True, True]
    steps = [r["step"] for r in metric_records(run_dir / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "a step twice or missing"
    # The standbys' step ends with the job; no standby process of this run is left.
    time.sleep(2)
    left = subprocess.run(
        ["pgrep", "-f", f"hpctf standby {run_dir}"], capture_output=True, text=True, check=False
    )
    assert not left.stdout.strip(), left.stdout
