"""``hpctf worker``: what runs on every task of the job, before TensorFlow is imported.

Reads the run's frozen config, turns the SLURM environment into TF_CONFIG, then hands over to
:mod:`hpctf.training`, the only module that imports TensorFlow.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from hpctf.cluster import cluster_spec
from hpctf.rundir import RunDir

log = logging.getLogger("hpctf.worker")


class _RankFormatter(logging.Formatter):
    """``HH:MM:SS rank N: message``, with ``warning:`` before warnings and errors."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"%(asctime)s rank {rank}: %(message)s", datefmt="%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            record.message = f"{record.levelname.lower()}: {record.message}"
        return super().formatMessage(record)


def prepare_environment(env: MutableMapping[str, str], tf_config: str) -> None:
    """Set what TensorFlow reads at import and strategy creation."""
    env["TF_CONFIG"] = tf_config
    # PreemptionCheckpointHandler probes the GCE metadata server at construction (5 s timeout
    # off GCE); a closed loopback port makes the probe fail at once.
    env.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def run_worker(run_dir: Path, env: Mapping[str, str]) -> int:
    """Train this task's share of the run; return the process exit code."""
    run = RunDir(run_dir.resolve())
    config = run.load_config()
    spec = cluster_spec(env, config.site.port_range)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_RankFormatter(spec.task_index))
    hpctf_logger = logging.getLogger("hpctf")
    hpctf_logger.handlers[:] = [handler]
    hpctf_logger.setLevel(logging.INFO)
    hpctf_logger.propagate = False  # TF (absl) installs a root handler; do not print twice
    log.info(
        "host %s (SLURMD_NODENAME %s) SLURM_PROCID %s: worker %d of %d; workers %s",
        socket.gethostname(),
        env.get("SLURMD_NODENAME", "-"),
        env.get("SLURM_PROCID"),
        spec.task_index,
        len(spec.workers),
        ",".join(spec.workers),
    )
    if run.done.exists():
        log.info("run already complete (%s exists); nothing to do", run.done)
        return 0
    prepare_environment(os.environ, spec.tf_config())
    sys.path[:0] = config.experiment.train.python_path

    from hpctf import training  # TensorFlow is imported here and nowhere on the login path.

    return training.train(config, run, spec)
