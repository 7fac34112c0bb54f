"""hpctf sweep on the real 2-node test cluster: one job array, throttled, one task preempted
and requeued alone, one point cancelled and resumed by ``hpctf resubmit SWEEP``, every point
done. One sweep serves every assertion (a few minutes of TensorFlow on 2 cores otherwise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from tests.conftest import DIGITS, HPCTF, checkpoint_steps
from tests.slurm_jobs import logs_of

pytestmark = [pytest.mark.slurm, pytest.mark.tf]
STEPS = 2000


class Sampler:
    """The RUNNING tasks of one job array, counted at every call (squeue --array)."""

    def __init__(self, array_id: str, env: dict[str, str]) -> None:
        self.array_id, self.env, self.counts = array_id, env, []  # type: list[int]

    def __call__(self) -> None:
        out = subprocess.run(
            ["squeue", f"--jobs={self.array_id}", "--array", "--noheader", "--format=%T"],
            env=self.env, capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        self.counts.append(out.split().count("RUNNING"))


def hpctf(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def until(condition: object, sample: Sampler, deadline: float, what: str) -> None:
    while not condition():  # type: ignore[operator]
        sample()
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def accounted_starts(env: dict[str, str], job: str) -> int:
    """The ended starts of ``job`` that Slurm's accounting holds (sacct -D: each start)."""
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", f"-j{job}", "--format=JobID,State"],
        env=env, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    ended = [f for f in (line.split("|") for line in out.splitlines()) if len(f) == 2]
    return sum(1 for f in ended if f[0] == job and f[1] not in ("RUNNING", "PENDING"))


def events(run_dir: Path) -> list[str]:
    return [e["event"] for e in RunDir(run_dir).events()]


def finished(run_dir: Path) -> bool:
    """DONE written and the job's end recorded after it (job-end runs after the chief)."""
    seen = events(run_dir)
    return (run_dir / "DONE").exists() and seen[-1] == "ended" and "started" in seen


def restarts(handle: str) -> int:
    return int((slurm.job_info(handle) or {}).get("Restarts", "-1"))


