"""First run on a GPU node: what the node shows, and an NCCL all-reduce over 2 workers, each
bound to its own GPU by hpctf's own code. Run it on one GPU node (inside an allocation, or on a
node you may use), from the project's virtualenv with a CUDA TensorFlow:

    .venv/bin/python benchmarks/gpu_first_run.py [--json gpu-first-run.json]

1. Visibility: ``nvidia-smi -L``, CUDA_VISIBLE_DEVICES, TensorFlow's version, whether it is a
   CUDA build (and its CUDA/cuDNN), the GPUs it lists, and the node's NCCL-relevant names (the
   interfaces and HCAs hpctf's preflight reads).
2. Two workers on this node, started as Slurm would start 2 tasks of one step that were not
   bound (``--gpu-bind=none``: every task sees GPUs 0,1): each takes its GPU through
   :func:`hpctf.compute.cluster.gpu_bind.gpu_binding`, joins MultiWorkerMirroredStrategy with
   NCCL, and times hpctf doctor's all-reduce (1 KiB to 128 MiB; bus bandwidth as nccl-tests
   defines it). Each worker reports the GPU it saw; two workers on one GPU fail the run.

``--cpu`` hides the GPUs (RING over gRPC, small sizes): how CI checks the script itself. The
exit status is 0 when both workers agreed and each saw exactly one GPU (or none with --cpu).
Send back the whole output and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def step_env(rank: int, port: int, cpu: bool) -> dict[str, str]:
    """Task ``rank`` of a 2-task step on this node, as Slurm 22.05 sets it under
    --gpus-per-node=2 --gpu-bind=none (plus CUDA_VISIBLE_DEVICES=0,1, as a site without
    that Slurm quirk sets it)."""
    env = {
        **os.environ,
        "SLURM_JOB_ID": str(port),  # the port window moves with the job id
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURMD_TRES_BIND": "gpu:none",
        "CUDA_VISIBLE_DEVICES": "" if cpu else "0,1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if cpu:
        env["SLURMD_TRES_BIND"] = ""
    return env


def visibility() -> dict[str, Any]:
    """What the node and this Python show, before any worker starts."""
    facts: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        facts["nvidia_smi"] = (smi.stdout or smi.stderr).strip().splitlines()
    else:
        facts["nvidia_smi"] = "not on PATH"
    from hpctf.compute.doctor.infiniband import read_infiniband
    from hpctf.compute.doctor.nccl_env import read_interfaces

    interfaces = read_interfaces()
    ports = read_infiniband()
    facts["interfaces"] = [i.name for i in interfaces or []]
    facts["infiniband"] = [
        f"{p.name} {p.state} {p.rate} {p.link_layer}".strip() for p in ports or []
    ]
    facts["NCCL_SOCKET_IFNAME"] = os.environ.get("NCCL_SOCKET_IFNAME")
    facts["NCCL_IB_HCA"] = os.environ.get("NCCL_IB_HCA")
    return facts


def child(rank: int, port_low: int) -> int:
    """One worker: bind its GPU as hpctf does, then doctor's all-reduce; one JSON line."""
    from hpctf.compute.cluster.spec import cluster_spec
    from hpctf.compute.start.preflight import allreduce
    from hpctf.compute.start.runtime import prepare_environment

    spec = cluster_spec(os.environ, (port_low, port_low + 100))
    prepare_environment(os.environ, spec)
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    seen = [d.name for d in tf.config.list_physical_devices("GPU")]
    result = {
        "rank": rank,
        "binding": spec.describe(),
        "tensorflow": tf.__version__,
        "cuda_build": bool(build.get("is_cuda_build")),
        "cuda": build.get("cuda_version"),
        "cudnn": build.get("cudnn_version"),
        "gpus_seen": seen,
        "allreduce": allreduce(spec, 120),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write everything here")
    parser.add_argument("--cpu", action="store_true", help="hide the GPUs (checks the script)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.port)

    facts = visibility()
    for key, value in facts.items():
        print(f"{key}: {value}")
    port = free_port() // 2 + 10000  # a window of 100 ports; the job id moves it within
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(rank), "--port", str(port)],
            env=step_env(rank, port, args.cpu),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    results, logs = [], []
    for worker in workers:
        try:
            out, _ = worker.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
        logs.append(out)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        results.append(json.loads(lines[-1][len("RESULT ") :]) if lines else None)

    problems = []
    for rank, (result, log) in enumerate(zip(results, logs, strict=True)):
        if result is None:
            tail = "\n".join(log.strip().splitlines()[-15:])
            problems.append(f"worker {rank} reported nothing; its last lines:\n{tail}")
            continue
        print(f"worker {rank}: {result['binding']}")
        print(
            f"worker {rank}: TensorFlow {result['tensorflow']} (CUDA build: "
            f"{result['cuda_build']}, CUDA {result['cuda']}, cuDNN {result['cudnn']}) sees "
            f"{len(result['gpus_seen'])} GPU(s)"
        )
        expected = 0 if args.cpu else 1
        if len(result["gpus_seen"]) != expected:
            problems.append(f"worker {rank} sees {len(result['gpus_seen'])} GPU(s), not {expected}")
        reduced = result["allreduce"]
        if reduced.get("status") != "ok":
            problems.append(f"worker {rank}: all-reduce {reduced.get('status')}: {reduced}")
            continue
        for size in reduced["sizes"]:
            print(
                f"worker {rank}: {reduced['implementation']} all-reduce, {reduced['ranks']} ranks, "
                f"{size['bytes']:>10,} bytes: {size['seconds'] * 1e3:8.3f} ms, "
                f"busbw {size['busbw_gbps']:7.2f} GB/s"
            )
    if args.json:
        document = {"facts": facts, "workers": results, "problems": problems}
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("gpu_first_run: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
