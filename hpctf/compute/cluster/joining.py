"""Connecting a rank to the run's cluster: TF's coordination service with the run's timeouts,
the strategy, and the process-wide settings a training needs (mixed precision, the seed).

:func:`connect` is the first half of a training session; :mod:`hpctf.compute.loop.session` is the
rest. ``hpctf doctor``'s all-reduce (:mod:`hpctf.compute.start.preflight`) joins the same way.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import sys
from typing import Any

import keras
import tensorflow as tf

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat import probe, tensorflow_internals
from hpctf.core.errors import EnvironmentProblem, UserError, one_line
from hpctf.core.settings.replicas import batch_split_problem
from hpctf.core.settings.train import Train

log = logging.getLogger("hpctf.worker")


def configure_failure_detection(spec: ClusterSpec, settings: Train) -> str | None:
    """Bound how long a dead or frozen peer can hold the others; None when done, else why not
    (then TensorFlow's default timeouts hold: :mod:`hpctf.compute.compat.tensorflow_internals`).

    MultiWorkerMirroredStrategy configures TF's coordination service with default timeouts
    only when none is configured yet (tensorflow/python/distribute/
    collective_all_reduce_strategy.py, ``_initialize_multi_worker``), and offers no public knob,
    so the same configuration is made here first, with the run's timeouts.
    """
    return tensorflow_internals.configure_coordination_service(
        workers=len(spec.workers),
        heartbeat_ms=settings.heartbeat_timeout_seconds * 1000,
        register_ms=settings.startup_timeout_seconds * 1000,
        # Every rank waits for the others at exit, so the leader (rank 0) does not vanish
        # while a peer still sends heartbeats to it.
        shutdown_ms=settings.heartbeat_timeout_seconds * 1000,
    )


def make_strategy(gpus: int, settings: Train) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS over NCCL when this task sees GPUs, RING otherwise, unless the config says which.

    No ``timeout_seconds`` in the options: on RING each collective then leaves a thread behind
    until its timeout, and a run dies after a few thousand steps. A stuck rank is bounded by
    :class:`hpctf.compute.loop.watchdog.ProgressWatchdog` instead.
    """
    implementations = tf.distribute.experimental.CommunicationImplementation
    choice = settings.communication
    if choice == "auto":
        choice = "nccl" if gpus else "ring"
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementations.NCCL if choice == "nccl" else implementations.RING,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def precision_policy(enabled: bool, gpus: int) -> str | None:
    """The Keras mixed-precision policy for ``train.mixed_precision``: float16 where GPUs
    compute (tensor cores), bfloat16 on CPUs; None when off."""
    if not enabled:
        return None
    return "mixed_float16" if gpus else "mixed_bfloat16"


@dataclasses.dataclass(frozen=True)
class Connection:
    """A rank joined to the cluster: the strategy, the GPUs this rank computes on, the Keras
    precision policy in force (None: float32)."""

    strategy: Any
    gpus: int
    precision_policy: str | None


def connect(settings: Train, spec: ClusterSpec) -> Connection:
    """Join every rank of ``spec`` under one strategy; set the precision policy and the seed.

    Raises EnvironmentProblem (exit 3) naming this rank, the chief and the settings when the
    strategy cannot be made (a peer unreachable, a port taken), and UserError when the global
    batch does not split over the replicas the strategy
    made: the login side checked the replicas it could count, but only here is it known how
    many GPUs each task computes on (a local site, a NoDevFiles grant).
    """
    gpus = len(tf.config.list_physical_devices("GPU"))
    policy = precision_policy(settings.mixed_precision, gpus)
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    log.info("%s", probe.line(probe.probe()))
    if (why := configure_failure_detection(spec, settings)) is not None:
        log.warning("failure detection with TensorFlow's default timeouts: %s", why)
    # Joining waits in C++ for every task (CoordinationServiceAgent::WaitForAllTasks) while
    # holding the GIL: when a peer never starts, neither cluster_register_timeout nor a
    # Python thread ends the wait (seen under gdb, TF 2.21). faulthandler's own C thread
    # does: it prints every thread's stack and exits 1.
    startup = settings.startup_timeout_seconds
    log.info("joining %d worker(s); each must start within %d s", len(spec.workers), startup)
    faulthandler.dump_traceback_later(startup, exit=True, file=sys.stdout)
    try:
        strategy = make_strategy(gpus, settings)
    except (tf.errors.OpError, RuntimeError, ValueError) as exc:
        # The cluster, not hpctf: a peer that is unreachable or refused, a port taken, a
        # TF_CONFIG TensorFlow would not take. Exit 3 naming whom this rank tried to join.
        raise EnvironmentProblem(
            f"rank {spec.task_index} ({spec.workers[spec.task_index]}) could not join the "
            f"cluster of {len(spec.workers)} worker(s), chief {spec.workers[0]} (settings: "
            f"train.startup_timeout_seconds={startup}, train.communication="
            f"{settings.communication}): {type(exc).__name__}: {one_line(str(exc))}"
        ) from exc
    finally:
        faulthandler.cancel_dump_traceback_later()
    replicas = strategy.num_replicas_in_sync
    batch = settings.global_batch_size
    if batch and (problem := batch_split_problem(batch, replicas)):
        raise UserError(f"train.global_batch_size {problem}")
    log.info(
        "%d replicas, %d GPU(s) on this rank, mixed precision %s, XLA %s",
        replicas,
        gpus,
        policy or "off",
        "on" if settings.jit_compile else "off",
    )
    keras.utils.set_random_seed(settings.seed)
    return Connection(strategy, gpus, policy)


def with_loss_scaling(optimizer: Any, policy: str | None) -> Any:
    """``optimizer`` wrapped in Keras's dynamic loss scaling when ``policy`` computes in
    float16, whose small gradients underflow to zero without it; unchanged otherwise.

    Keras 3 applies no loss scaling by itself: a plain optimizer's ``scale_loss`` is the
    identity (keras.io/api/mixed_precision/loss_scale_optimizer). bfloat16 has float32's
    exponent range and needs none.
    """
    if policy != "mixed_float16" or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)
