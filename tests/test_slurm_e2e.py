"""End to end on a real Slurm cluster (tests/slurm/cluster.sh: 2 emulated nodes, slurm-wlm).

These tests are the proof for the walking skeleton: real sbatch, real srun on node1 and node2,
real TensorFlow workers under MultiWorkerMirroredStrategy, real files in the run directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctf import slurm
from tests.conftest import DIGITS, REPO

pytestmark = [pytest.mark.slurm, pytest.mark.tf]
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
HPCTF = [sys.executable, "-m", "hpctf"]
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Start the test cluster once; failing to start is fatal where Slurm is required."""
    # Not under pytest's tmp dir: munged runs as the munge user and cannot enter root's 0700 dirs.
    state = Path(os.environ.get("HPCTF_SLURM_DIR", "/tmp/hpctf-slurm"))
    env = {**os.environ, "HPCTF_SLURM_DIR": str(state)}
    proc = subprocess.run(
        [str(CLUSTER), "start"], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        message = f"test Slurm cluster did not start:\n{proc.stdout}\n{proc.stderr}"
        if os.environ.get("HPCTF_REQUIRE_SLURM") or os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    conf = str(state / "etc" / "slurm.conf")
    os.environ["SLURM_CONF"] = conf
    try:
        yield {**env, "SLURM_CONF": conf}
    finally:
        subprocess.run([str(CLUSTER), "stop"], env=env, check=False)
        os.environ.pop("SLURM_CONF", None)


def wait_for_job(job_id: str, timeout: float = 300) -> dict[str, str]:
    """Poll `scontrol show job -o` (sbatch --wait polls too slowly) until a final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = slurm.job_info(job_id)
        if info and info.get("JobState") in FINAL_STATES:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not finished after {timeout} s: {slurm.job_info(job_id)}")


def submit(env: dict[str, str], *args: str) -> tuple[str, Path]:
    proc = subprocess.run(
        [*HPCTF, "submit", *args], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"submitted job (\d+)", proc.stdout)
    run_dir = re.search(r"run directory: (\S+)", proc.stdout)
    assert job_id and run_dir, proc.stdout
    return job_id.group(1), Path(run_dir.group(1))


def logs_of(run_dir: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((run_dir / "logs").iterdir())
    )


def test_digits_trains_on_two_slurm_nodes(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs"), "TMPDIR": str(node_tmp)}
    job_id, run_dir = submit(env, str(DIGITS), "--site", "local-slurm")
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    assert info["NodeList"] == "node[1-2]"

    # srun ran the worker on node1 and node2 as SLURM_PROCID 0 and 1.
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    rank1 = (run_dir / "logs" / "rank-1.log").read_text()
    assert "host node1 (SLURMD_NODENAME node1) SLURM_PROCID 0: worker 0 of 2" in rank0
    assert "host node2 (SLURMD_NODENAME node2) SLURM_PROCID 1: worker 1 of 2" in rank1

    done = json.loads((run_dir / "DONE").read_text())
    assert done["step"] == 300
    assert done["eval"]["accuracy"] >= 0.90
    # Checkpoints from the chief only; the other worker's throwaway saves are gone.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint"] + [
        f"ckpt-{s}.{x}" for s in (100, 200, 300) for x in ("data-00000-of-00001", "index")
    ]
    assert list(node_tmp.iterdir()) == []
    events = [e["event"] for e in _events(run_dir)]
    assert events == ["created", "submitted", "started", "ended"]

    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert f"job {job_id}: ENDED exit 0 starts 1 nodes node[1-2]" in status.stdout


def test_script_from_render_o_trains_when_sbatched_by_hand(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    script = tmp_path / "job.sbatch"
    subprocess.run(
        [*HPCTF, "render", str(DIGITS), "--site", "local-slurm", "-o", str(script)],
        env=env,
        check=True,
        capture_output=True,
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    # By hand: plain sbatch from another directory, no hpctf involved in the submission.
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = proc.stdout.strip()
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    assert json.loads((run_dir / "DONE").read_text())["step"] == 300
    started = [e for e in _events(run_dir) if e["event"] == "started"]
    assert [e["job_id"] for e in started] == [job_id]  # the job recorded itself


def test_second_job_resumes_from_latest_checkpoint(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env,
        str(DIGITS),
        "--site",
        "local-slurm",
        "--set",
        "train.steps=3000",
        "--set",
        "checkpoint.every_steps=50",
    )
    deadline = time.monotonic() + 180
    while not list((run_dir / "checkpoints").glob("ckpt-*.index")):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    subprocess.run([*HPCTF, "cancel", str(run_dir)], env=env, check=True, capture_output=True)
    assert wait_for_job(job_id)["JobState"] == "CANCELLED"
    assert not (run_dir / "DONE").exists()
    saved = max(
        int(p.name.split("-")[1].split(".")[0])
        for p in (run_dir / "checkpoints").glob("ckpt-*.index")
    )
    assert 0 < saved < 3000

    proc = subprocess.run(
        [*HPCTF, "resubmit", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    second = re.search(r"submitted job (\d+)", proc.stdout)
    assert second and second.group(1) != job_id
    info = wait_for_job(second.group(1))
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in rank0
    assert json.loads((run_dir / "DONE").read_text())["step"] == 3000


def _events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "journal").iterdir())]
