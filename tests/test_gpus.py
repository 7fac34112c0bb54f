"""The worker's GPU check before it joins the cluster: pure unit tests (hpctf/gpus.py), the
glue with this machine's TensorFlow, and benchmarks/gpu_check.py in its CPU-sized --tiny mode.

The same check on the real Slurm test cluster: tests/test_slurm_e2e.py
(test_gpu_job_that_cannot_use_its_gpus_fails_at_once).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctf.compute.cluster.gpus import Grant, check_gpus, granted_gpus
from hpctf.core.errors import UserError
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("gpus", "visible", "per_node", "tasks", "grant"),
    [
        ((), None, 0, 1, Grant(0)),
        (("0", "1"), "0,1", 2, 1, Grant(2, "GPUs 0,1")),
        (("GPU-bb",), "GPU-bb", 2, 2, Grant(1, "GPUs GPU-bb")),
        # No device files: Slurm says NoDevFiles; the run's request is what the task got.
        (
            (),
            "NoDevFiles",
            2,
            1,
            Grant(
                2, "gpus_per_node 2 over 1 task(s) per node; CUDA_VISIBLE_DEVICES=NoDevFiles", False
            ),
        ),
        (
            (),
            "NoDevFiles",
            4,
            2,
            Grant(
                2, "gpus_per_node 4 over 2 task(s) per node; CUDA_VISIBLE_DEVICES=NoDevFiles", False
            ),
        ),
        ((), "NoDevFiles", 0, 1, Grant(0)),
        # CUDA_VISIBLE_DEVICES set empty or unset, nothing requested: no GPUs.
        ((), "", 0, 1, Grant(0)),
    ],
)
def test_granted_gpus(
    gpus: tuple[str, ...], visible: str | None, per_node: int, tasks: int, grant: Grant
) -> None:
    assert granted_gpus(gpus, visible, per_node, tasks) == grant


@pytest.mark.parametrize(
    ("expected", "seen", "cuda"),
    [(0, 0, False), (0, 0, True), (0, 3, True), (1, 1, True), (8, 8, True)],
)
def test_nothing_to_say_when_tensorflow_sees_what_slurm_gave(
    expected: int, seen: int, cuda: bool
) -> None:
    check_gpus(expected, seen, cuda, "2.21.0")


def one_line(**kwargs: Any) -> str:
    with pytest.raises(UserError) as info:
        check_gpus(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_cpu_only_tensorflow_on_a_gpu_task_names_hpctf_gpu() -> None:
    message = one_line(
        expected=2,
        seen=0,
        cuda_build=False,
        tf_version="2.21.0",
        source="GPUs 0,1",
        packages=["tensorflow-cpu"],
    )
    assert message == (
        "Slurm gave this task 2 GPU(s) (GPUs 0,1) but TensorFlow 2.21.0 is a CPU-only build "
        "(tensorflow-cpu) and sees none: install hpctf[gpu] (tensorflow[and-cuda]) in a fresh "
        "environment for the compute nodes (without tensorflow-cpu: the two share files)"
    )


def test_cpu_only_tensorflow_from_another_package() -> None:
    message = one_line(expected=1, seen=0, cuda_build=False, tf_version="2.15.0")
    assert message == (
        "Slurm gave this task 1 GPU(s) but TensorFlow 2.15.0 is a CPU-only build and sees none: "
        "install hpctf[gpu] (tensorflow[and-cuda]) in the compute nodes' environment"
    )


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_cpu_only_tensorflow_on_aarch64_does_not_send_the_user_back_to_pypi(machine: str) -> None:
    # PyPI's tensorflow 2.21.0 aarch64 wheel is built without CUDA (its build_info says
    # is_cuda_build False), also when installed as tensorflow[and-cuda].
    message = one_line(
        expected=4,
        seen=0,
        cuda_build=False,
        tf_version="2.21.0",
        packages=["tensorflow"],
        machine=machine,
    )
    assert "CPU-only build (tensorflow)" in message
    assert "PyPI has no CUDA build of TensorFlow for aarch64 Linux" in message
    assert "install hpctf[gpu]" not in message


def test_gpu_build_that_sees_fewer_gpus_points_at_the_driver() -> None:
    message = one_line(expected=2, seen=0, cuda_build=True, tf_version="2.21.0", source="GPUs 0,1")
    assert message.startswith(
        "Slurm gave this task 2 GPU(s) (GPUs 0,1) but TensorFlow 2.21.0 (a GPU build) sees 0: "
    )
    assert "nvidia-smi" in message


def test_gpu_build_without_device_files_points_at_gres_conf() -> None:
    grant = granted_gpus((), "NoDevFiles", 2, 1)
    message = one_line(
        expected=grant.count,
        seen=0,
        cuda_build=True,
        tf_version="2.21.0",
        source=grant.source,
        device_files=grant.device_files,
    )
    assert "CUDA_VISIBLE_DEVICES=NoDevFiles" in message
    assert "gres.conf has no File=" in message
    assert "resources.gpus_per_node: 0" in message


def test_more_gpus_than_given_is_refused() -> None:
    # SLURM_STEP_GPUS=4,5 but CUDA_VISIBLE_DEVICES unset: TensorFlow takes the whole node.
    message = one_line(expected=2, seen=8, cuda_build=True, tf_version="2.21.0", source="GPUs 4,5")
    assert "sees 8: it would also use GPUs that are not this task's" in message


@pytest.mark.tf
def test_worker_check_with_this_machines_tensorflow() -> None:
    # The venv's TensorFlow (tensorflow-cpu in CI): the glue in hpctf.compute.start.runtime asks it
    # what it is and names the package it came from.
    from hpctf.compute.doctor.node_checks import check_tensorflow_gpus

    check_tensorflow_gpus(Grant(0))
    import tensorflow as tf

    if tf.test.is_built_with_gpu_support():
        pytest.skip("this TensorFlow is a GPU build")
    with pytest.raises(UserError) as info:
        check_tensorflow_gpus(Grant(2, "GPUs 0,1"))
    message = str(info.value)
    assert message.startswith(
        f"Slurm gave this task 2 GPU(s) (GPUs 0,1) but TensorFlow {tf.__version__} is a "
        "CPU-only build ("
    )
    assert "hpctf[gpu]" in message or "aarch64" in message


@pytest.mark.tf
def test_gpu_check_script_runs_tiny_on_cpu(tmp_path: Path) -> None:
    # benchmarks/gpu_check.py is meant for a GPU node; --tiny runs the same two paths (hpctf's
    # worker and the plain script) on CPUs in a minute or two, so the script cannot rot here.
    out = tmp_path / "tiny.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    results = json.loads(out.read_text())
    assert results["hpctf_images_per_s"] > 0
    assert results["plain_images_per_s"] > 0
    assert results["ratio"] > 0
    assert results["precision"] == "mixed_bfloat16"
    assert results["setup"]["communication"] == "ring"
    (hpctf_run,) = results["hpctf_runs"]
    assert hpctf_run["worker_said"] == (
        "1 replicas, 0 GPU(s) on this rank, mixed precision mixed_bfloat16, XLA on"
    )
    assert results["plain_runs"][0]["policy"] == "mixed_bfloat16"
    assert "ratio hpctf/plain" in proc.stdout


@pytest.mark.tf
def test_gpu_first_run_binds_one_gpu_per_worker_and_says_when_tensorflow_sees_none(
    tmp_path: Path,
) -> None:
    # benchmarks/gpu_first_run.py as a user runs it on a GPU node; here (tensorflow-cpu, no
    # GPU) each worker still takes its own GPU by hpctf's binding, the all-reduce runs on RING,
    # and the missing GPUs are the problem it reports.
    out = tmp_path / "first.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_first_run.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = proc.stdout
    assert "worker 0: worker 0 of 2 at localhost:" in said
    assert "; CUDA_VISIBLE_DEVICES=0 (one worker per GPU: split by SLURM_LOCALID" in said
    assert "; CUDA_VISIBLE_DEVICES=1 (one worker per GPU: split by SLURM_LOCALID" in said
    assert "PROBLEM: worker 0 sees 0 GPU(s), not 1" in said
    assert "worker 1: RING all-reduce, 2 ranks,  1,048,576 bytes:" in said
    document = json.loads(out.read_text())
    assert [w["allreduce"]["status"] for w in document["workers"]] == ["ok", "ok"]
    assert said.splitlines()[-1] == "gpu_first_run: 2 problem(s)"
