"""How many replicas a run trains on, and whether its global batch splits over them: checked
by ``hpctf validate``/``submit`` from the request (:func:`expected_replicas`) and again by the
worker once the strategy has counted the devices it really got."""

from __future__ import annotations

from hpctf.core.settings.config import Resources


def expected_replicas(resources: Resources) -> int:
    """The replicas MultiWorkerMirroredStrategy makes from ``resources``: one per task on CPUs,
    one per GPU of each task otherwise (a node's GPUs shared by its tasks). A task that sees
    more GPUs than that (a local site) makes a multiple of it."""
    tasks = resources.nodes * resources.tasks_per_node
    return tasks * max(1, (resources.gpus_per_node or 0) // resources.tasks_per_node)


def batch_split_problem(global_batch: int, replicas: int) -> str | None:
    """Why ``global_batch`` cannot be split evenly over ``replicas`` (after the key's name),
    or None."""
    if global_batch % replicas:
        return f"{global_batch} is not divisible by the {replicas} replicas"
    return None
