"""A lost node on the real Slurm test cluster (issue #44, item 1): the node of rank 1 is lost
mid-run (its slurmd and everything it started SIGKILLed: tests/slurm/cluster.sh lose). With
``resources.spare_nodes: 1`` the same job trains again on the two nodes left, from its newest
checkpoint, with no requeue; with none, the same loss falls back to Slurm's requeue, the node
left out of the next start. Both name the node and the cause in the journal and in status.

Both on clusters of their own, at once: three nodes each, and a SlurmdTimeout of 10 s (the
session's cluster has two nodes and 60 s), stopped after the module, so no other test meets a
lost node. Each run mostly waits (paced steps, then Slurm noticing the loss): one after the
other they held a test worker for two and a half minutes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.metrics_history import metric_records
from hpctf.core.run.rundir import RunDir
from tests.conftest import (
    CLUSTER,
    HPCTF,
    checkpoint_steps,
    paced,
    start_cluster,
    xdist_cluster,
)
from tests.slurm_jobs import logs_of, report_fault, submit_digits, wait_for_log

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

EVERY_S = 3  # checkpoint.every_seconds
# Paced (tests.conftest.paced, 30 ms asleep a step, about 30 steps a second here): about 20 s
# of training, most of it left after a loss that follows the first save; its ranks leave the
# CPUs to the other tests while they train and while Slurm notices the loss (8,000 digits steps
# at full speed took both cores for as long).
PACE_S, STEPS = 0.03, 600
SLURMD_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def three_node_clusters(checkout_for_others: Path) -> Iterator[tuple[dict[str, str], ...]]:
    """Two 3-node test clusters beside the session's: each its own state dir, ports (the
    session cluster's + 150 and + 170: below the 24.11 cluster's + 200) and job ids (+ 40,000
    and + 45,000), each xdist worker's moved as for the session's."""
    with contextlib.ExitStack() as stack:
        clusters = tuple(
            stack.enter_context(_three_nodes(checkout_for_others, number)) for number in (0, 1)
        )
        yield clusters


@contextlib.contextmanager
def _three_nodes(checkout: Path, number: int) -> Iterator[dict[str, str]]:
    port = int(os.environ.get("HPCTF_SLURM_PORT", "16817")) + 150 + 20 * number
    first_job = int(os.environ.get("HPCTF_SLURM_FIRST_JOB_ID", "1")) + 40_000 + 5_000 * number
    env = {
        **os.environ,
        "HPCTF_SLURM_DIR": os.environ.get("HPCTF_SLURM_DIR", "/tmp/hpctf-slurm")
        + f"-3nodes{'-b' * number}",
        "HPCTF_SLURM_PORT": str(port),
        "HPCTF_SLURM_FIRST_JOB_ID": str(first_job),
        "HPCTF_SLURM_NODES": "3",
        "HPCTF_SLURM_SLURMD_TIMEOUT": str(SLURMD_TIMEOUT_S),
    }
    env.pop("HPCTF_SLURM_ROOT", None)
    env.update(xdist_cluster(env, os.environ.get("PYTEST_XDIST_WORKER", "")))
    yield from start_cluster(env, checkout)


def _lose_rank_1_node(cluster: dict[str, str], run_dir: Path) -> tuple[str, float]:
    """Once the run has a checkpoint, lose the node of rank 1 (between two saves); its name
    and the time it was lost."""
    deadline = time.monotonic() + 240
    log = wait_for_log(run_dir / "logs" / "rank-1.log", " host ", run_dir, deadline)
    node = re.search(r" host (\S+) pid ", log).group(1)  # type: ignore[union-attr]
    while not checkpoint_steps(run_dir):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.1)
    time.sleep(EVERY_S * 0.5)
    subprocess.run([str(CLUSTER), "lose", node], env=cluster, check=True, capture_output=True)
    return node, time.time()


def _wait_done(run_dir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "DONE").exists():
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.5)


def _status(env: dict[str, str], run_dir: Path) -> str:
    proc = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout


def _every_step_once(run_dir: Path) -> None:
    steps = [r["step"] for r in metric_records(run_dir / "metrics.jsonl") if "loss" in r]
    assert steps and len(steps) == len(set(steps)) and max(steps) == STEPS


def _submit(cluster: dict[str, str], tmp_path: Path, spares: int) -> tuple[str, Path]:
    env = {**cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs"), "CUDA_VISIBLE_DEVICES": ""}
    return submit_digits(
        env,
        *paced(PACE_S),
        f"resources.spare_nodes={spares}",
        f"train.steps={STEPS}",
        f"checkpoint.every_seconds={EVERY_S}",
        "checkpoint.every_steps=null",
        "checkpoint.keep=50",
    )


def test_a_lost_node_with_a_spare_trains_on_in_the_same_job_and_without_one_is_requeued(
    three_node_clusters: tuple[dict[str, str], ...], tmp_path: Path
) -> None:
    """The same loss twice at once, each run on a cluster of its own: with a spare node, and
    with none."""
    spare, requeue = three_node_clusters
    submitted: list[tuple[dict[str, str], str]] = []
    try:
        with_spare = _submit(spare, tmp_path / "spare", spares=1)
        submitted.append((spare, with_spare[0]))
        without = _submit(requeue, tmp_path / "requeue", spares=0)
        submitted.append((requeue, without[0]))
        assert "--no-kill" not in (without[1] / "job.sbatch").read_text()
        # The spare's loss between two saves (it measures the training lost), then the other's
        # while it still trains.
        spare_loss = _lose_rank_1_node(spare, with_spare[1])
        requeue_loss = _lose_rank_1_node(requeue, without[1])
        _with_a_spare_trains_again_in_the_same_job_on_the_nodes_left(
            spare, *with_spare, *spare_loss
        )
        _without_a_spare_falls_back_to_a_requeue_without_the_node(
            requeue, *without, requeue_loss[0]
        )
    finally:
        # Both clusters, their lost nodes with them, stop after this module's only test.
        for cluster, job_id in submitted:
            subprocess.run(["scancel", job_id], env=cluster, check=False)


def _with_a_spare_trains_again_in_the_same_job_on_the_nodes_left(
    cluster: dict[str, str], job_id: str, run_dir: Path, node: str, lost_at: float
) -> None:
    _wait_done(run_dir, 180)
    events = RunDir(run_dir).events()
    starts = [e for e in events if e["event"] == journal.STARTED]
    # One job, one allocation (Slurm's restart count unchanged): no requeue, no new job.
    assert [(e["job_id"], e["restart_count"]) for e in starts] == [(job_id, 0)] * 2, events
    left = {f"node{i}" for i in (1, 2, 3)} - {node}
    assert set(str(starts[1]["nodes"]).split(",")) == left
    down = [e for e in events if e["event"] == journal.NODES_DOWN]
    assert [e["nodes"] for e in down] == [[node]]
    (requeued,) = [e for e in events if e["event"] == journal.REQUEUED]
    assert requeued["in_place"] is True and f"{node} lost: spare 1 of 1 used" in requeued["why"]
    # The new rank 1 is on the spare; the run resumed from the checkpoint the end recorded.
    hosts = re.findall(r"rank 1: host (\S+) pid", (run_dir / "logs" / "rank-1.log").read_text())
    assert hosts[0] == node and hosts[-1] in left and len(hosts) == 2
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    restored = int(re.findall(r"resumed from \S+ at step (\d+)", rank0)[-1])
    lost_s = lost_at - (run_dir / "checkpoints" / f"ckpt-{restored}.index").stat().st_mtime
    assert lost_s <= EVERY_S + 1.0, f"{lost_s:.2f} s of training lost"
    _every_step_once(run_dir)
    status = _status(cluster, run_dir)
    assert f"(exit 3, cause node_lost {node})" in status, status
    assert "after failures 1/3" in status, status
    # Kill to the first step again, of which Slurm's own detection (the node set DOWN).
    ended = next(e for e in events if e["event"] == journal.ENDED)
    first = re.findall(r"^(\d\d:\d\d:\d\d) rank 0: first step", rank0, re.M)[-1]
    report_fault(
        "test_a_lost_node_with_a_spare_trains_again_in_the_same_job_on_the_nodes_left",
        run_dir,
        lost_s=round(lost_s, 2),
        job_end_at=ended["time"],
        first_step_again_at=first,
    )


def _without_a_spare_falls_back_to_a_requeue_without_the_node(
    cluster: dict[str, str], job_id: str, run_dir: Path, node: str
) -> None:
    _wait_done(run_dir, 240)
    events = RunDir(run_dir).events()
    starts = [e for e in events if e["event"] == journal.STARTED]
    assert [(e["job_id"], e["restart_count"]) for e in starts] == [(job_id, 0), (job_id, 1)]
    assert node not in str(starts[1]["nodes"])
    assert [e["nodes"] for e in events if e["event"] == journal.EXCLUDED] == [[node]]
    _every_step_once(run_dir)
    status = _status(cluster, run_dir)
    assert f"cause node_lost {node})" in status, status
    assert json.loads((run_dir / "DONE").read_text())["step"] == STEPS
    report_fault("test_a_lost_node_without_a_spare_falls_back_to_a_requeue_without_the_node",
                 run_dir)  # fmt: skip
