"""SLURM env -> TF_CONFIG at 4,000 nodes: hpctf's cluster_spec beside TF's SlurmClusterResolver.

    .venv/bin/python benchmarks/bench_tfconfig.py [--repeat 50]

For each layout this builds the environment srun gives one task (SLURM_STEP_NODELIST,
SLURM_STEP_TASKS_PER_NODE, SLURM_PROCID, ...), times the resolution in-process (median and
worst of --repeat runs after one warm-up; imports not counted) and checks the answer against
the truth: the nodelist as ``scontrol show hostnames`` expands it (python-hostlist when scontrol
is missing), ranks laid out in blocks as hpctf's srun line asks. TF's resolver gets a fair
environment: gpus_per_node given (so it does not run nvidia-smi) and a fake ``scontrol`` first
on PATH that records whether it was called. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import hostlist

from hpctf.compute.cluster.spec import cluster_spec

PORTS = (20000, 30000)
SCONTROL = shutil.which("scontrol")  # the real one, before the fake goes first on PATH


def layouts() -> dict[str, tuple[list[str], int]]:
    """Name -> (hosts in Slurm's order, tasks per node). 4,000 nodes each."""
    # Zero-padded names with holes (drained nodes): string order happens to be Slurm's order.
    padded = [f"gpu{i:04d}" for i in range(1, 4200) if i % 21][:4000]
    # Unpadded rack/node names (r1n1 ... r40n100), common on HPE/SGI-style clusters: string
    # order puts r10n1 first.
    racks = [f"r{r}n{n}" for r in range(1, 41) for n in range(1, 101)]
    return {
        "gpu0001..gpu4199 with holes, 1 task/node": (padded, 1),
        "r1n1..r40n100, 1 task/node": (racks, 1),
        "r1n1..r40n100, 8 tasks/node (32,000 workers)": (racks, 8),
    }


def scontrol(*args: str) -> list[str] | None:
    """``scontrol ARGS`` with a throwaway config (no daemon needed); None without scontrol."""
    if not SCONTROL:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "slurm.conf"
        conf.write_text("ClusterName=bench\nSlurmctldHost=localhost\n")
        return subprocess.run(
            [SCONTROL, *args],
            env={**os.environ, "SLURM_CONF": str(conf)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()


def nodelist(hosts: list[str]) -> str:
    """SLURM_JOB_NODELIST as Slurm writes it (``scontrol show hostlist``)."""
    compressed = scontrol("show", "hostlist", ",".join(hosts))
    return compressed[0] if compressed else str(hostlist.collect_hostlist(hosts))


def truth(text: str, tasks_per_node: int) -> list[str]:
    """Hosts per rank as Slurm sees them: scontrol's expansion, block layout."""
    hosts = scontrol("show", "hostnames", text) or hostlist.expand_hostlist(text)
    return [host for host in hosts for _ in range(tasks_per_node)]


def task_env(hosts_text: str, nodes: int, tasks_per_node: int, rank: int) -> dict[str, str]:
    ntasks = nodes * tasks_per_node
    first_node = rank // tasks_per_node
    return {
        "SLURM_JOB_ID": "4242424",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": hosts_text,
        "SLURM_STEP_NODELIST": hosts_text,
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % tasks_per_node),
        "SLURM_NODEID": str(first_node),
        "SLURM_DISTRIBUTION": "block:block",
    }


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, object]:
    result = fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times), result


def fake_scontrol(directory: Path) -> Path:
    record = directory / "scontrol-calls"
    script = directory / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\nexec {SCONTROL or "false"} "$@"\n')
    script.chmod(0o755)
    return record


def scale_layouts(sizes: list[int], tasks: list[int]) -> list[tuple[str, list[str], int]]:
    """For ``benchmarks/run.py``: (names, hosts in Slurm's order, tasks per node) for every
    size and tasks per node, in two naming styles: unpadded ``node1..nodeN`` (Slurm's
    ``node[1-N]``; string order puts node10 before node2) and zero-padded ``gpu00001..`` with
    holes (every 21st node drained; string order is Slurm's order)."""
    rows = []
    for nodes in sizes:
        unpadded = [f"node{i}" for i in range(1, nodes + 1)]
        padded = [f"gpu{i:05d}" for i in range(1, 2 * nodes + 2) if i % 21][:nodes]
        for per_node in tasks:
            rows.append(("node1..nodeN", unpadded, per_node))
            rows.append(("gpu00001.. with holes", padded, per_node))
    return rows


