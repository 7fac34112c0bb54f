"""The private names of TensorFlow and Keras 3 that hpctf uses, each with what it is for, the
versions it was checked against, and what hpctf does without it.

============================ ======================================= ===========================
capability                   private names                           without them
============================ ======================================= ===========================
failure detection            ``coordination_config_pb2`` (its        TF's own coordination
                             module moves: see                       service timeouts
                             :data:`COORDINATION_PROTO_MODULES`),    (MultiWorkerMirrored-
                             ``context().configure_coordination_     Strategy's defaults); a
                             service``                               peer lost is still seen
fixed collective keys        ``cross_device_utils.CollectiveReplica  a new key per call: TF's
                             Launcher._prefer_unique_instance_key``  behaviour, RSS grows with
                                                                     the steps (3.4 MB/1,000)
async saves                  ``Checkpoint._async_checkpointer()``,   synchronous saves (one
                             its ``_saveable_trackables``,           warning line)
                             ``_object_map``, ``_copy_to_cpu``,
                             ``_queue.unfinished_tasks``,
                             ``_async_error``; the variables'
                             ``_copy_trackable_to_cpu``
learning-rate scaling        Keras 3 ``Optimizer._learning_rate``    none correct: a run that
                                                                     asks for it stops in one
                                                                     line (exit 3, not
                                                                     requeued)
============================ ======================================= ===========================

Checked against (``tests/test_compat_canaries.py`` and ``tests/test_compat_fallbacks.py`` on
2.21.0 and, in ``tests/test_compat_smoke.py``, on 2.16.2; the digits example on 2 local workers,
interrupted and resumed, with asynchronous saves and learning-rate scaling, on every version
below, by hand with ``tests/compat_smoke.py``; every capability on in each):

============== ======== =============================================================
tensorflow-cpu keras    the ``coordination_config_pb2`` TF's own context imports
============== ======== =============================================================
2.16.2         3.15.1   ``tensorflow.tsl.protobuf`` (no ``tensorflow.compiler.xla.tsl``)
2.17.1         3.15.1   ``tensorflow.tsl.protobuf``
2.18.1         3.15.1   ``tensorflow.tsl.protobuf`` (``tensorflow.compiler.xla.tsl.
                        protobuf`` exists without it)
2.19.1         3.15.1   ``tensorflow.compiler.xla.tsl.protobuf``
2.20.0         3.15.1   ``tensorflow.compiler.xla.tsl.protobuf``
2.21.0         3.15.1   ``tensorflow.compiler.xla.tsl.protobuf``
============== ======== =============================================================

The module TensorFlow's own ``context.py`` imported is asked first: ``configure_coordination_
service`` extends its config with messages of that module's classes, so that is the one that
must match.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

# Where TensorFlow releases have kept the coordination service's config proto, newest first.
COORDINATION_PROTO_MODULES = (
    "tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
    "tensorflow.tsl.protobuf.coordination_config_pb2",
    "tsl.protobuf.coordination_config_pb2",
    "xla.tsl.protobuf.coordination_config_pb2",
    "tensorflow.core.protobuf.coordination_config_pb2",
)


def coordination_config() -> ModuleType | None:
    """The ``coordination_config_pb2`` module TensorFlow's eager context uses, or None."""
    from tensorflow.python.eager import context

    found = getattr(context, "coordination_config_pb2", None)
    if isinstance(found, ModuleType) and hasattr(found, "CoordinatedJob"):
        return found
    for name in COORDINATION_PROTO_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "CoordinatedJob"):
            return module
    return None


def failure_detection_missing() -> str | None:
    """None when :func:`configure_coordination_service` can work; else what is missing."""
    from tensorflow.python.eager import context

    if not callable(getattr(context.context(), "configure_coordination_service", None)):
        return "no context().configure_coordination_service"
    if coordination_config() is None:
        return "no coordination_config_pb2"
    return None


