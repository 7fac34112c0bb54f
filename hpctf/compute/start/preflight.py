"""``hpctf preflight``: what every task of ``hpctf doctor``'s job checks, and writes down.

Each task (started by srun, or as a local process on a local site) runs the node checks of
:mod:`hpctf.compute.doctor.node_checks` (tensorflow, memlock, infiniband, hostnames, port), then
``allreduce``: one all-reduce across all tasks through MultiWorkerMirroredStrategy, made as the
training makes it (:func:`hpctf.compute.cluster.joining.make_strategy`: NCCL on GPUs, RING on CPUs),
at a few message sizes, timed; with NCCL, its log (NCCL_DEBUG=INFO, into a file) scanned for a
fallback to TCP sockets (``nccl``). Each task writes what it found to
``DOCTOR_DIR/results/rank-<N>.json`` (:mod:`hpctf.core.doctor_files`);
:mod:`hpctf.login.doctor.doctor_commands` reads every task's file and judges them together
(versions equal everywhere, every node reported, the site's bandwidth threshold).

The file is written after the checks that need no TensorFlow, again after TensorFlow's, and
last after the all-reduce (``pending`` until then), so a task that hangs or dies still leaves
what it found. Before the all-reduce each task says in ``gate/`` whether it can take part: one
whose own checks failed stays out, and the others, seeing that, skip the collective instead of
waiting for it. A watchdog (faulthandler's, which needs no GIL) bounds the whole task.
Node-wide checks (memlock, infiniband, every node's name) run on the first task of each node
only. TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctf.compute.cluster.gpus import granted_gpus
from hpctf.compute.cluster.spec import ClusterSpec, cluster_spec
from hpctf.compute.doctor.infiniband import read_infiniband
from hpctf.compute.doctor.node_checks import (
    Check,
    node_addresses,
    scan_nccl_log,
    tensorflow_check,
)
from hpctf.compute.start.quick_preflight import before_tensorflow
from hpctf.compute.start.runtime import log_to_stdout, prepare_environment
from hpctf.core.doctor_files import GATE_DIR, NCCL_DIR, RESULTS_DIR, SETTINGS_FILE
from hpctf.core.errors import UserError
from hpctf.core.safe_files import write_atomic
from hpctf.core.settings.config import Site
from hpctf.core.version import VERSION

log = logging.getLogger("hpctf.preflight")


# Message sizes of the all-reduce, in bytes. On CPUs (RING, gRPC) the large sizes measure
# nothing the training depends on and cost seconds on a small node: tiny ones there.
GPU_SIZES = (1 << 10, 1 << 20, 16 << 20, 128 << 20)
CPU_SIZES = (1 << 10, 64 << 10, 1 << 20)
GPU_ITERATIONS = 20
CPU_ITERATIONS = 10
WARMUP = 2

# Checks after whose failure this task does not join the all-reduce: it could not work (no
# TensorFlow, no address, no port), and the cause is already named.
_BLOCKING = ("cluster", "tensorflow", "hostnames", "port")


@dataclass
class Report:
    """What one task writes to ``results/rank-<N>.json``."""

    rank: int | None
    node: str
    local_id: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    allreduce: dict[str, Any] = field(default_factory=lambda: {"status": "pending"})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"


def busbw_gbps(size: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth of one all-reduce of ``size`` bytes over ``ranks`` replicas, in GB/s.

    As nccl-tests defines it (doc/PERFORMANCE.md): the algorithm bandwidth ``size / time``
    times ``2 (n - 1) / n``, which makes it comparable with the links' speed for any n.
    """
    if seconds <= 0 or ranks < 2:
        return 0.0
    return size / seconds * 2 * (ranks - 1) / ranks / 1e9


