"""``hpctf worker``: what runs on every task of the job, before TensorFlow is imported.

Reads the run's frozen config, turns the SLURM environment into a cluster spec
(:func:`hpctf.compute.cluster.cluster_spec`, pure), checks what only this machine can check (the
addresses resolve, this task's port is free), sets TF_CONFIG and CUDA_VISIBLE_DEVICES, checks
that TensorFlow can use the GPUs Slurm gave the task (:mod:`hpctf.compute.gpus`), then hands over to
:mod:`hpctf.compute.training`. TensorFlow is imported only from :func:`run_worker` on, never on the
login path.
"""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import os
import platform
import re
import socket
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from hpctf.compute.cluster import ClusterSpec, cluster_spec
from hpctf.compute.gpus import Grant, check_gpus, granted_gpus
from hpctf.compute.preemption import install_early_handlers
from hpctf.core.errors import UserError
from hpctf.core.rundir import RunDir

log = logging.getLogger("hpctf.worker")


class _RankFormatter(logging.Formatter):
    """``HH:MM:SS rank N: message``, with ``warning:`` before warnings and errors."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"%(asctime)s rank {rank}: %(message)s", datefmt="%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            record.message = f"{record.levelname.lower()}: {record.message}"
        return super().formatMessage(record)


def prepare_environment(env: MutableMapping[str, str], spec: ClusterSpec) -> None:
    """Set what TensorFlow reads at import and strategy creation."""
    env.update(spec.environment())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def check_resolves(name: str, node: str, template: str) -> None:
    """UserError unless ``name`` (``template`` applied to Slurm node ``node``) resolves."""
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.args[-1] if exc.args else exc
        raise UserError(
            f"address {name!r} of node {node} (hostname_template {template!r}) does not "
            f"resolve: {reason}; fix the site's hostname_template"
        ) from None


def check_port_free(host: str, port: int) -> None:
    """UserError naming host and port if something already listens on ``port`` here.

    TensorFlow's gRPC server listens on 0.0.0.0:PORT; on a taken port (even one taken on
    127.0.0.1 only) it fails with just "UNKNOWN: Could not start gRPC server", naming neither
    port nor host (measured with TF 2.21). The test socket binds the same wildcard address and
    is closed again at once (a small race remains; ports come from a window that moves with the
    job id, see :func:`hpctf.compute.cluster.port_window`).
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # gRPC sets SO_REUSEADDR too, so a port in TIME_WAIT from an earlier run is free for it;
        # without the flag such a port would be reported as taken. A listening socket still
        # makes bind fail with EADDRINUSE.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise UserError(
                f"port {port} on {host} is taken ({exc.strerror}): another job or a leftover "
                "process listens there; hpctf picks ports from the site's port_range by job id"
            ) from None
        raise
    finally:
        probe.close()


def startup_checks(spec: ClusterSpec) -> None:
    """What must hold on this machine before TensorFlow starts, or a UserError saying why.

    Each task resolves its own address and the chief's (every worker dials the chief first):
    two lookups per task, so every name in TF_CONFIG is checked by its own task without 4,000
    tasks each resolving 4,000 names.
    """
    check_resolves(spec.host, spec.node, spec.hostname_template)
    if spec.chief_host != spec.host:
        check_resolves(spec.chief_host, spec.nodes[0], spec.hostname_template)
    check_port_free(spec.host, spec.port)


def check_tensorflow_gpus(grant: Grant) -> None:
    """Import TensorFlow and stop with a UserError unless it can use the GPUs of ``grant``.

    Runs after :func:`prepare_environment` (CUDA_VISIBLE_DEVICES is final) and before the
    strategy exists; listing physical devices does not create TensorFlow's context, so MWMS
    still configures the devices afterwards. The decision is :func:`hpctf.compute.gpus.check_gpus`.
    """
    import tensorflow as tf  # the worker imports it next anyway (hpctf.compute.training)

    if not grant.count:
        return
    cuda_build = bool(tf.test.is_built_with_gpu_support())
    seen = len(tf.config.list_physical_devices("GPU")) if cuda_build else 0
    check_gpus(
        grant.count,
        seen,
        cuda_build,
        tf.__version__,
        source=grant.source,
        device_files=grant.device_files,
        packages=_tensorflow_packages() if not cuda_build else (),
        machine=platform.machine(),
    )


def _tensorflow_packages() -> tuple[str, ...]:
    """The installed distributions that provide the ``tensorflow`` module (for messages)."""
    try:
        names = importlib.metadata.packages_distributions().get("tensorflow", [])
    except Exception:  # metadata of some unrelated package is broken: say nothing
        return ()
    # As PEP 503 normalizes them: the wheel's metadata says tensorflow_cpu.
    return tuple(sorted({re.sub(r"[-_.]+", "-", name).lower() for name in names}))


def run_worker(run_dir: Path, env: Mapping[str, str]) -> int:
    """Train this task's share of the run; return the process exit code."""
    run = RunDir(run_dir.resolve())
    config = run.load_config()
    spec = cluster_spec(env, config.site.port_range, config.site.hostname_template)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_RankFormatter(spec.task_index))
    hpctf_logger = logging.getLogger("hpctf")
    hpctf_logger.handlers[:] = [handler]
    hpctf_logger.setLevel(logging.INFO)
    hpctf_logger.propagate = False  # TF (absl) installs a root handler; do not print twice
    # TF's Python logger reports every collective it builds at INFO: keep rank logs readable.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    log.info(
        "host %s pid %d (SLURMD_NODENAME %s) SLURM_PROCID %s: %s",
        socket.gethostname(),
        os.getpid(),
        env.get("SLURMD_NODENAME", "-"),
        env.get("SLURM_PROCID"),
        spec.describe(),
    )
    if spec.is_chief:  # one copy of the list is enough (32,000 entries at 4,000 nodes x 8 GPUs)
        log.info("workers %s", ",".join(spec.workers))
    if run.done.exists():
        log.info("run already complete (%s exists); nothing to do", run.done)
        return 0
    quick = config.experiment.train.preflight == "quick"
    if quick:
        from hpctf.compute import quick_preflight  # imports this module: not at the top

        if (failed := quick_preflight.check_node(run, spec, env)) is not None:
            return failed
    else:
        startup_checks(spec)
    install_early_handlers()
    prepare_environment(os.environ, spec)
    sys.path[:0] = config.experiment.train.python_path
    grant = granted_gpus(
        spec.gpus,
        env.get("CUDA_VISIBLE_DEVICES"),
        config.gpus_per_node,
        config.experiment.resources.tasks_per_node,
    )
    if not quick:
        check_tensorflow_gpus(grant)
    elif (failed := quick_preflight.check_tensorflow(run, spec, grant)) is not None:
        return failed

    from hpctf.compute import training  # TensorFlow is imported here and nowhere on the login path.

    return training.train(config, run, spec)