def configure_coordination_service(
    workers: int, heartbeat_ms: int, register_ms: int, shutdown_ms: int
) -> str | None:
    """Configure TF's coordination service for ``workers`` tasks of job ``worker`` with these
    timeouts, before the strategy does with its defaults; None when done, else why not (then
    the strategy configures it with TensorFlow's defaults)."""
    from tensorflow.python.eager import context

    missing = failure_detection_missing()
    if missing is not None:
        return missing
    proto: Any = coordination_config()
    try:
        context.context().configure_coordination_service(
            service_type="standalone",
            service_leader="/job:worker/replica:0/task:0",
            coordinated_jobs=[proto.CoordinatedJob(name="worker", num_tasks=workers)],
            heartbeat_timeout_in_ms=heartbeat_ms,
            cluster_register_timeout_in_ms=register_ms,
            shutdown_barrier_timeout_in_ms=shutdown_ms,
        )
    except TypeError as exc:  # a signature that changed: TF's defaults, not a failed start
        return f"configure_coordination_service: {exc}"
    return None


def _collective_launcher() -> Any:
    from tensorflow.python.distribute import cross_device_utils

    return getattr(cross_device_utils, "CollectiveReplicaLauncher", None)


def fixed_keys_missing() -> str | None:
    """None when :func:`fixed_instance_keys` fixes the keys; else what is missing."""
    launcher = _collective_launcher()
    if launcher is None:
        return "no cross_device_utils.CollectiveReplicaLauncher"
    if not isinstance(getattr(launcher, "_prefer_unique_instance_key", None), bool):
        return "no CollectiveReplicaLauncher._prefer_unique_instance_key"
    return None


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
    (tensorflow/tensorflow#42616, #44688). Without the private flag nothing changes (TF's own
    per-call keys). A per-call key is what lets TF cancel one collective alone; hpctf bounds
    stuck collectives with its watchdog instead, never with collective timeouts.
    """
    if fixed_keys_missing() is not None:
        yield
        return
    launcher = _collective_launcher()
    before = launcher._prefer_unique_instance_key
    launcher._prefer_unique_instance_key = False
    try:
        yield
    finally:
        launcher._prefer_unique_instance_key = before


# What an asynchronous save needs of TensorFlow's AsyncCheckpointHelper, once made.
_ASYNC_HELPER_NAMES = ("_saveable_trackables", "_object_map", "_copy_to_cpu", "_queue")


def async_saves_missing() -> str | None:
    """None when the classes have what :func:`enable_async_saves` replaces and reads; else
    what is missing (checked without making a checkpoint: the instances' own attributes are
    checked again by :func:`enable_async_saves`)."""
    import keras
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    if not callable(getattr(tf.train.Checkpoint, "_async_checkpointer", None)):
        return "no Checkpoint._async_checkpointer"
    from tensorflow.python.trackable import base

    default = getattr(base.Trackable, "_copy_trackable_to_cpu", None)  # raises NotImplemented
    for owner in (keras.Variable, resource_variable_ops.BaseResourceVariable):
        own = getattr(owner, "_copy_trackable_to_cpu", None)
        if not callable(own) or own is default:
            return f"no {owner.__name__}._copy_trackable_to_cpu"
    try:
        from tensorflow.python.checkpoint import async_checkpoint_helper
    except ImportError:
        return "no tensorflow.python.checkpoint.async_checkpoint_helper"
    helper = getattr(async_checkpoint_helper, "AsyncCheckpointHelper", None)
    if not callable(getattr(helper, "_copy_to_cpu", None)):
        return "no AsyncCheckpointHelper._copy_to_cpu"
    return None


def enable_async_saves(checkpoint: Any) -> str | None:
    """Make ``checkpoint``'s asynchronous saves copy eagerly and in place; None when done, else
    what this TensorFlow lacks (then the caller saves synchronously).

    Why: TensorFlow's asynchronous save copies every variable to host memory in a
    ``tf.function`` and writes the copies in a thread. Keras 3's variable makes its copy with a
    new ``tf.Variable`` on every call (``keras/src/backend/tensorflow/core.py``,
    ``_copy_trackable_to_cpu``), which a ``tf.function`` allows only on its first trace:
    measured with TF 2.21 and Keras 3.15, the second save of the digits model fails with
    "tf.function only supports singleton tf.Variables created on the first call". The helper's
    copy step is replaced with an eager one that assigns into the copies made at the first save
    (TF's own first save does the same copies eagerly). The copy is the only part of a save
    with collectives (reading a mirrored variable under MultiWorkerMirroredStrategy), and it
    still runs in the training thread, in the same order on every rank.
    """
    import keras

    missing = async_saves_missing()
    if missing is not None:
        return missing
    helper = checkpoint._async_checkpointer()
    absent = [n for n in _ASYNC_HELPER_NAMES if not hasattr(helper, n)]
    if absent or not hasattr(helper._queue, "unfinished_tasks"):
        return f"AsyncCheckpointHelper without {', '.join(absent) or '_queue.unfinished_tasks'}"
    if not hasattr(helper, "_async_error"):
        # Without it a failed write would be raised one save late, against the wrong step.
        return "AsyncCheckpointHelper without _async_error"

    def copy_to_cpu() -> None:
        copies: Any = helper._object_map
        for trackable in helper._saveable_trackables:
            inner: Any = getattr(trackable, "value", None)
            if isinstance(trackable, keras.Variable) and trackable in copies:
                inner._copy_trackable_to_cpu(object_map=copies)
                copies[trackable].assign(copies[inner])
            else:
                trackable._copy_trackable_to_cpu(object_map=copies)

    helper._copy_to_cpu = copy_to_cpu
    return None


def _async_helper(checkpoint: Any) -> Any:
    return getattr(checkpoint, "_async_checkpointer_impl", None)


def async_write_pending(checkpoint: Any) -> bool:
    """Whether a background write of ``checkpoint`` (made by :func:`enable_async_saves`) is
    still queued or running. Cheap: no wait, no collective."""
    queue = getattr(_async_helper(checkpoint), "_queue", None)
    return bool(getattr(queue, "unfinished_tasks", 0))


def take_async_error(checkpoint: Any) -> BaseException | None:
    """The exception of ``checkpoint``'s last background write, taken (TensorFlow would raise
    it only at the next save, against the wrong step), or None."""
    helper = _async_helper(checkpoint)
    error: BaseException | None = getattr(helper, "_async_error", None)
    if error is not None:
        helper._async_error = None
    return error


def learning_rate_missing() -> str | None:
    """None when Keras 3's optimizers keep the constructor's learning rate in
    ``_learning_rate`` (checked in the constructors' code, so nothing is built before the
    strategy: a TF variable made before it would initialize TF's context too early)."""
    import keras

    for klass in keras.optimizers.Optimizer.__mro__:
        code = getattr(klass.__dict__.get("__init__"), "__code__", None)
        if code is not None and "_learning_rate" in code.co_names:
            return None
    return "no Optimizer._learning_rate"


def given_learning_rate(optimizer: Any) -> Any:
    """The learning rate ``optimizer`` was made with: a Variable, a schedule or a callable (the
    public ``learning_rate`` property returns only the current number, a schedule evaluated).

    Raises :class:`hpctf.core.errors.EnvironmentProblem` where this Keras keeps it elsewhere:
    scaling the current number would turn a schedule into a constant, so there is no correct
    fallback.
    """
    from hpctf.core.errors import EnvironmentProblem

    try:
        return optimizer._learning_rate
    except AttributeError:
        import keras

        raise EnvironmentProblem(
            f"train.scale_learning_rate needs Keras 3's Optimizer._learning_rate, which keras "
            f"{keras.__version__} has not: install keras<=3.15 (checked: 3.x with tensorflow "
            "2.16 to 2.21), or scale the rate in your entry and set "
            "train.scale_learning_rate: false"
        ) from None


def eager_context_started() -> bool:
    """Whether TensorFlow's eager context has been made in this process: anything that asked
    for it (``tf.config.list_physical_devices`` too, which starts CUDA's driver, reading
    CUDA_VISIBLE_DEVICES) may have read the environment a warm standby sets only when it takes
    over a task (:mod:`hpctf.compute.start.standby`). ``context._context`` is None until the
    context is first asked for; without the name the answer is True (no takeover)."""
    from tensorflow.python.eager import context

    return getattr(context, "_context", True) is not None
