"""GPU binding under every --gpu-bind (hpctf/compute/cluster/gpu_bind.py): for each case the
environments of ALL tasks of one node are built the way Slurm's gres/gpu plugin writes them
(src/plugins/gres/gpu/gres_gpu.c, gres/common/gres_common.c), and the GPUs the tasks end with
must be disjoint and cover the node's. Then `hpctf tfconfig` itself, on 8 faked tasks.

No GPU has run this: the environments are what Slurm's source and documentation say a task
gets. Real Slurm (fake GPUs, no cgroups) is in tests/test_cluster_slurm.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.compute.cluster.gpu_bind import Binding, gpu_bind_mode, gpu_binding
from hpctf.core.errors import UserError

GPUS = 8  # a DGX H100: GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1
NUMA = {gpu: gpu // 4 for gpu in range(GPUS)}


@dataclass(frozen=True)
class Case:
    """One node's step: ``sees(local_id)`` is the node devices a task sees; ``per_task`` the
    GPUs each task should end with; ``cgroup``: ConstrainDevices=yes (renumbered from 0)."""

    name: str
    tres_bind: str | None
    tasks: int
    sees: Callable[[int], list[int]]
    per_task: int
    cgroup: bool = False
    extra: tuple[tuple[str, str], ...] = ()
    distribution: str = "block:block"
    unset: bool = False  # Slurm 22.05 under --gpu-bind=none: no CUDA_VISIBLE_DEVICES at all


def everything(_task: int) -> list[int]:
    return list(range(GPUS))


def own(count: int) -> Callable[[int], list[int]]:
    return lambda task: list(range(task * count, (task + 1) * count))


def near(tasks: int, distribution: str = "block") -> Callable[[int], list[int]]:
    """--gpu-bind=closest: the GPUs of the task's NUMA node (tasks spread evenly over both)."""

    def sees(task: int) -> list[int]:
        per_numa = tasks // 2
        numa = task % 2 if distribution == "cyclic" else task // per_numa
        return [gpu for gpu in range(GPUS) if NUMA[gpu] == numa]

    return sees


CASES = [
    Case("gpus-per-node, no gpu-bind", None, 8, everything, 1),
    Case("gpu-bind none", "gpu:none", 8, everything, 1),
    Case("gpu-bind none as Slurm 22.05 sets it", "gpu:none", 8, everything, 1, unset=True),
    Case("gpu-bind none as 22.05, 2 per task", "gpu:none", 4, everything, 2, unset=True),
    Case("gpu-bind none, cgroup", "gpu:none", 8, everything, 1, cgroup=True),
    Case("gpu-bind none, 2 per task", "gpu:none", 4, everything, 2),
    Case("gpu-bind verbose,none (23.11 form)", "gres/gpu:verbose,none", 8, everything, 1),
    Case("gpu-bind verbose only", "gpu:verbose", 8, everything, 1),
    Case("gpus-per-task=1 (per_task implied)", "gpu:per_task:1", 8, own(1), 1),
    Case("gpus-per-task=1, cgroup", "gres/gpu:per_task:1", 8, own(1), 1, cgroup=True),
    Case("gpus-per-task=2, cgroup", "gpu:per_task:2", 4, own(2), 2, cgroup=True),
    Case(
        "gpus-per-task=1 without a tres bind (Slurm < 21.08)",
        None,
        8,
        everything,
        1,
        extra=(("SLURM_GPUS_PER_TASK", "1"),),
    ),
    Case("map_gpu", "gpu:map_gpu:0,1,2,3,4,5,6,7", 8, own(1), 1),
    Case("map_gpu with repeats, cgroup", "gpu:map_gpu:0*1,1,2,3,4,5,6,7", 8, own(1), 1, True),
    Case("mask_gpu", "gpu:mask_gpu:0x1,0x2,0x4,0x8,0x10,0x20,0x40,0x80", 8, own(1), 1),
    Case("single:1", "gpu:verbose,single:1", 8, own(1), 1),
    Case("single:1, cgroup", "gpu:single:1", 8, own(1), 1, cgroup=True),
    Case("closest, block", "gpu:closest", 8, near(8), 1),
    Case("closest, block, cgroup", "gpu:closest", 8, near(8), 1, cgroup=True),
    Case(
        "closest, 4 tasks x 2 GPUs",
        "gpu:closest",
        4,
        near(4),
        2,
        extra=(("SLURM_GPUS_ON_NODE", "8"),),
    ),
    Case(
        "closest, cyclic sockets, cgroup",
        "gpu:closest",
        8,
        near(8, "cyclic"),
        1,
        cgroup=True,
        distribution="block:cyclic",
    ),
    Case(
        "closest, the node's GPUs known (SLURM_JOB_GPUS)",
        "gpu:closest",
        8,
        near(8),
        1,
        extra=(("SLURM_GPUS_ON_NODE", "8"), ("SLURM_JOB_GPUS", "0,1,2,3,4,5,6,7")),
    ),
    Case(
        "closest, the node's GPUs known, cgroup",
        "gres/gpu:closest",
        4,
        near(4),
        2,
        cgroup=True,
        extra=(("SLURM_GPUS_ON_NODE", "8"), ("SLURM_JOB_GPUS", "0,1,2,3,4,5,6,7")),
    ),
    Case(
        "closest, one task per NUMA node",
        "gpu:closest",
        2,
        near(2),
        4,
        extra=(("SLURM_GPUS_PER_TASK", "4"),),
    ),
]