def allreduce(spec: ClusterSpec, join_timeout: int) -> dict[str, Any]:
    """Time an all-reduce across every task, as the training's strategy makes it.

    Returns ``{"status", "implementation", "ranks", "sizes": [{"bytes", "seconds",
    "busbw_gbps"}]}``; a wrong sum is a failure. Every task runs the same collectives in the
    same order (the sizes depend only on whether GPUs are visible, which the GPU check has
    made the same everywhere).
    """
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    strategy = _preflight_strategy(spec, join_timeout, gpus)
    implementation = "NCCL" if gpus else "RING"  # make_strategy's choice for communication auto
    ranks = int(strategy.num_replicas_in_sync)
    sizes, iterations = (GPU_SIZES, GPU_ITERATIONS) if gpus else (CPU_SIZES, CPU_ITERATIONS)
    reduce = _summing_all_reduce(strategy)

    results = []
    for size in sizes:
        elements = max(1, size // 4)
        got, seconds = _timed(strategy, functools.partial(reduce, elements), iterations)
        if got != float(ranks):
            return {
                "status": "fail",
                "implementation": implementation,
                "ranks": ranks,
                "error": f"wrong sum at {elements * 4} bytes: {got} instead of {ranks}",
            }
        results.append(
            {
                "bytes": elements * 4,
                "seconds": seconds,
                "busbw_gbps": busbw_gbps(elements * 4, seconds, ranks),
            }
        )
        log.info("all-reduce %d bytes: %.3f ms", elements * 4, seconds * 1e3)
    return {"status": "ok", "implementation": implementation, "ranks": ranks, "sizes": results}


def _preflight_strategy(spec: ClusterSpec, join_timeout: int, gpus: int) -> Any:
    """The strategy the training would make on ``gpus`` GPUs (communication auto), every task
    joined within ``join_timeout`` seconds."""
    from hpctf.compute.cluster.joining import configure_failure_detection, make_strategy
    from hpctf.core.settings.train import Train

    settings = Train(
        entry="hpctf.compute.start.preflight:allreduce",
        global_batch_size=1,
        steps=1,
        startup_timeout_seconds=join_timeout,
    )
    configure_failure_detection(spec, settings)
    return make_strategy(gpus, settings)


def _summing_all_reduce(strategy: Any) -> Any:
    """A ``tf.function`` of ``elements``: the all-reduced sum of ones over every replica."""
    import tensorflow as tf

    @tf.function
    def reduce(elements: int) -> Any:
        # The buffer is made inside the replica function: per-replica values made outside it
        # (experimental_distribute_values_from_function) make MWMS's all_reduce fail with
        # "destinations can not be empty" (TF 2.21). Filling it costs far less than reducing.
        def summed() -> Any:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([elements]))

        return strategy.run(summed)

    return reduce


def error_line(exc: BaseException) -> str:
    """One line for an exception: TensorFlow's errors carry the op's message after lines of
    traceback ("in user code:", file lines), so the last line that says something wins."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(("File ", "in user code", "return "))]
    text = (said or lines or [type(exc).__name__])[-1]
    if not re.match(r"^\w+(Error|Exception|Exceeded)\b", text):
        text = f"{type(exc).__name__}: {text}"
    return text[:500]


def _timed(strategy: Any, reduce: Callable[[], Any], iterations: int) -> tuple[float, float]:
    """``reduce`` run WARMUP times, then ``iterations`` times timed: the sum it gave and the
    seconds one took."""
    for _ in range(WARMUP):
        out = reduce()
    _finish(strategy, out)
    start = time.perf_counter()
    for _ in range(iterations):
        out = reduce()
    got = _finish(strategy, out)
    return got, (time.perf_counter() - start) / iterations


def _finish(strategy: Any, out: Any) -> float:
    """Wait for ``out`` on every local replica; the smallest element of any (for the sum)."""
    return min(float(t.numpy().min()) for t in strategy.experimental_local_results(out))


# --- the task ---------------------------------------------------------------------------------


def read_settings(doctor_dir: Path) -> dict[str, Any]:
    """``doctor.json``, written by ``hpctf doctor``: the site and the job's shape."""
    path = doctor_dir / SETTINGS_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the doctor's settings: {exc}") from None
    return data


