"""Which of the node's GPUs one task trains on, under every ``--gpu-bind``. Pure: one task's
environment in, its GPUs out; no TensorFlow, no os.environ, no sysfs.

Every task computes its share alone, from its own variables; the shares of the tasks of a node
must be disjoint and cover the GPUs (two ranks on one GPU: NCCL's "Duplicate GPU detected", or
a replica count that is not the one planned). What Slurm tells a task:

* ``SLURMD_TRES_BIND``: the step's ``--gpu-bind`` (``--tres-bind``), as ``gpu:<arg>`` (Slurm up
  to 23.02) or ``gres/gpu:<arg>``, with an optional ``verbose,`` first and other TRES after a
  ``;``. Slurm writes it for *every* value, ``none`` included, so its presence alone says
  nothing about binding.
* ``CUDA_VISIBLE_DEVICES``: the GPUs this task sees, in its own numbering. Under cgroup device
  confinement (``ConstrainDevices=yes``) Slurm renumbers them from 0
  (src/plugins/gres/common/gres_common.c: ``use_local_dev_index``), without it they are the
  node's device numbers.
* ``SLURM_STEP_GPUS``: the node's device numbers of the same GPUs, in the same order
  (gres_gpu.c writes both lists in one loop); ``SLURM_GPUS_ON_NODE``: the step's GPU count on
  this node; ``SLURM_GPUS_PER_TASK`` when ``--gpus-per-task`` was given.

The cases (:data:`STRICT`, :data:`LOOSE`, unbound):

* bound per task (``--gpus-per-task`` with Slurm's implied ``per_task``, ``map_gpu``,
  ``mask_gpu``, ``single:1``): the task sees exactly its GPUs; kept as they are. A map or mask
  that gives two tasks of a node one GPU, or ``single:N`` with N > 1, is refused.
* bound loosely (``closest``): a task sees the GPUs of its NUMA node, shared with the other
  tasks there. Where the node's GPUs are known (SLURM_JOB_GPUS, as many as
  SLURM_GPUS_ON_NODE), task ``SLURM_LOCALID`` takes the node's ``SLURM_LOCALID``-th share when
  those GPUs are near it, and stops in one line when not (tasks packed onto one NUMA node
  would share GPUs). Otherwise it takes its share among the GPUs near it by its place among
  the tasks there: with srun's
  ``--distribution=block:block`` (as hpctf starts workers) consecutive local ids fill a NUMA
  node, so the place is ``SLURM_LOCALID mod (tasks per NUMA node)``; under a ``cyclic`` socket
  distribution it is ``SLURM_LOCALID div (NUMA nodes)``. This assumes the tasks spread evenly
  over the NUMA nodes (each one's ``cpus_per_task`` x its tasks fill its cores); the worker log
  line names the node's device number each task took, so a clash shows there.
* not bound (``none``, ``verbose`` alone, plain ``--gpus-per-node``): every task sees all the
  step's GPUs of the node; task ``SLURM_LOCALID`` takes the ``SLURM_LOCALID``-th equal share.
  Under ``none`` Slurm 22.05 sets no CUDA_VISIBLE_DEVICES at all (measured on the test
  cluster): the share is then taken from SLURM_GPUS_ON_NODE (:func:`_nothing_set`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpctf.core.errors import UserError

_DEVICE_RE = re.compile(r"^[A-Za-z0-9_:/.-]+$")
# Slurm's gres/gpu plugin sets CUDA_VISIBLE_DEVICES=NoDevFiles when the gres has no File=
# (src/plugins/gres/common/gres_common.c); it means "no device", not a device name.
NO_DEVICES = frozenset({"", "NoDevFiles", "-1"})

#: --gpu-bind values under which Slurm gives every task exactly its own GPUs.
STRICT = frozenset({"per_task", "map_gpu", "mask_gpu", "single"})
#: --gpu-bind values under which tasks see GPUs they share with other tasks (their NUMA node's).
LOOSE = frozenset({"closest"})
#: --gpu-bind values (and none given) under which every task sees all the step's GPUs.
UNBOUND = frozenset({"", "none"})


@dataclass(frozen=True)
class Binding:
    """One task's GPUs.

    ``gpus``: in this task's CUDA_VISIBLE_DEVICES numbering; ``rewrite``: whether the worker
    sets CUDA_VISIBLE_DEVICES to them before TensorFlow starts. ``devices``: the node's device
    numbers of the same GPUs (SLURM_STEP_GPUS), which are what tasks of a node must not share.
    ``how``: the binding they came from, for the worker's log line.
    """

    gpus: tuple[str, ...] = ()
    rewrite: bool = False
    devices: tuple[str, ...] = ()
    how: str = ""


def gpu_bind_mode(value: str) -> tuple[str, str]:
    """``SLURMD_TRES_BIND`` -> (GPU bind type, its argument): ``gpu:verbose,map_gpu:0,1`` ->
    ``("map_gpu", "0,1")``; ``("", "")`` when it says nothing about GPUs."""
    for part in value.split(";"):
        for prefix in ("gres/gpu:", "gpu:"):
            if part.startswith(prefix):
                rest = part[len(prefix) :]
                if rest == "verbose":
                    rest = ""
                elif rest.startswith("verbose,"):
                    rest = rest[len("verbose,") :]
                mode, _, argument = rest.partition(":")
                return mode, argument
    return "", ""


def gpu_binding(env: Mapping[str, str], tasks_per_node: int, local_id: int, node: str) -> Binding:
    """The GPUs of the task whose environment is ``env`` (see the module's docstring).

    ``tasks_per_node`` is the largest task count on any node of the step, so every worker gets
    the same number of GPUs (MWMS expects the same devices on every worker). One task per node
    keeps every visible GPU. Anything that would make two tasks of a node share a GPU, or
    leave a task none, is a UserError with one line.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        raw = env.get("SLURM_STEP_GPUS", "")
    source = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "SLURM_STEP_GPUS"
    if raw.strip() in NO_DEVICES:
        if "CUDA_VISIBLE_DEVICES" in env or "SLURM_STEP_GPUS" in env:
            return Binding()
        return _nothing_set(env, tasks_per_node, local_id, node)
    visible = _device_list(source, raw)
    devices = _node_devices(env, visible)
    bind_text = env.get("SLURMD_TRES_BIND", "")
    mode, argument = gpu_bind_mode(bind_text)
    shown = f"SLURMD_TRES_BIND={bind_text}"
    if tasks_per_node == 1:
        return Binding(visible, False, devices, "one worker per node")
    if mode in STRICT:
        _check_strict(mode, argument, tasks_per_node, shown)
        return Binding(visible, False, devices, f"bound by Slurm ({shown})")
    if mode in LOOSE:
        return _loose(env, visible, devices, tasks_per_node, local_id, node, shown)
    if mode not in UNBOUND:
        raise UserError(
            f"{shown} on {node} is a GPU binding hpctf does not know ({mode!r}); use "
            "--gpu-bind=none, closest, single:1, map_gpu or per_task (--gpus-per-task)"
        )
    if not mode and _bound_per_task(env, len(visible)):
        return Binding(visible, False, devices, "bound by Slurm (the step has more GPUs here)")
    share = _even_share(len(visible), tasks_per_node, node, f"{source}={raw}")
    chosen = slice(local_id * share, (local_id + 1) * share)
    how = f"split by SLURM_LOCALID ({shown})" if bind_text else "split by SLURM_LOCALID"
    return Binding(visible[chosen], True, devices[chosen], how)


def _nothing_set(env: Mapping[str, str], tasks_per_node: int, local_id: int, node: str) -> Binding:
    """Neither CUDA_VISIBLE_DEVICES nor SLURM_STEP_GPUS: measured on Slurm 22.05, that is what
    ``--gpu-bind=none`` leaves a task (SLURMD_TRES_BIND=gpu:none, SLURM_GPUS_ON_NODE=4,
    SLURM_JOB_GPUS=0,1,2,3 from the batch shell), and CUDA then shows every GPU the task may
    open. The job's GPUs here are SLURM_GPUS_ON_NODE of them, SLURM_JOB_GPUS when it lists as
    many; when those are the node's first ones, CUDA numbers them alike with cgroup confinement
    or without, and the task takes its share; otherwise their CUDA numbers cannot be known."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    if not on_node.isdigit() or int(on_node) == 0:
        return Binding()
    count = int(on_node)
    listed = tuple(part.strip() for part in env.get("SLURM_JOB_GPUS", "").split(","))
    numbered = tuple(str(index) for index in range(count))
    devices = listed if len(listed) == count else numbered
    if devices != numbered:
        raise UserError(
            f"Slurm left CUDA_VISIBLE_DEVICES unset on {node} (SLURMD_TRES_BIND="
            f"{env.get('SLURMD_TRES_BIND', '')}) and the job has GPUs {','.join(devices)} of the "
            "node, whose CUDA numbers depend on cgroup confinement; use --gpus-per-task=1 (no "
            "--gpu-bind=none), or whole nodes"
        )
    share = _even_share(count, tasks_per_node, node, f"SLURM_GPUS_ON_NODE={count}")
    chosen = slice(local_id * share, (local_id + 1) * share)
    how = "split by SLURM_LOCALID (CUDA_VISIBLE_DEVICES unset by Slurm)"
    return Binding(numbered[chosen], True, devices[chosen], how)


def _device_list(source: str, raw: str) -> tuple[str, ...]:
    visible = tuple(part.strip() for part in raw.split(","))
    if not all(_DEVICE_RE.match(device) for device in visible):
        raise UserError(f"{source}={raw!r} is not a comma-separated list of GPU ids")
    if len(set(visible)) != len(visible):
        raise UserError(f"{source}={raw!r} names a GPU twice")
    return visible


def _node_devices(env: Mapping[str, str], visible: tuple[str, ...]) -> tuple[str, ...]:
    """The node's device numbers of ``visible``: SLURM_STEP_GPUS when it lists the same number
    of GPUs (the same ones, in the same order), else the visible ids themselves."""
    step = env.get("SLURM_STEP_GPUS", "")
    if step.strip() not in NO_DEVICES:
        listed = tuple(part.strip() for part in step.split(","))
        if len(listed) == len(visible):
            return listed
    return visible


def _even_share(count: int, tasks_per_node: int, node: str, what: str) -> int:
    if count < tasks_per_node:
        gpus = "1 GPU" if count == 1 else f"{count} GPUs"
        raise UserError(
            f"{gpus} visible on {node} ({what}) cannot be shared by {tasks_per_node} "
            "tasks per node: each TensorFlow worker needs a GPU of its own (NCCL fails on two "
            "ranks of one GPU); ask for gpus_per_node equal to tasks_per_node (one worker per "
            "GPU), or tasks_per_node: 1"
        )
    if count % tasks_per_node:
        raise UserError(
            f"{count} GPUs visible on {node} ({what}) cannot be shared evenly "
            f"by {tasks_per_node} tasks per node; ask for tasks_per_node equal to the GPUs per "
            "node (one worker per GPU) or 1 (one worker per node)"
        )
    return count // tasks_per_node


def _check_strict(mode: str, argument: str, tasks_per_node: int, shown: str) -> None:
    """Refuse a per-task binding that gives two tasks of a node one GPU (the map, the masks
    and single's tasks-per-GPU are in the variable, so every task sees the clash alike)."""
    fix = "give each task of a node its own GPU (--gpus-per-task=1, or --gpu-bind=none)"
    if mode == "single":
        per_gpu = argument.strip() or "1"
        if per_gpu != "1":
            raise UserError(f"{shown} puts {per_gpu} tasks on each GPU: {fix}")
        return
    if mode not in ("map_gpu", "mask_gpu"):
        return
    entries = _expand_map(argument, shown)
    # Slurm reuses the list from its start when there are more tasks than entries.
    of_task = [entries[task % len(entries)] for task in range(tasks_per_node)]
    if mode == "map_gpu":
        taken: dict[str, int] = {}
        for task, gpu in enumerate(of_task):
            if gpu in taken:
                raise UserError(
                    f"{shown} gives local tasks {taken[gpu]} and {task} both GPU {gpu}: {fix}"
                )
            taken[gpu] = task
        return
    masks = [_mask(entry, shown) for entry in of_task]
    for task, mask in enumerate(masks):
        for other in range(task):
            if masks[other] & mask:
                raise UserError(
                    f"{shown} gives local tasks {other} and {task} a GPU in common "
                    f"(masks {of_task[other]} and {of_task[task]}): {fix}"
                )


def _expand_map(argument: str, shown: str) -> list[str]:
    """``0*2,1`` -> ``["0", "0", "1"]`` (Slurm's repetition form)."""
    entries: list[str] = []
    for part in argument.split(","):
        value, star, times = part.strip().partition("*")
        if not value or (star and not times.isdigit()):
            raise UserError(f"{shown}: {part!r} is not a GPU id or id*count")
        entries.extend([value] * (int(times) if star else 1))
        if len(entries) > 65536:
            raise UserError(f"{shown} repeats more than 65,536 entries")
    return entries


def _mask(entry: str, shown: str) -> int:
    try:
        return int(entry, 16)
    except ValueError:
        raise UserError(f"{shown}: {entry!r} is not a hexadecimal GPU mask") from None


def _loose(
    env: Mapping[str, str],
    visible: tuple[str, ...],
    devices: tuple[str, ...],
    tasks_per_node: int,
    local_id: int,
    node: str,
    shown: str,
) -> Binding:
    """``closest``: the task's share among its NUMA node's GPUs (see the module's docstring)."""
    share = _share(env, tasks_per_node, node)
    seen = f"{len(visible)} GPU(s) near it ({','.join(devices)})"
    on_node = _job_gpus(env)
    if on_node and set(devices) <= set(on_node):
        # The node's GPUs are known: task i takes the node's i-th share, which makes the
        # tasks' shares disjoint by construction, if it is among the GPUs near it.
        wanted = on_node[local_id * share : (local_id + 1) * share]
        if not set(wanted) <= set(devices):
            raise UserError(
                f"{shown}: local task {local_id} on {node} sees {seen}, not its share of the "
                f"node's GPUs ({','.join(wanted)}): the tasks are not spread over the NUMA "
                "nodes as the GPUs are (more tasks on one than it has GPUs?), so two could "
                "share one; use --gpu-bind=none, or cpus_per_task that fills each NUMA node "
                "with its GPUs' tasks"
            )
        picked = [devices.index(gpu) for gpu in wanted]
        how = f"the node's share {local_id + 1} of {tasks_per_node}, near it ({shown})"
        return Binding(tuple(visible[i] for i in picked), True, tuple(wanted), how)
    if len(visible) < share or len(visible) % share:
        raise UserError(
            f"{shown}: local task {local_id} on {node} sees {seen}, not a multiple of its share "
            f"of {share}; use --gpu-bind=none or --gpus-per-task={share}"
        )
    sharing = len(visible) // share  # tasks on this NUMA node
    if tasks_per_node % sharing:
        raise UserError(
            f"{shown}: local task {local_id} on {node} sees {seen}, enough for {sharing} "
            f"tasks, but {tasks_per_node} tasks per node do not split into groups of "
            f"{sharing}; use --gpu-bind=none or --gpus-per-task={share}"
        )
    groups = tasks_per_node // sharing
    socket_level = [*env.get("SLURM_DISTRIBUTION", "").split(":"), ""][1]
    cyclic = socket_level in ("cyclic", "fcyclic")
    place = local_id // groups if cyclic else local_id % sharing
    chosen = slice(place * share, (place + 1) * share)
    how = f"{place + 1} of {sharing} tasks near GPUs {','.join(devices)} ({shown})"
    return Binding(visible[chosen], True, devices[chosen], how)


def _job_gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """The job's GPUs on the node, when known: SLURM_JOB_GPUS (the batch shell's, which srun
    passes on) when it lists SLURM_GPUS_ON_NODE of them; else ()."""
    listed = tuple(p.strip() for p in env.get("SLURM_JOB_GPUS", "").split(",") if p.strip())
    count = env.get("SLURM_GPUS_ON_NODE", "")
    return listed if count.isdigit() and len(listed) == int(count) else ()


def _share(env: Mapping[str, str], tasks_per_node: int, node: str) -> int:
    """GPUs per task: SLURM_GPUS_PER_TASK, else SLURM_GPUS_ON_NODE over the tasks, else 1."""
    per_task = env.get("SLURM_GPUS_PER_TASK", "").rpartition(":")[2]
    if per_task.isdigit() and int(per_task) > 0:
        return int(per_task)
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) > 0:
        return _even_share(int(on_node), tasks_per_node, node, f"SLURM_GPUS_ON_NODE={on_node}")
    return 1


def _bound_per_task(env: Mapping[str, str], visible: int) -> bool:
    """Without a --gpu-bind in SLURMD_TRES_BIND: whether the step's GPUs on this node
    (SLURM_STEP_GPUS, else SLURM_JOB_GPUS) are more than this task sees, so Slurm gave each
    task its own. A single visible GPU alone proves nothing: with ``--gpus-per-node=1
    --ntasks-per-node=2`` both tasks see the same one."""
    step = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    if step.strip() in NO_DEVICES:
        return False
    return len(step.split(",")) > visible
