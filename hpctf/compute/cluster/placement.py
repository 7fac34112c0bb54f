"""Where srun put each rank of a job step, from Slurm's variables alone (pure): the step's
nodes in Slurm's order and tasks per node, checked together (:func:`step_tasks`), and each
rank's node and local id under block, cyclic and plane distributions (:func:`layout`). Used by
:func:`hpctf.compute.cluster.spec.cluster_spec`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctf.core.errors import SlurmEnvironmentProblem, UserError
from hpctf.core.scheduler.hostnames import expand_nodelist

_NUMBER_RE = re.compile(r"^[0-9]{1,9}$")
_TASKS_RE = re.compile(r"^([0-9]{1,6})(?:\(x([0-9]{1,7})\))?$")


def expand_tasks_per_node(text: str, max_nodes: int = 1_000_000) -> list[int]:
    """Slurm's compressed tasks-per-node (``2(x3),1``) -> one count per node ([2, 2, 2, 1]).

    Stops with a SlurmEnvironmentProblem once the text names more than ``max_nodes`` nodes, so
    a hostile ``1(x9999999)`` costs nothing. Counts are at least 1: a step has no empty nodes.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS_RE.match(part)
        if not match:
            raise SlurmEnvironmentProblem(
                f"cannot read tasks per node {text!r}; expected a form like 2(x3),1"
            )
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if count == 0 or repeat == 0:
            raise SlurmEnvironmentProblem(
                f"tasks per node {text!r} has a zero count; every node runs a task"
            )
        if len(counts) + repeat > max_nodes:
            raise SlurmEnvironmentProblem(
                f"tasks per node {text!r} names more nodes than the {max_nodes} in the nodelist"
            )
        counts.extend([count] * repeat)
    return counts


def slurm_int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise SlurmEnvironmentProblem(f"{key} is not set in this Slurm job step")
        return default
    # Outside a step, SLURM_STEP_ID may be "batch"/"extern"; neither starts workers.
    if not _NUMBER_RE.match(raw):
        raise SlurmEnvironmentProblem(f"{key}={raw!r} is not a number")
    return int(raw)


def plane_size(distribution: str, env: Mapping[str, str]) -> int | None:
    """Tasks per node per round for SLURM_DISTRIBUTION; None means block (fill each node).

    srun exports SLURM_DISTRIBUTION only when --distribution is given, as
    ``node-level[:socket-level[:core-level]][,Pack|NoPack]`` ("block:block", "cyclic",
    "plane" with SLURM_DIST_PLANESIZE). Only the node level decides which node a rank is on
    (https://slurm.schedmd.com/srun.html#OPT_distribution).
    """
    node_level = distribution.split(",")[0].split(":")[0].strip().lower()
    if node_level in {"", "*", "block"}:
        return None
    if node_level == "cyclic":
        return 1
    if node_level.startswith("plane"):
        raw = node_level.partition("=")[2] or env.get("SLURM_DIST_PLANESIZE", "")
        if not _NUMBER_RE.match(raw) or int(raw) == 0:
            raise UserError(
                f"SLURM_DISTRIBUTION={distribution!r} without a plane size "
                f"(SLURM_DIST_PLANESIZE={raw!r})"
            )
        return int(raw)
    if node_level == "arbitrary":
        raise UserError(
            "SLURM_DISTRIBUTION=arbitrary: rank placement came from a host list that the "
            "environment does not carry; start workers with srun --distribution=block:block"
        )
    raise UserError(
        f"SLURM_DISTRIBUTION={distribution!r} is not one hpctf knows (block, cyclic, plane)"
    )


def layout(counts: Sequence[int], plane: int | None) -> tuple[list[int], list[int]]:
    """Node index and local id of every rank, as srun places ``counts[i]`` tasks on node i.

    ``plane`` None is block (node 0 takes ranks 0..counts[0]-1, then node 1, ...); otherwise
    ranks are dealt round-robin over the nodes, ``plane`` at a time, skipping full nodes:
    cyclic is plane 1. Local ids count up in rank order on each node. This matches Slurm 22.05
    for block, cyclic and plane=N with even and uneven counts (tests/test_cluster_slurm.py).
    """
    if plane is None or plane >= max(counts):
        nodes = [i for i, count in enumerate(counts) for _ in range(count)]
        local = [j for count in counts for j in range(count)]
        return nodes, local
    nodes, local = [], []
    placed = [0] * len(counts)
    remaining = sum(counts)
    while remaining:
        for i, count in enumerate(counts):
            take = min(plane, count - placed[i])
            for j in range(placed[i], placed[i] + take):
                nodes.append(i)
                local.append(j)
            placed[i] += take
            remaining -= take
    return nodes, local


@dataclass(frozen=True)
class StepTasks:
    """The job step's nodes and tasks as Slurm's variables give them, checked together."""

    hosts: list[str]
    counts: list[int]
    ntasks: int
    proc_id: int
    nodelist: str
    tasks_text: str


def step_tasks(env: Mapping[str, str]) -> StepTasks:
    """The step's hosts (in Slurm's order), tasks per host, task count and this task's rank;
    a SlurmEnvironmentProblem when one is missing or they disagree."""
    nodelist_key = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = env.get(nodelist_key)
    if not nodelist:
        raise SlurmEnvironmentProblem("SLURM_JOB_NODELIST is not set in this Slurm job step")
    hosts = expand_nodelist(nodelist)
    if len(set(hosts)) != len(hosts):
        raise SlurmEnvironmentProblem(f"{nodelist_key}={nodelist!r} names a node twice")
    tasks_key = (
        "SLURM_STEP_TASKS_PER_NODE"
        if env.get("SLURM_STEP_TASKS_PER_NODE")
        else "SLURM_TASKS_PER_NODE"
    )
    tasks_text = env.get(tasks_key)
    if not tasks_text:
        raise SlurmEnvironmentProblem("SLURM_TASKS_PER_NODE is not set in this Slurm job step")
    counts = expand_tasks_per_node(tasks_text, max_nodes=len(hosts))
    if len(counts) != len(hosts):
        raise SlurmEnvironmentProblem(
            f"{nodelist_key}={nodelist!r} has {len(hosts)} hosts but {tasks_key}={tasks_text!r} "
            f"has {len(counts)} entries"
        )
    total = sum(counts)
    ntasks = slurm_int(env, "SLURM_NTASKS", total)
    if ntasks != total:
        raise SlurmEnvironmentProblem(
            f"SLURM_NTASKS={ntasks} but {tasks_key}={tasks_text!r} adds up to {total}"
        )
    proc_id = slurm_int(env, "SLURM_PROCID")
    if not 0 <= proc_id < ntasks:
        raise SlurmEnvironmentProblem(f"SLURM_PROCID={proc_id} is outside 0..{ntasks - 1}")
    return StepTasks(hosts, counts, ntasks, proc_id, nodelist, tasks_text)
