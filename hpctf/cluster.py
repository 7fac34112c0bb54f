"""SLURM environment -> TensorFlow cluster spec. Pure: no TensorFlow, no os.environ.

TF's own SlurmClusterResolver is not used: it sorts hosts as strings (in ``node[9-10]`` rank 0
gets node10's address), assumes a fixed port 8888 and rewrites CUDA_VISIBLE_DEVICES
(tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver.py). Here workers are in
SLURM_PROCID order, hosts in Slurm's own order (python-hostlist), ports per task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

import hostlist

from hpctf.errors import UserError

# Consecutive job ids start their port windows this far apart, so two jobs that share a node
# collide only if their ids differ by a multiple of (span / gcd(span, stride)) -- not for
# neighbouring ids, which is where job-id-modulo schemes collide.
_JOB_STRIDE = 1009
_STEP_STRIDE = 101


@dataclass(frozen=True)
class ClusterSpec:
    """The workers of one job step, in SLURM_PROCID order, and which one this task is."""

    workers: tuple[str, ...]
    task_index: int

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def address(self) -> str:
        return self.workers[self.task_index]

    def tf_config(self) -> str:
        """The TF_CONFIG JSON for this task."""
        return json.dumps(
            {
                "cluster": {"worker": list(self.workers)},
                "task": {"type": "worker", "index": self.task_index},
            }
        )


def expand_nodelist(text: str) -> list[str]:
    """Hosts of a Slurm nodelist, in Slurm's order (``node[9-10]`` -> node9, node10)."""
    try:
        hosts: list[str] = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise UserError(f"cannot expand nodelist {text!r}: {exc}") from None
    if not hosts:
        raise UserError(f"nodelist {text!r} names no host")
    return hosts


_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed tasks-per-node (``2(x3),1``) -> one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS_RE.match(part.strip())
        if not match:
            raise UserError(f"cannot read tasks per node {text!r}; expected a form like 2(x3),1")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def port_for(job_id: int, step_id: int, proc_id: int, port_range: tuple[int, int]) -> int:
    """The port of task ``proc_id``: distinct for every task of a step, even on one IP."""
    low, high = port_range
    span = high - low
    offset = (job_id * _JOB_STRIDE + step_id * _STEP_STRIDE) % span
    return low + (offset + proc_id) % span


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise UserError(f"{key} is not set: run `hpctf worker` inside a Slurm job step (srun)")
        return default
    # Outside a step, SLURM_STEP_ID may be "batch"/"extern"; neither starts workers.
    if not raw.isdigit():
        raise UserError(f"{key}={raw!r} is not a number")
    return int(raw)


def cluster_spec(env: Mapping[str, str], port_range: tuple[int, int]) -> ClusterSpec:
    """The cluster of the job step described by ``env`` (a copy of a task's environment)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise UserError("SLURM_JOB_NODELIST is not set: run `hpctf worker` inside srun")
    hosts = expand_nodelist(nodelist)
    tasks_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = expand_tasks_per_node(tasks_text) if tasks_text else [1] * len(hosts)
    if len(counts) != len(hosts):
        raise UserError(
            f"nodelist {nodelist!r} has {len(hosts)} hosts but tasks per node "
            f"{tasks_text!r} has {len(counts)} entries"
        )
    # Block distribution (hpctf's srun line asks for it): ranks fill node 0, then node 1, ...
    task_hosts = [host for host, count in zip(hosts, counts, strict=True) for _ in range(count)]
    ntasks = _int(env, "SLURM_NTASKS", len(task_hosts))
    if ntasks != len(task_hosts):
        raise UserError(f"SLURM_NTASKS={ntasks} but the tasks per node add up to {len(task_hosts)}")
    proc_id = _int(env, "SLURM_PROCID")
    if not 0 <= proc_id < ntasks:
        raise UserError(f"SLURM_PROCID={proc_id} is outside 0..{ntasks - 1}")
    low, high = port_range
    if ntasks > high - low:
        raise UserError(f"{ntasks} tasks need more ports than port_range {low}-{high} holds")
    job_id = _int(env, "SLURM_JOB_ID")
    step_id = _int(env, "SLURM_STEP_ID", 0)
    workers = tuple(
        f"{host}:{port_for(job_id, step_id, rank, port_range)}"
        for rank, host in enumerate(task_hosts)
    )
    # Startup self-check: a rank placed on another node than we computed would hang in the
    # first collective; fail now with both sides shown.
    actual = env.get("SLURMD_NODENAME")
    if actual and actual != task_hosts[proc_id]:
        raise UserError(
            f"rank {proc_id} runs on {actual} but the cluster spec puts it on "
            f"{task_hosts[proc_id]} (nodelist {nodelist!r}, tasks per node {tasks_text!r}); "
            "was srun given a distribution other than block?"
        )
    return ClusterSpec(workers=workers, task_index=proc_id)
