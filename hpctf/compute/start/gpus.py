"""The GPUs of one task: which of the node's GPUs it uses (:func:`gpu_binding`, from Slurm's
variables), and whether TensorFlow got them (:func:`check_gpus`). Pure: no TensorFlow, no
os.environ.

A CPU-only TensorFlow (``tensorflow-cpu``, or PyPI's ``tensorflow`` for aarch64 Linux, whose
2.21.0 wheel says ``is_cuda_build: False`` even when installed as ``tensorflow[and-cuda]``)
trains happily on the CPUs of a GPU node: the job runs for hours at a fraction of the speed and
nothing fails. So before a worker joins the cluster,
:func:`hpctf.compute.doctor.node_checks.check_tensorflow_gpus` asks TensorFlow what it is and sees,
and :func:`check_gpus` stops the task with one line naming the fix. The worker then exits 2
and ``srun --kill-on-bad-exit=1`` ends the job before any training.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctf.core.errors import UserError

_DEVICE_RE = re.compile(r"^[A-Za-z0-9_:/.-]+$")
# Slurm's gres/gpu plugin sets CUDA_VISIBLE_DEVICES=NoDevFiles when the gres has no File=
# (src/plugins/gres/common/gres_common.c); it means "no device", not a device name.
_NO_DEVICES = {"", "NoDevFiles", "-1"}


@dataclass(frozen=True)
class Grant:
    """How many GPUs Slurm gave this task and how that is known (for messages).

    ``device_files`` is false when the gres has no device files: Slurm then sets
    CUDA_VISIBLE_DEVICES=NoDevFiles and CUDA itself sees no GPU, whatever TensorFlow it is.
    """

    count: int
    source: str = ""
    device_files: bool = True


def granted_gpus(
    gpus: Sequence[str],
    cuda_visible_devices: str | None,
    gpus_per_node: int,
    tasks_per_node: int,
) -> Grant:
    """The GPUs this task was given.

    ``gpus`` are the task's GPUs from its cluster spec
    (:attr:`hpctf.compute.start.cluster.ClusterSpec.gpus`: CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS,
    this task's share when one worker runs per GPU). When Slurm says ``NoDevFiles`` there is no
    list to count: the run's ``gpus_per_node`` over its ``tasks_per_node`` is what Slurm
    allocated to the task (at least one when any).
    """
    if gpus:
        return Grant(len(gpus), f"GPUs {','.join(gpus)}")
    if (cuda_visible_devices or "").strip() == "NoDevFiles" and gpus_per_node > 0:
        count = max(1, gpus_per_node // tasks_per_node)
        source = (
            f"gpus_per_node {gpus_per_node} over {tasks_per_node} task(s) per node; "
            "CUDA_VISIBLE_DEVICES=NoDevFiles"
        )
        return Grant(count, source, device_files=False)
    return Grant(0)


def check_gpus(
    expected: int,
    seen: int,
    cuda_build: bool,
    tf_version: str,
    *,
    source: str = "",
    device_files: bool = True,
    packages: Sequence[str] = (),
    machine: str = "x86_64",
) -> None:
    """UserError (one line: what was found, and the fix) unless TensorFlow can use the GPUs.

    ``expected``: GPUs Slurm gave this task (:func:`granted_gpus`); 0 means nothing to check.
    ``seen``: ``len(tf.config.list_physical_devices("GPU"))``. ``cuda_build``:
    ``tf.test.is_built_with_gpu_support()`` (CUDA, or ROCm). ``packages``: the distributions
    that installed the ``tensorflow`` module (``tensorflow-cpu``, ``tensorflow``);
    ``machine``: ``platform.machine()``, because PyPI's aarch64 Linux wheels are CPU-only.
    """
    if expected == 0:
        return
    given = f"Slurm gave this task {expected} GPU(s)" + (f" ({source})" if source else "")
    if not cuda_build:
        built = f"TensorFlow {tf_version} is a CPU-only build"
        if packages:
            built += f" ({', '.join(packages)})"
        if machine in ("aarch64", "arm64"):
            fix = (
                "PyPI has no CUDA build of TensorFlow for aarch64 Linux (tensorflow[and-cuda] "
                "installs a CPU-only one there): point the site's python or venv at a CUDA "
                "build of TensorFlow (a site module or container) with hpctf installed"
            )
        elif "tensorflow-cpu" in packages:
            fix = (
                "install hpctf[gpu] (tensorflow[and-cuda]) in a fresh environment for the "
                "compute nodes (without tensorflow-cpu: the two share files)"
            )
        else:
            fix = "install hpctf[gpu] (tensorflow[and-cuda]) in the compute nodes' environment"
        raise UserError(f"{given} but {built} and sees none: {fix}")
    if seen < expected:
        if not device_files:
            fix = (
                "the cluster's gres.conf has no File= for its GPUs, so CUDA sees none; ask the "
                "admins, or set resources.gpus_per_node: 0 to train on CPUs"
            )
        else:
            fix = (
                "check the node's driver (nvidia-smi), the site's CUDA modules, and "
                "TensorFlow's messages above (a CUDA library that did not load)"
            )
        raise UserError(f"{given} but TensorFlow {tf_version} (a GPU build) sees {seen}: {fix}")
    if seen > expected:
        raise UserError(
            f"{given} but TensorFlow {tf_version} sees {seen}: it would also use GPUs that are "
            "not this task's; let Slurm set CUDA_VISIBLE_DEVICES (do not unset or change it in "
            "setup)"
        )


def gpu_binding(
    env: Mapping[str, str], tasks_per_node: int, local_id: int, node: str
) -> tuple[tuple[str, ...], bool]:
    """The GPUs of this task and whether CUDA_VISIBLE_DEVICES must be rewritten to them.

    ``tasks_per_node`` is the largest task count on any node of the step, so every worker gets
    the same number of GPUs (MWMS expects the same devices on every worker).

    * One task per node: every visible GPU, environment untouched (one worker per node).
    * Several tasks per node (one worker per GPU): if Slurm already bound GPUs per task
      (``--gpus-per-task``, ``--gpu-bind``), keep them; otherwise the visible GPUs are split
      evenly and task ``SLURM_LOCALID`` takes its share (with as many GPUs as tasks: the
      SLURM_LOCALID-th one). Fewer GPUs than tasks is a UserError: two workers on one GPU make
      NCCL fail ("Duplicate GPU detected").

    Slurm bound per task when SLURMD_TRES_BIND starts with ``gpu:`` or when the step's GPUs on
    this node (SLURM_STEP_GPUS, else SLURM_JOB_GPUS) are more than this task sees. A single
    visible GPU alone proves nothing: with ``--gpus-per-node=1 --ntasks-per-node=2`` both tasks
    see the same one.

    The visible GPUs are CUDA_VISIBLE_DEVICES when set (Slurm sets it for gres/gpu, in the
    task's own numbering, also under cgroup device confinement), else SLURM_STEP_GPUS.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        raw = env.get("SLURM_STEP_GPUS", "")
    source = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "SLURM_STEP_GPUS"
    if raw.strip() in _NO_DEVICES:
        return (), False
    visible = tuple(part.strip() for part in raw.split(","))
    if not all(_DEVICE_RE.match(device) for device in visible):
        raise UserError(f"{source}={raw!r} is not a comma-separated list of GPU ids")
    if len(set(visible)) != len(visible):
        raise UserError(f"{source}={raw!r} names a GPU twice")
    if tasks_per_node == 1 or _bound_per_task(env, len(visible)):
        return visible, False
    if len(visible) < tasks_per_node:
        gpus = "1 GPU" if len(visible) == 1 else f"{len(visible)} GPUs"
        raise UserError(
            f"{gpus} visible on {node} ({source}={raw}) cannot be shared by {tasks_per_node} "
            "tasks per node: each TensorFlow worker needs a GPU of its own (NCCL fails on two "
            "ranks of one GPU); ask for gpus_per_node equal to tasks_per_node (one worker per "
            "GPU), or tasks_per_node: 1"
        )
    if len(visible) % tasks_per_node:
        raise UserError(
            f"{len(visible)} GPUs visible on {node} ({source}={raw}) cannot be shared evenly "
            f"by {tasks_per_node} tasks per node; ask for tasks_per_node equal to the GPUs per "
            "node (one worker per GPU) or 1 (one worker per node)"
        )
    share = len(visible) // tasks_per_node
    return visible[local_id * share : (local_id + 1) * share], True


def _bound_per_task(env: Mapping[str, str], visible: int) -> bool:
    """Whether Slurm itself gave each task of the step its own GPUs (see :func:`gpu_binding`)."""
    if env.get("SLURMD_TRES_BIND", "").startswith("gpu:"):
        return True
    step = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    if step.strip() in _NO_DEVICES:
        return False
    return len(step.split(",")) > visible