def measure(
    hosts: list[str], per_node: int, repeat: int, resolver: type | None
) -> dict[str, object]:
    """Time hpctf (rank 0 and the last rank) and TF's resolver (rank 0, unless ``resolver`` is
    None) on the environment of one task; check each answer against Slurm's order."""
    text = nodelist(hosts)
    expected = truth(text, per_node)
    assert len(expected) == len(hosts) * per_node
    result: dict[str, object] = {
        "nodes": len(hosts),
        "tasks_per_node": per_node,
        "workers": len(expected),
        "nodelist": text,
    }
    ours: dict[str, object] = {"right": True, "unique": True}
    for rank in (0, len(expected) - 1):
        env = task_env(text, len(hosts), per_node, rank)
        env["SLURMD_NODENAME"] = expected[rank]
        median, worst, spec = timed(lambda env=env: cluster_spec(env, PORTS).tf_config(), repeat)
        config = json.loads(str(spec))
        workers = [w.rpartition(":")[0] for w in config["cluster"]["worker"]]
        ours[f"rank{'0' if rank == 0 else '_last'}_median_ms"] = round(median, 3)
        ours[f"rank{'0' if rank == 0 else '_last'}_worst_ms"] = round(worst, 3)
        ours["right"] = bool(ours["right"]) and (
            workers == expected and config["task"]["index"] == rank
        )
        ours["unique"] = bool(ours["unique"]) and len(set(config["cluster"]["worker"])) == len(
            expected
        )
    ours["median_ms"] = ours["rank0_median_ms"]
    result["hpctf"] = ours
    if resolver is None:
        return result
    os.environ.update(task_env(text, len(hosts), per_node, 0))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)

    def tf_resolve() -> str:
        assert resolver is not None
        instance = resolver(gpus_per_node=8, auto_set_gpu=True)
        spec = instance.cluster_spec().as_dict()
        task_type, task_id = instance.get_task_info()
        return json.dumps({"cluster": spec, "task": {"type": task_type, "index": task_id}})

    try:
        median, worst, answer = timed(tf_resolve, max(3, repeat // 5))
    except Exception as exc:  # report, do not hide, whatever TF raises
        result["tf"] = {"error": f"{type(exc).__name__}: {exc}"}
        return result
    config = json.loads(str(answer))
    theirs = [w.rpartition(":")[0] for w in config["cluster"]["worker"]]
    wrong = sum(a != b for a, b in zip(theirs, expected, strict=True))
    ports = sorted({w.rpartition(":")[2] for w in config["cluster"]["worker"]})
    result["tf"] = {
        "median_ms": round(median, 3),
        "worst_ms": round(worst, 3),
        "right": wrong == 0 and config["task"]["index"] == 0,
        "wrong_ranks": wrong,
        "rank0_address": config["cluster"]["worker"][0],
        "ports": ports[:4] + (["..."] if len(ports) > 4 else []),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--no-tf", action="store_true", help="skip TF's resolver")
    parser.add_argument(
        "--scale",
        help="comma-separated node counts (benchmarks/run.py: 10,1000,4000,10000) instead of "
        "the three 4,000-node layouts",
    )
    parser.add_argument("--tasks", default="1,4", help="with --scale: tasks per node")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()

    start = time.perf_counter()
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        SlurmClusterResolver,
    )

    tf_import = time.perf_counter() - start
    print(f"python {sys.version.split()[0]}; import of TF's resolver took {tf_import:.1f} s")
    tmp = Path(tempfile.mkdtemp(prefix="bench-tfconfig-"))
    record = fake_scontrol(tmp)
    os.environ["PATH"] = f"{tmp}{os.pathsep}{os.environ['PATH']}"

    if args.scale:
        sizes = [int(n) for n in args.scale.split(",")]
        tasks = [int(n) for n in args.tasks.split(",")]
        cases = scale_layouts(sizes, tasks)
    else:
        cases = [(name, hosts, per_node) for name, (hosts, per_node) in layouts().items()]
    rows = []
    for name, hosts, per_node in cases:
        resolver = None if args.no_tf else SlurmClusterResolver
        row = {"names": name, **measure(hosts, per_node, args.repeat, resolver)}
        rows.append(row)
        ours, theirs = row["hpctf"], row.get("tf")
        assert isinstance(ours, dict)
        text = str(row["nodelist"])
        shown = text[:60] + ("..." if len(text) > 60 else "")
        print(f"\n== {name}: {len(hosts)} nodes x {per_node} tasks: {shown}")
        print(
            f"   hpctf cluster_spec: rank 0 median {ours['rank0_median_ms']:.2f} ms (worst "
            f"{ours['rank0_worst_ms']:.2f}), last rank median {ours['rank_last_median_ms']:.2f} "
            f"ms; order right: {ours['right']}; (host, port) unique: {ours['unique']}"
        )
        if not isinstance(theirs, dict):
            continue
        if "error" in theirs:
            print(f"   TF SlurmClusterResolver: failed: {theirs['error']}")
            continue
        print(
            f"   TF SlurmClusterResolver, rank 0: median {theirs['median_ms']:.2f} ms, worst "
            f"{theirs['worst_ms']:.2f} ms; rank 0 address {theirs['rank0_address']}; "
            f"{theirs['wrong_ranks']} of {row['workers']} ranks on the wrong host; ports used: "
            f"{', '.join(theirs['ports'])}; CUDA_VISIBLE_DEVICES set to "
            f"{theirs['cuda_visible_devices']!r}"
        )
    called = bool(record.exists() and record.read_text().strip())
    print(f"\nTF's resolver called scontrol: {'yes' if called else 'no'}")
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "tf_called_scontrol": called}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
