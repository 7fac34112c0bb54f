"""Every Slurm command hpctf runs (hpctf/core/scheduler: the one wrapper), each once against a
real cluster, on every Slurm the tests have (both_slurms: 22.05 and 24.11): the options it
passes are accepted and the output it parses has the shape it expects. A plain batch job that
sleeps stands in for a run: no TensorFlow, seconds per command.

The end-to-end tests marked both_slurms run the same commands inside whole runs; this one
also covers those only a rare path reaches (``sbatch --test-only``, ``sinfo``'s node states,
``scontrol update ExcNodeList``, ``squeue --me`` by comment, ``scontrol show config``).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from hpctf.core.run.hours import parse_usage
from hpctf.core.scheduler import slurm, slurm_queries

pytestmark = pytest.mark.slurm

T = TypeVar("T")


def eventually(what: Callable[[], T], ok: Callable[[T], bool], timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while not ok(value := what()):
        assert time.monotonic() < deadline, f"still {value!r} after {timeout} s"
        time.sleep(0.3)
    return value


def state(job_id: str) -> str:
    return (slurm.job_info(job_id) or {}).get("JobState", "")


@pytest.mark.both_slurms
def test_every_slurm_command_hpctf_runs(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    env = dict(os.environ)  # what the fixture pointed this process at (SLURM_CONF, PATH)
    comment = f"hpctf-commands-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "job.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=1 --ntasks-per-node=1 --time=5\n"
        f"#SBATCH --comment={comment} --requeue --output={tmp_path}/slurm-%j.out\n"
        "echo start $SLURM_RESTART_COUNT on $SLURM_JOB_NODELIST\n"
        "sleep 120\n"
    )

    # sbatch --test-only: accepted, and refused with Slurm's reason.
    slurm.test_only(script.read_text(), env)
    with pytest.raises(slurm.SlurmFailure):
        slurm.test_only(script.read_text().replace("--nodes=1", "--nodes=3"), env)

    # sbatch --parsable; scontrol show job -o; squeue (by id, and --me by comment).
    job_id, dropped = slurm.sbatch(script, {**env, "SBATCH_TIMELIMIT": "1"})
    assert job_id.isdigit() and dropped == ["SBATCH_TIMELIMIT"]
    try:
        eventually(lambda: state(job_id), lambda s: s == "RUNNING")
        info = slurm.job_info(job_id)
        assert info and info["NodeList"] in ("node1", "node2") and info["TimeLimit"] == "00:05:00"
        first, other = ("node1", "node2") if info["NodeList"] == "node1" else ("node2", "node1")
        left = slurm.seconds_left(info)
        assert left is not None and 200 < left <= 300, info["EndTime"]
        (record,) = slurm_queries.squeue_jobs([job_id]).values()
        assert (record.job_id, record.state, record.nodes) == (job_id, "RUNNING", first)
        assert slurm_queries.commented_jobs(comment) == [job_id]

        # scontrol show config; sinfo's node states.
        assert slurm.kill_wait() == 5  # tests/slurm/cluster.sh's KillWait
        assert slurm_queries.max_array_size() > 1
        assert slurm.unusable_nodes("node[1-2]") == []

        # scontrol requeue; update ExcNodeList and StartTime (the release) of the pending job.
        time.sleep(2)  # a first start that lasts: its seconds in sacct below
        slurm.requeue(job_id)
        # Once the requeue has completed, Slurm's hold (its BeginTime), which the release ends.
        eventually(lambda: slurm.job_info(job_id) or {}, lambda i: i.get("Reason") == "BeginTime")
        slurm.exclude_nodes(job_id, [first])
        info = slurm.job_info(job_id)
        assert info and info["JobState"] == "PENDING" and info["ExcNodeList"] == first, info
        slurm.release_requeued(job_id, after_s=1)
        # It comes back well before Slurm's own ~120 s hold, on the other node.
        eventually(lambda: state(job_id), lambda s: s == "RUNNING", timeout=60)
        info = slurm.job_info(job_id)
        assert info and info["Restarts"] == "1" and info["NodeList"] == other, info
    finally:
        # scancel
        slurm.cancel([job_id])
    eventually(lambda: state(job_id), lambda s: s == "CANCELLED")

    # sacct: the job, each of its starts, and what they held (node-hours).
    if slurm_cluster.get("HPCTF_SLURM_ACCOUNTING") != "1":
        assert slurm_queries.sacct_jobs([job_id]) == {}
        assert slurm_queries.sacct_usage([job_id]) is None
        return
    records = eventually(
        lambda: slurm_queries.sacct_runs(job_id),
        lambda runs: [r.state for r in runs] == ["REQUEUED", "CANCELLED"],
        timeout=30,
    )
    assert [r.nodes for r in records] == [first, other]
    assert slurm_queries.sacct_jobs([job_id])[job_id].state == "CANCELLED"
    usage = parse_usage(slurm_queries.sacct_usage([job_id]) or "")
    assert [(u.job_id, u.state, u.nodes) for u in usage] == [
        (job_id, "REQUEUED", 1),
        (job_id, "CANCELLED", 1),
    ]
    assert usage[0].elapsed_s >= 2, usage