def _start_watchdog(seconds: float) -> None:
    """End this task after ``seconds``, with every thread's traceback in its log.

    faulthandler's watchdog is a C thread: it fires even while TensorFlow holds the GIL, as it
    does on the first task while that one waits in ``TFE_EnableCollectiveOps`` for a peer that
    never starts (``CoordinationServiceAgent::WaitForAllTasks``, measured with TF 2.21: no
    Python thread ran for over ten minutes, and cluster_register_timeout did not end the wait).
    The report written before the all-reduce then still says ``pending``.
    """
    faulthandler.dump_traceback_later(seconds, exit=True)


def gate_verdict(names: Sequence[str], tasks: int) -> str | None:
    """Whether the all-reduce can run, from the names in the gate directory: None once every
    one of ``tasks`` tasks wrote ``rank-<N>.ok``; why not once one wrote ``rank-<N>.blocked``;
    "" while some have written nothing yet."""
    blocked = sorted(n for n in names if n.endswith(".blocked"))
    if blocked:
        return blocked[0]
    ready = {n for n in names if n.endswith(".ok")}
    return None if len(ready) >= tasks else ""


def wait_for_peers(gate: Path, tasks: int, timeout: float) -> str | None:
    """Wait until every task may join the all-reduce; None when all may, else why not.

    Through files on the doctor directory's (shared) filesystem, not through TensorFlow: a
    peer that failed a check, or never started, would otherwise hold the others in
    MultiWorkerMirroredStrategy's start until their watchdog ends them (see
    :func:`_start_watchdog`). One directory listing per poll, however many tasks.
    """
    deadline = time.monotonic() + timeout
    interval = max(0.5, tasks / 1000)
    while True:
        try:
            names = os.listdir(gate)
        except OSError:
            names = []
        verdict = gate_verdict(names, tasks)
        if verdict is None:
            return None
        if verdict:
            try:
                said = (gate / verdict).read_text(encoding="utf-8").strip()
            except OSError:
                said = "a check failed"
            return f"{said} ({verdict.removesuffix('.blocked')})"
        if time.monotonic() >= deadline:
            ready = {n.removesuffix(".ok") for n in names if n.endswith(".ok")}
            absent = [f"rank-{r}" for r in range(tasks) if f"rank-{r}" not in ready]
            shown = ", ".join(absent[:8]) + (
                f" and {len(absent) - 8} more" if len(absent) > 8 else ""
            )
            return f"{shown} not ready within {timeout:.0f} s (see their logs)"
        time.sleep(interval)


def run_preflight(doctor_dir: Path, env: Mapping[str, str]) -> int:
    """Run every check of this task and write its report; 0 once the report is written."""
    started = time.monotonic()
    log_to_stdout(log, logging.Formatter("%(asctime)s preflight: %(message)s", "%H:%M:%S"))
    settings = read_settings(doctor_dir)
    site = Site.model_validate(settings["site"])
    results = doctor_dir / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    try:
        spec = cluster_spec(env, site.port_range, site.hostname_template)
    except UserError as exc:
        _report_without_cluster(results, env, exc)
        return 0
    report = Report(spec.task_index, spec.node, spec.local_id)
    path = results / f"rank-{spec.task_index}.json"
    timeout = int(settings.get("timeout_s", 300))
    _start_watchdog(max(30.0, timeout * 0.75 - (time.monotonic() - started)))
    log.info("%s", spec.describe())

    nccl_log = _prepare_with_nccl_log(doctor_dir, spec)
    report.facts.update(
        {"python": platform.python_version(), "hpctf": VERSION, "executable": sys.executable}
    )
    image = site.container.image if site.container else None
    report.checks.extend(before_tensorflow(spec, env, node_addresses(spec), image=image))
    write_atomic(path, report.to_json())  # known before importing TensorFlow, in case that hangs
    _tensorflow_stage(report, spec, env, settings)
    write_atomic(path, report.to_json())

    _allreduce_stage(report, path, doctor_dir, spec, timeout, nccl_log)
    log.info("report written: %s", path)
    return 0


