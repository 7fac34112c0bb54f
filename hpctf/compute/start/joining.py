"""Connecting a rank to the run's cluster: TF's coordination service with the run's timeouts,
the strategy, and the process-wide settings a training needs (mixed precision, the seed).

:func:`connect` is the first half of a training session; :mod:`hpctf.compute.loop.session` is the
rest. ``hpctf doctor``'s all-reduce (:mod:`hpctf.compute.doctor.preflight`) joins the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import logging
import sys
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from hpctf.compute.start.cluster import ClusterSpec
from hpctf.core.errors import UserError
from hpctf.core.settings.config import Train
from hpctf.core.settings.replicas import batch_split_problem

log = logging.getLogger("hpctf.worker")


def configure_failure_detection(spec: ClusterSpec, settings: Train) -> None:
    """Bound how long a dead or frozen peer can hold the others.

    MultiWorkerMirroredStrategy configures TF's coordination service with default timeouts
    only when none is configured yet (tensorflow/python/distribute/
    collective_all_reduce_strategy.py, ``_initialize_multi_worker``), and offers no public knob,
    so the same configuration is made here first, with the run's timeouts.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context  # no public API for these settings

    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader="/job:worker/replica:0/task:0",
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=len(spec.workers))
        ],
        heartbeat_timeout_in_ms=settings.heartbeat_timeout_seconds * 1000,
        cluster_register_timeout_in_ms=settings.startup_timeout_seconds * 1000,
        # Every rank waits for the others at exit, so the leader (rank 0) does not vanish
        # while a peer still sends heartbeats to it.
        shutdown_barrier_timeout_in_ms=settings.heartbeat_timeout_seconds * 1000,
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


@contextlib.contextmanager
def fixed_instance_keys() -> Iterator[None]:
    """Collectives traced inside get their instance keys once, at trace time, instead of a new
    key at every call of the ``tf.function``. Use it inside the Python body of a
    ``tf.function`` traced exactly once and at the same point on every rank (a fixed input
    signature, called in the same order everywhere), so that the keys agree. The switch is
    process-wide while the block runs: trace in the thread that trains.

    Why: MWMS gives each collective in a ``tf.function`` a new instance key per call
    (``CollectiveReplicaLauncher._next_instance_key``, ``capture_call_time_value``), and the
    C++ side keeps state for every key it has seen. Measured on 2 RING workers (a plain MWMS
    loop, 4,000 steps): RSS +3.4 MB per 1,000 steps with per-call keys, malloc's in-use bytes
    growing alike (so not fragmentation: ``malloc_trim`` and ``MALLOC_ARENA_MAX=2`` changed
    nothing), +0.04 with the keys fixed, and bit-identical weights after 2,000 steps
    (tensorflow/tensorflow#42616, #44688). The flag is private: without it nothing changes.
    A per-call key is what lets TF cancel one collective alone; hpctf bounds stuck collectives
    with its watchdog instead, never with collective timeouts.
    """
    from tensorflow.python.distribute import cross_device_utils  # private: no public switch

    launcher = cross_device_utils.CollectiveReplicaLauncher
    before = getattr(launcher, "_prefer_unique_instance_key", None)
    if before is None:  # another TF: leave it as it is
        yield
        return
    launcher._prefer_unique_instance_key = False
    try:
        yield
    finally:
        launcher._prefer_unique_instance_key = before


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

    Raises UserError when the global batch does not split over the replicas the strategy
    made: the login side checked the replicas it could count, but only here is it known how
    many GPUs each task computes on (a local site, a NoDevFiles grant).
    """
    gpus = len(tf.config.list_physical_devices("GPU"))
    policy = precision_policy(settings.mixed_precision, gpus)
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    configure_failure_detection(spec, settings)
    # Joining waits in C++ for every task (CoordinationServiceAgent::WaitForAllTasks) while
    # holding the GIL: when a peer never starts, neither cluster_register_timeout nor a
    # Python thread ends the wait (seen under gdb, TF 2.21). faulthandler's own C thread
    # does: it prints every thread's stack and exits 1.
    startup = settings.startup_timeout_seconds
    log.info("joining %d worker(s); each must start within %d s", len(spec.workers), startup)
    faulthandler.dump_traceback_later(startup, exit=True, file=sys.stdout)
    try:
        strategy = make_strategy(gpus, settings)
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