@pytest.mark.both_slurms
def test_a_sweep_is_one_throttled_array_whose_tasks_requeue_alone(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    began = time.monotonic()
    out = hpctf(
        env, "sweep", str(DIGITS), "--site", "local-slurm", "--grid", "train.seed=0,1,2",
        "--set", "resources.nodes=1", "--set", f"train.steps={STEPS}",
        "--set", "checkpoint.every_steps=100", "--max-running", "2",
    )  # fmt: skip
    (array,) = re.findall(r"^submitted job array (\d+): 3 point\(s\) 0-2$", out, re.M)
    sweep = Path(re.search(r"^sweep directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    runs = [Path(p["run_dir"]) for p in json.loads((sweep / "sweep.json").read_text())["points"]]
    # One array job: every task's ArrayJobId is the id sbatch printed.
    for task in range(3):
        assert (slurm.job_info(f"{array}_{task}") or {}).get("ArrayJobId") == array
    sample = Sampler(array, env)
    deadline = time.monotonic() + 400

    # Preempt point 0 alone: the walltime warning to its task (as Slurm's --signal would);
    # its ranks save, exit 75, and job-end requeues <array>_0, not the array.
    rank0 = runs[0] / "logs" / "rank-0.log"
    until(lambda: rank0.exists() and "step 100/" in rank0.read_text(), sample, deadline,
          logs_of(runs[0]))  # fmt: skip
    subprocess.run(["scancel", "--signal=USR2", f"{array}_0"], env=env, check=True)
    until(lambda: "requeued" in events(runs[0]), sample, deadline, logs_of(runs[0]))
    assert restarts(f"{array}_0") == 1
    assert restarts(f"{array}_1") == 0  # its neighbour trains on
    assert "started" in events(runs[1]) and "requeued" not in events(runs[1])

    # Point 2 takes the free slot; cancel it alone after its first checkpoint, and resubmit
    # the sweep: a new array over the points that did not finish and are not in Slurm.
    until(lambda: bool(checkpoint_steps(runs[2])), sample, deadline, logs_of(runs[2]))
    # Suspended first (one scontrol, milliseconds): a loaded machine may take seconds to start
    # `hpctf cancel`, in which the point's remaining steps could all run (seen in CI: point 2
    # DONE before its cancel landed, so there was nothing to resubmit).
    subprocess.run(["scontrol", "suspend", f"{array}_2"], env=env, check=True)
    hpctf(env, "cancel", str(runs[2]))
    until(lambda: "cancelled" in events(runs[2]) and (slurm.job_info(f"{array}_2") or {})
          .get("JobState") == "CANCELLED", sample, deadline, "point 2 not cancelled")  # fmt: skip
    out = hpctf(env, "resubmit", str(sweep))
    second = re.findall(r"^submitted job array (\d+): 1 point\(s\) 2$", out, re.M)
    assert len(second) == 1, out
    assert json.loads((sweep / "sweep.json").read_text())["arrays"][-1]["indices"] == [2]

    until(lambda: all(finished(r) for r in runs), sample, deadline,
          "\n".join(logs_of(r) for r in runs))  # fmt: skip
    took = time.monotonic() - began
    # Never more than 2 tasks of the array at once, and 2 at once at some point.
    assert max(sample.counts) == 2, sample.counts
    for run in runs:
        assert json.loads((run / "DONE").read_text())["step"] == STEPS
    log0 = rank0.read_text()
    saved = int(log0.split("preempted: saved step ")[1].split(";")[0])
    assert f"resumed from {runs[0]}/checkpoints/ckpt-{saved} at step {saved}" in log0
    assert "resumed from" not in (runs[1] / "logs" / "rank-0.log").read_text()
    assert re.search(r"resumed from \S+/ckpt-\d+ at step [1-9]\d*",
                     (runs[2] / "logs" / "rank-0.log").read_text())  # fmt: skip
    starts = RunDir(runs[2]).events()
    assert [e["job_id"] for e in starts if e["event"] == "started"] == [
        f"{array}_2",
        f"{second[0]}_0",
    ]
    # The task's own SLURM_JOB_ID is kept beside the <array>_<task> it is known by.
    assert all(e.get("slurm_job_id", "").isdigit() for e in starts if e["event"] == "started")

    # slurmdbd records a start a moment after slurmctld ends it: before comparing hours with
    # sacct, wait until it holds every start ended (measured: once 1 of the requeued point's 2;
    # once the resubmitted point's still running, 1 s short of its end).
    if os.environ.get("HPCTF_SLURM_ACCOUNTING", "0") == "1":
        expected = {f"{array}_0": 2, f"{array}_1": 1, f"{array}_2": 1, f"{second[0]}_0": 1}
        until(lambda: all(accounted_starts(env, job) >= n for job, n in expected.items()),
              sample, deadline, f"sacct never showed every start ended: {expected}")  # fmt: skip
    document = json.loads(hpctf(env, "status", str(sweep), "--json"))
    assert [(p["index"], p["state"], p["step"]) for p in document["points"]] == [
        (i, "done", STEPS) for i in range(3)
    ]
    assert all(p["eval"].get("accuracy", 0) > 0.5 for p in document["points"])
    assert_hours_are_saccts(env, document, runs, [array, *second])
    print(f"sweep test: {took:.0f} s to all DONE; {len(sample.counts)} squeue samples, "
          f"at most {max(sample.counts)} RUNNING")  # fmt: skip


def assert_hours_are_saccts(
    env: dict[str, str], document: dict[str, Any], runs: list[Path], arrays: list[str]
) -> None:
    """Each point's node-hours, and the sweep's, are what sacct says every start of its jobs
    held (the requeued point: two starts; the resubmitted one: a job in each array), summed
    here from sacct's own text."""
    if os.environ.get("HPCTF_SLURM_ACCOUNTING", "0") != "1":
        assert document["hours"] == "unaccounted"
        return
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", f"-j{','.join(arrays)}",
         "--format=JobID,ElapsedRaw,NNodes"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = [line.split("|") for line in out.splitlines()]
    for run, point in zip(runs, document["points"], strict=True):
        jobs = {str(e["job_id"]) for e in RunDir(run).events() if e.get("job_id")}
        held = sum(int(f[1]) * int(f[2]) for f in lines if f[0] in jobs) / 3600
        assert held > 0 and point["hours"]["node_hours"] == pytest.approx(held, abs=1e-6), out
    total = sum(int(f[1]) * int(f[2]) for f in lines) / 3600
    assert document["hours"]["node_hours"] == pytest.approx(total, abs=1e-6), out
    assert document["points"][0]["hours"]["starts"] == 2  # preempted, requeued, done
    print(f"sweep hours: {document['hours']}; sacct's sum {total:.6f} node-h")
