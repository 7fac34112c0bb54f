"""The GPUs of one task: how many Slurm gave it (:func:`granted_gpus`; which ones:
:mod:`hpctf.compute.cluster.gpu_bind`), and whether TensorFlow got them (:func:`check_gpus`).
Pure: no TensorFlow, no os.environ.

A CPU-only TensorFlow (``tensorflow-cpu``, or PyPI's ``tensorflow`` for aarch64 Linux, whose
2.21.0 wheel says ``is_cuda_build: False`` even when installed as ``tensorflow[and-cuda]``)
trains happily on the CPUs of a GPU node: the job runs for hours at a fraction of the speed and
nothing fails. So before a worker joins the cluster,
:func:`hpctf.compute.doctor.node_checks.check_tensorflow_gpus` asks TensorFlow what it is and sees,
and :func:`check_gpus` stops the task with one line naming the fix. The worker then exits 2
and ``srun --kill-on-bad-exit=1`` ends the job before any training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpctf.core.errors import UserError


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
    (:attr:`hpctf.compute.cluster.spec.ClusterSpec.gpus`: CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS,
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
        raise UserError(f"{given} but {built} and sees none: {_cpu_build_fix(packages, machine)}")
    if seen < expected:
        fix = _unseen_gpus_fix(device_files)
        raise UserError(f"{given} but TensorFlow {tf_version} (a GPU build) sees {seen}: {fix}")
    if seen > expected:
        raise UserError(
            f"{given} but TensorFlow {tf_version} sees {seen}: it would also use GPUs that are "
            "not this task's; let Slurm set CUDA_VISIBLE_DEVICES (do not unset or change it in "
            "setup)"
        )


def _cpu_build_fix(packages: Sequence[str], machine: str) -> str:
    """What to install when a CPU-only TensorFlow was given GPUs (:func:`check_gpus`)."""
    if machine in ("aarch64", "arm64"):
        return (
            "PyPI has no CUDA build of TensorFlow for aarch64 Linux (tensorflow[and-cuda] "
            "installs a CPU-only one there): point the site's python or venv at a CUDA "
            "build of TensorFlow (a site module or container) with hpctf installed"
        )
    if "tensorflow-cpu" in packages:
        return (
            "install hpctf[gpu] (tensorflow[and-cuda]) in a fresh environment for the "
            "compute nodes (without tensorflow-cpu: the two share files)"
        )
    return "install hpctf[gpu] (tensorflow[and-cuda]) in the compute nodes' environment"


def _unseen_gpus_fix(device_files: bool) -> str:
    """What to check when a GPU build of TensorFlow sees fewer GPUs than Slurm gave."""
    if not device_files:
        return (
            "the cluster's gres.conf has no File= for its GPUs, so CUDA sees none; ask the "
            "admins, or set resources.gpus_per_node: 0 to train on CPUs"
        )
    return (
        "check the node's driver (nvidia-smi), the site's CUDA modules, and "
        "TensorFlow's messages above (a CUDA library that did not load)"
    )
