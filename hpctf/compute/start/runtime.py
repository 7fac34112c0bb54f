"""``hpctf worker``: what runs on every task of the job, before TensorFlow is imported.

Reads the run's frozen config, turns the SLURM environment into a cluster spec
(:func:`hpctf.compute.cluster.spec.cluster_spec`, pure), checks what only this machine can check
(the addresses resolve, this task's port is free), sets TF_CONFIG and CUDA_VISIBLE_DEVICES, checks
that TensorFlow can use the GPUs Slurm gave the task (:mod:`hpctf.compute.cluster.gpus`), then hands
over to
:mod:`hpctf.compute.loop.training`. TensorFlow is imported only from :func:`run_worker` on, never
on the login path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path

from hpctf.compute.cluster.gpus import granted_gpus
from hpctf.compute.cluster.peers import PeerLost
from hpctf.compute.cluster.spec import ClusterSpec, cluster_spec
from hpctf.compute.doctor.node_checks import check_port_free, check_tensorflow_gpus
from hpctf.compute.loop.preemption import install_early_handlers
from hpctf.compute.process import startup_clock
from hpctf.compute.process.launcher_watch import launcher_ended, watch_launcher
from hpctf.compute.process.redacted_output import redact_standard_streams
from hpctf.compute.process.worker_tmp import use_own_tmp
from hpctf.compute.script.entry import keras_environment, run_script
from hpctf.compute.start import quick_preflight
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import journal
from hpctf.core.run.history import record_end_read
from hpctf.core.run.run_identity import check_not_a_copy
from hpctf.core.run.rundir import RunDir
from hpctf.core.secrets import redact, secret_env
from hpctf.core.settings.config import ResolvedConfig

log = logging.getLogger("hpctf.worker")


class _RankFormatter(logging.Formatter):
    """``HH:MM:SS rank N: message``, with ``warning:`` before warnings and errors."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"%(asctime)s rank {rank}: %(message)s", datefmt="%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            record.message = f"{record.levelname.lower()}: {record.message}"
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        # A tracker's error quotes its URL, an exception's line may quote a token: the rank
        # log may be read by others (hpctf.core.secrets, the run's secrets are remembered
        # when its config is read).
        return redact(super().format(record))


def log_to_stdout(logger: logging.Logger, formatter: logging.Formatter) -> None:
    """``logger``'s records at INFO and above to stdout (the rank log), in ``formatter``'s
    form, and nowhere else: TF (absl) installs a root handler, so they are not propagated to
    it to be printed twice."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


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


def _say_who(spec: ClusterSpec, env: Mapping[str, str]) -> None:
    """The rank log's first lines: this rank, its host and the cluster it joins."""
    log_to_stdout(logging.getLogger("hpctf"), _RankFormatter(spec.task_index))
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


def _prepare_node(
    config: ResolvedConfig, run: RunDir, spec: ClusterSpec, env: Mapping[str, str]
) -> int | None:
    """The node's checks (quick or full), the process's environment and path, TensorFlow
    imported and its GPUs checked; an exit code when a check failed, else None."""
    quick = config.experiment.train.preflight == "quick"
    if quick:
        image = config.site.container.image if config.site.container else None
        if (failed := quick_preflight.check_node(run, spec, env, image)) is not None:
            return failed
    else:
        startup_checks(spec)
    startup_clock.mark("node checks")
    install_early_handlers()
    use_own_tmp(spec.task_index)  # before TensorFlow writes any autograph source
    prepare_environment(os.environ, spec)
    # The snapshot is read-only (hpctf.core.run.snapshot.seal): no __pycache__ written into it
    # either, which under umask 002 would be a group-writable place for bytecode it then runs.
    sys.dont_write_bytecode = True
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
    startup_clock.mark("tensorflow import")
    return None


@contextlib.contextmanager
def _refusal_recorded(run: RunDir, spec: ClusterSpec) -> Iterator[None]:
    """A UserError that stops the training (a fit without the steps of an epoch, a Task that
    returns no hpctf.Task, ...) recorded in the journal as the start's one-line reason, as an
    exception of the user's code is: ``hpctf status`` says it (not only ``failed (exit 2)``)
    and no requeue retries it; a lost peer recorded as the start's cause. Every rank that
    raised records; the error leaves as it came."""
    try:
        yield
    except PeerLost as exc:
        # Why this start ends is another rank's loss: the history types the restart's cause
        # from it (a lost peer, not a crash of this rank's code).
        with contextlib.suppress(EnvironmentProblem):  # the journal's disk may be full
            journal.record_peer_lost(run, spec.journal_job, spec.node, spec.task_index, str(exc))
        raise
    except UserError as exc:
        # The journal is readable by others: its records are redacted of the run's secrets.
        line = str(exc)
        with contextlib.suppress(EnvironmentProblem):  # the journal's disk may be full
            journal.record_user_code_failed(
                run, spec.journal_job, spec.node, spec.task_index, "UserError", None, line
            )
        raise


def run_worker(run_dir: Path, env: Mapping[str, str]) -> int:
    """Train this task's share of the run; return the process exit code."""
    startup_clock.mark("python+hpctf")
    run = RunDir(run_dir.resolve())
    check_not_a_copy(run)
    config = run.load_config()
    # The run's secret env: values, read from secrets.env (0600) with the config, for the
    # user's code in this process and what it starts; never in this process's environment at
    # exec (/proc/PID/environ), which the batch script and the local launcher leave them out of.
    os.environ.update(secret_env({**config.site.env, **config.experiment.env}))
    redact_standard_streams()  # the user's prints too: the rank log may be read by others
    spec = cluster_spec(env, config.site.port_range, config.site.hostname_template)
    _say_who(spec, env)
    # A local launcher's workers end with it (under Slurm, srun and slurmstepd see to it).
    watch_launcher(env)
    if run.done.exists():
        log.info("run already complete (%s exists); nothing to do", run.done)
        return 0
    os.environ.update(keras_environment(config.experiment.train))  # before TF is imported
    startup_clock.mark("config")
    if (failed := _prepare_node(config, run, spec, env)) is not None:
        return failed
    with _refusal_recorded(run, spec):
        if config.experiment.train.script is not None:
            return run_script(config, run, spec)
        # TensorFlow is imported here and nowhere on the login path.
        from hpctf.compute.loop import training

        startup_clock.mark("keras and hpctf loop import")
        status = training.train(config, run, spec)
    if spec.is_chief and launcher_ended():  # nobody else is left to say how the start ended
        reason = record_end_read(run, spec.journal_job, status, config.site.preemption.signal)
        log.warning("the launcher is gone: recorded the end of this start (%s)", reason)
    return status