def task_env(case: Case, task: int) -> dict[str, str]:
    """What Slurm gives task ``task`` of the node: CUDA_VISIBLE_DEVICES in the task's numbering
    (from 0 under cgroup confinement), SLURM_STEP_GPUS the node's device numbers of the same
    GPUs, in the same order."""
    devices = case.sees(task)
    visible = list(range(len(devices))) if case.cgroup else devices
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, visible)),
        "SLURM_STEP_GPUS": ",".join(map(str, devices)),
        "SLURM_LOCALID": str(task),
        "SLURM_DISTRIBUTION": case.distribution,
        **dict(case.extra),
    }
    if case.tres_bind is not None:
        env["SLURMD_TRES_BIND"] = case.tres_bind
    if case.unset:  # as measured: SLURM_JOB_GPUS comes from the batch shell
        del env["CUDA_VISIBLE_DEVICES"], env["SLURM_STEP_GPUS"]
        env.update(SLURM_GPUS_ON_NODE=str(GPUS), SLURM_JOB_GPUS=",".join(map(str, range(GPUS))))
    return env


def node_devices(case: Case, task: int, binding: Binding) -> set[int]:
    """The node device numbers of the GPUs the task will use, worked out from what it sets
    CUDA_VISIBLE_DEVICES to (not from the binding's own ``devices``)."""
    env = task_env(case, task)
    if case.unset:  # CUDA shows the whole node, numbered as the node numbers it
        return {int(gpu) for gpu in binding.gpus}
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    step = env["SLURM_STEP_GPUS"].split(",")
    return {int(step[visible.index(gpu)]) for gpu in binding.gpus}


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_task_of_a_node_gets_its_own_gpus(case: Case) -> None:
    bindings = [gpu_binding(task_env(case, t), case.tasks, t, "n1") for t in range(case.tasks)]
    sets = [node_devices(case, t, b) for t, b in enumerate(bindings)]
    assert all(len(s) == case.per_task for s in sets), sets
    for task, devices in enumerate(sets):
        assert {int(d) for d in bindings[task].devices} == devices
        for other in range(task):
            assert not devices & sets[other], (task, other, sets)
    assert set().union(*sets) == set(range(case.per_task * case.tasks)), sets


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("gpu:none", ("none", "")),
        ("gpu:closest", ("closest", "")),
        ("gpu:verbose,map_gpu:0,1", ("map_gpu", "0,1")),
        ("gres/gpu:single:1", ("single", "1")),
        ("gres/gpu:verbose", ("", "")),
        ("cpu:cores;gres/gpu:per_task:2", ("per_task", "2")),
        ("cpu:cores", ("", "")),
        ("", ("", "")),
    ],
)
def test_gpu_bind_mode(value: str, mode: tuple[str, str]) -> None:
    assert gpu_bind_mode(value) == mode


def refused(env: dict[str, str], tasks: int = 8, local_id: int = 1) -> str:
    with pytest.raises(UserError) as info:
        gpu_binding(env, tasks, local_id, "n1")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("bind", "said"),
    [
        ("gpu:map_gpu:0,0,1,1,2,2,3,3", "gives local tasks 0 and 1 both GPU 0"),
        ("gpu:map_gpu:0*2,1*2", "gives local tasks 0 and 1 both GPU 0"),
        ("gpu:map_gpu:0,1,2,3", "gives local tasks 0 and 4 both GPU 0"),  # reused from its start
        ("gpu:mask_gpu:0x3,0x6", "gives local tasks 0 and 1 a GPU in common"),
        ("gpu:single:2", "puts 2 tasks on each GPU"),
        ("gpu:map_gpu:0,x*y", "is not a GPU id or id*count"),
        ("gpu:mask_gpu:zz", "is not a hexadecimal GPU mask"),
        ("gpu:sideways", "a GPU binding hpctf does not know ('sideways')"),
    ],
)
def test_bindings_that_share_a_gpu_are_refused(bind: str, said: str) -> None:
    message = refused({"CUDA_VISIBLE_DEVICES": "0", "SLURMD_TRES_BIND": bind})
    assert said in message