def _report_without_cluster(results: Path, env: Mapping[str, str], exc: UserError) -> None:
    """The report of a task whose cluster spec failed (``exc``), named by its rank where
    Slurm gave one: nothing else can be checked."""
    raw_rank = env.get("SLURM_PROCID", "")
    rank = int(raw_rank) if raw_rank.isdigit() else None
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    report = Report(rank, node)
    report.checks.append(Check("cluster", "fail", str(exc)))
    report.allreduce = {"status": "skip", "error": "no cluster spec"}
    name = f"rank-{rank}" if rank is not None else f"unknown-{node}-{os.getpid()}"
    write_atomic(results / f"{name}.json", report.to_json())


def _prepare_with_nccl_log(doctor_dir: Path, spec: ClusterSpec) -> Path:
    """This process's environment prepared as the worker's, NCCL's INFO log asked for in the
    doctor directory; that log's path."""
    nccl_log = doctor_dir / NCCL_DIR / f"rank-{spec.task_index}.log"
    nccl_log.parent.mkdir(parents=True, exist_ok=True)
    prepare_environment(os.environ, spec)
    # Read by NCCL when it initialises, long after this: NCCL_DEBUG_FILE takes %h and %p, so a
    # path with a % in it is cut at that point; the doctor directory's names have none.
    os.environ.update(
        {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(nccl_log)}
    )
    return nccl_log


def _tensorflow_stage(
    report: Report, spec: ClusterSpec, env: Mapping[str, str], settings: Mapping[str, Any]
) -> None:
    """The tensorflow check against the GPUs Slurm gave this task, added to ``report``."""
    try:
        grant = granted_gpus(
            spec.gpus,
            env.get("CUDA_VISIBLE_DEVICES"),
            settings["gpus_per_node"],
            settings["tasks_per_node"],
        )
    except UserError as exc:
        report.checks.append(Check("tensorflow", "fail", str(exc)))
    else:
        check, facts = tensorflow_check(grant)
        report.checks.append(check)
        report.facts.update(facts)


def _allreduce_stage(
    report: Report, path: Path, doctor_dir: Path, spec: ClusterSpec, timeout: int, nccl_log: Path
) -> None:
    """Once every task passed its blocking checks (a gate file each), the all-reduce across
    them and the scan of NCCL's log; the report is rewritten after each."""
    blocked = [c.check for c in report.checks if c.status == "fail" and c.check in _BLOCKING]
    gate = doctor_dir / GATE_DIR
    gate.mkdir(exist_ok=True)
    join_timeout = max(15, min(120, timeout // 4))
    why: str | None = None
    if blocked:
        why = f"{', '.join(blocked)} failed"
        write_atomic(gate / f"rank-{spec.task_index}.blocked", f"{why} on {spec.node}\n")
    else:
        write_atomic(gate / f"rank-{spec.task_index}.ok", "")
        why = wait_for_peers(gate, len(spec.workers), join_timeout)
    if why:
        report.allreduce = {"status": "skip", "error": f"not run: {why}"}
        write_atomic(path, report.to_json())
        log.info("all-reduce not run: %s", why)
        return
    try:
        report.allreduce = allreduce(spec, join_timeout)
    except Exception as exc:  # TensorFlow's errors: a peer that did not join, a network error
        log.warning("all-reduce failed", exc_info=True)
        report.allreduce = {"status": "fail", "error": error_line(exc)}
    if report.facts.get("gpus_seen"):  # NCCL: what the strategy uses where GPUs are visible
        try:
            text = nccl_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        report.checks.append(scan_nccl_log(text, bool(read_infiniband()), str(nccl_log)))
    write_atomic(path, report.to_json())