def test_closest_with_every_task_on_one_numa_node_that_cannot_split() -> None:
    # 6 tasks per node, 3 of them near each 4 GPUs: no even split.
    message = refused(
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURMD_TRES_BIND": "gpu:closest"}, tasks=6
    )
    assert "do not split into groups of 4" in message


def test_closest_with_every_task_packed_on_one_numa_node_is_refused() -> None:
    # block:block with few CPUs per task puts all 8 tasks on NUMA node 0: each sees GPUs 0-3.
    # Task 4's share of the node (GPU 4) is not near it: two tasks would share a GPU.
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "SLURM_STEP_GPUS": "0,1,2,3",
        "SLURMD_TRES_BIND": "gpu:closest",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    }
    for task in range(4):
        assert gpu_binding(env, 8, task, "n1").devices == (str(task),)
    message = refused(env, local_id=4)
    assert "local task 4 on n1 sees 4 GPU(s) near it (0,1,2,3), not its share of the node's" in (
        message
    )


def test_gpu_bind_none_on_part_of_a_node_is_refused() -> None:
    # GPUs 4-7 of the node: CUDA calls them 0-3 under cgroup confinement, 4-7 without.
    env = {"SLURMD_TRES_BIND": "gpu:none", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "4,5,6,7"}
    assert "the job has GPUs 4,5,6,7 of the node" in refused(env, tasks=4)


def test_no_gpus_asked_for_is_no_gpus() -> None:
    assert gpu_binding({"SLURMD_TRES_BIND": "gpu:none"}, 8, 1, "n1") == Binding()
    assert gpu_binding({"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "8"}, 8, 1, "n1") == (
        Binding()
    )


def test_one_task_per_node_keeps_every_gpu_whatever_the_binding() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURMD_TRES_BIND": "gpu:none"}
    assert gpu_binding(env, 1, 0, "n1").gpus == ("0", "1", "2", "3")
    assert not gpu_binding(env, 1, 0, "n1").rewrite


# --- through the real command --------------------------------------------------------------


def step_env(task: int, **extra: str) -> dict[str, str]:
    """Task ``task`` of an 8-task step on one node (--gpus-per-node=8 --gpu-bind=none)."""
    return {
        "SLURM_JOB_ID": "35",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "dgx01",
        "SLURM_TASKS_PER_NODE": "8",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(task),
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "dgx01",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
        "SLURMD_TRES_BIND": "gpu:none",
        **extra,
    }


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith(("SLURM", "CUDA_VISIBLE")):
            monkeypatch.delenv(key)


@pytest.mark.parametrize("bind", ["gpu:none", "gpu:none as 22.05", "gpu:closest"])
def test_tfconfig_names_one_distinct_gpu_per_task(clean_env: None, bind: str) -> None:
    said = []
    for task in range(8):
        extra = {"SLURMD_TRES_BIND": bind.split()[0]}
        if bind == "gpu:none as 22.05":
            extra.update(SLURM_GPUS_ON_NODE="8", SLURM_JOB_GPUS="0,1,2,3,4,5,6,7")
        if bind == "gpu:closest":  # block:block: tasks 0-3 near GPUs 0-3, 4-7 near 4-7
            near_gpus = "0,1,2,3" if task < 4 else "4,5,6,7"
            extra.update(CUDA_VISIBLE_DEVICES=near_gpus, SLURM_STEP_GPUS=near_gpus)
        variables = step_env(task, **extra)
        if bind == "gpu:none as 22.05":
            del variables["CUDA_VISIBLE_DEVICES"], variables["SLURM_STEP_GPUS"]
        result = CliRunner().invoke(cli, ["tfconfig"], env=variables)
        assert result.exit_code == 0, result.output
        found = re.search(r"CUDA_VISIBLE_DEVICES=(\S+) \(one worker per GPU", result.stderr)
        assert found, result.stderr
        said.append(found.group(1))
    assert said == [str(task) for task in range(8)]
