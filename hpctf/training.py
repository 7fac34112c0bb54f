"""The training loop under MultiWorkerMirroredStrategy.

Not ``model.fit``: Keras 3's fit is broken under this strategy (keras-team/keras#20585,
``strategy.reduce`` on a tuple of PerReplica). A custom loop -- ``strategy.run`` inside a
``tf.function``, ``tf.nn.compute_average_loss`` -- works with Keras 3 models and optimizers.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from hpctf.api import Task
from hpctf.checkpoints import Checkpointer
from hpctf.cluster import ClusterSpec
from hpctf.config import ResolvedConfig, Train
from hpctf.data import cardinality, evaluation_dataset, plan_shards, training_input
from hpctf.errors import UserError
from hpctf.rundir import RunDir, write_atomic

log = logging.getLogger("hpctf.worker")


def load_entry(entry: str) -> Callable[..., Task]:
    """Import ``module:function``."""
    module_name, _, function_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"train.entry {entry!r}: cannot import {module_name}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UserError(f"train.entry {entry!r}: {module_name} has no function {function_name}")
    return function  # type: ignore[no-any-return]


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
    """MWMS over NCCL when this task sees GPUs, RING otherwise, unless the config says which."""
    implementations = tf.distribute.experimental.CommunicationImplementation
    choice = settings.communication
    if choice == "auto":
        choice = "nccl" if gpus else "ring"
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementations.NCCL if choice == "nccl" else implementations.RING,
        timeout_seconds=settings.collective_timeout_seconds,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def total_steps(settings: Train, task: Task) -> int:
    """train.steps, or train.epochs times the full global batches in one pass."""
    if settings.steps is not None:
        return settings.steps
    examples = cardinality(task.train_data)
    if examples is None:
        raise UserError(
            "train.epochs needs a training set of known size (a finite dataset, or "
            "hpctf.Files(..., examples=N)); or give train.steps"
        )
    per_epoch = examples // settings.global_batch_size
    if per_epoch == 0:
        raise UserError(
            f"train.global_batch_size {settings.global_batch_size} exceeds the {examples} "
            "training examples"
        )
    return per_epoch * (settings.epochs or 1)


def _format_eta(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _build_task(settings: Train, strategy: Any) -> Task:
    entry = load_entry(settings.entry)
    with strategy.scope():
        task = entry(**settings.args)
        if not isinstance(task, Task):
            raise UserError(
                f"train.entry {settings.entry!r} returned {type(task).__name__}, not hpctf.Task"
            )
        if settings.scale_learning_rate:
            replicas = strategy.num_replicas_in_sync
            base = float(task.optimizer.learning_rate)
            task.optimizer.learning_rate = base * replicas
            log.info(
                "learning rate scaled by %d replicas: %g -> %g", replicas, base, base * replicas
            )
        # Build optimizer slots now so a restore fills them instead of deferring.
        task.optimizer.build(task.model.trainable_variables)
    return task


class _Recorder:
    """The chief's records: metrics.jsonl and TensorBoard events; nothing on other ranks."""

    def __init__(self, run: RunDir, chief: bool) -> None:
        self._run = run
        self._writer = (
            tf.summary.create_file_writer(str(run.path / "tensorboard")) if chief else None
        )

    def record(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        if self._writer is None:
            return
        with self._run.metrics.open("a", encoding="utf-8") as handle:
            key = prefix.rstrip("/") or None
            handle.write(
                json.dumps({"step": step, key: values} if key else {"step": step, **values}) + "\n"
            )
        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(prefix + name, value)
        self._writer.flush()


def train(config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> int:
    """Run (or resume) training to the configured step; the chief writes DONE at the end."""
    settings = config.experiment.train
    gpus = tf.config.list_physical_devices("GPU")
    if settings.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16" if gpus else "mixed_bfloat16")
    configure_failure_detection(spec, settings)
    strategy = make_strategy(len(gpus), settings)
    replicas = strategy.num_replicas_in_sync
    global_batch = settings.global_batch_size
    if global_batch % replicas:
        raise UserError(
            f"train.global_batch_size {global_batch} is not divisible by the {replicas} replicas"
        )
    log.info("%d replicas, %d GPU(s) on this rank", replicas, len(gpus))

    keras.utils.set_random_seed(settings.seed)
    task = _build_task(settings, strategy)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=task.model, optimizer=task.optimizer, step=step_var)
    checkpointer = Checkpointer(
        checkpoint, run.checkpoints, spec, config.experiment.checkpoint.keep
    )
    restored = checkpointer.restore_latest()
    start = int(step_var.numpy())
    total = total_steps(settings, task)
    if restored:
        log.info("resumed from %s at step %d", restored, start)
    else:
        log.info("no checkpoint in %s: starting at step 0", run.checkpoints)

    plan = plan_shards(task.train_data, len(spec.workers), spec.task_index)
    (log.warning if plan.policy == "DATA" and len(spec.workers) > 1 else log.info)(
        "input: %s sharding, %s", plan.policy, plan.reason
    )
    if plan.policy == "FILE":
        log.info("input files of this rank: %s", ",".join(plan.files))
    iterator = iter(
        strategy.distribute_datasets_from_function(
            training_input(
                task.train_data, plan, global_batch, settings.seed, task.shuffle_buffer, start
            )
        )
    )
    train_step = _train_step(strategy, task, global_batch, settings.jit_compile)
    recorder = _Recorder(run, spec.is_chief)
    every = config.experiment.checkpoint.every_steps
    window_start, window_step = time.perf_counter(), start
    for step in range(start + 1, total + 1):
        loss = float(train_step(iterator))
        if not math.isfinite(loss):
            raise UserError(f"loss became {loss} at step {step}; lower the learning rate?")
        if step % settings.log_every_steps == 0 or step == total:
            now = time.perf_counter()
            rate = (step - window_step) / max(now - window_start, 1e-9)
            window_start, window_step = now, step
            log.info(
                "step %d/%d loss %.4f %.1f steps/s %.0f examples/s eta %s",
                step,
                total,
                loss,
                rate,
                rate * global_batch,
                _format_eta((total - step) / rate),
            )
            recorder.record(step, {"loss": loss, "steps_per_s": round(rate, 3)})
        if settings.eval_every_steps and step % settings.eval_every_steps == 0 and step != total:
            _evaluate_and_record(strategy, task, global_batch, step, recorder)
        if step % every == 0 or step == total:
            step_var.assign(step)
            checkpointer.save(step)

    results = _evaluate_and_record(strategy, task, global_batch, total, recorder)
    if spec.is_chief:
        write_atomic(run.done, json.dumps({"step": total, "eval": results}) + "\n")
        log.info("training complete: %s", run.done)
    return 0


def _train_step(strategy: Any, task: Task, global_batch: int, jit_compile: bool) -> Any:
    model, optimizer, loss_fn = task.model, task.optimizer, task.loss

    def gradients(features: Any, labels: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            predictions = tf.cast(model(features, training=True), tf.float32)
            loss = tf.nn.compute_average_loss(
                loss_fn(labels, predictions), global_batch_size=global_batch
            )
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
        return loss, tape.gradient(scaled, model.trainable_variables)

    # XLA compiles the per-replica forward and backward; the all-reduce in apply_gradients
    # stays outside, where the collective implementation chosen above runs it.
    compiled = tf.function(gradients, jit_compile=True) if jit_compile else gradients

    def replica_step(features: Any, labels: Any) -> Any:
        loss, grads = compiled(features, labels)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator: Any) -> Any:
        features, labels = next(iterator)
        per_replica = strategy.run(replica_step, args=(features, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def _evaluate_and_record(
    strategy: Any, task: Task, global_batch: int, step: int, recorder: _Recorder
) -> dict[str, float]:
    if task.eval_data is None:
        return {}
    results = evaluate(strategy, task, global_batch)
    log.info("eval at step %d: %s", step, " ".join(f"{k} {v:.4f}" for k, v in results.items()))
    recorder.record(step, results, prefix="eval/")
    return results


def evaluate(strategy: Any, task: Task, global_batch: int) -> dict[str, float]:
    """Mean loss and metrics over the whole validation set, summed across workers."""
    assert task.eval_data is not None
    functions = {"loss": task.loss, **task.metrics}

    def replica_sums(features: Any, labels: Any) -> dict[str, Any]:
        predictions = tf.cast(task.model(features, training=False), tf.float32)
        sums = {
            name: tf.reduce_sum(tf.cast(fn(labels, predictions), tf.float64))
            for name, fn in functions.items()
        }
        sums["count"] = tf.cast(tf.shape(labels)[0], tf.float64)
        return sums

    @tf.function
    def eval_step(features: Any, labels: Any) -> dict[str, Any]:
        per_replica = strategy.run(replica_sums, args=(features, labels))
        return {
            name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
            for name, value in per_replica.items()
        }

    totals: dict[str, float] = {}
    dataset = evaluation_dataset(task.eval_data, global_batch)
    for features, labels in strategy.experimental_distribute_dataset(dataset):
        for name, value in eval_step(features, labels).items():
            totals[name] = totals.get(name, 0.0) + float(value)
    count = totals.pop("count", 0.0)
    return {name: value / count for name, value in totals.items()} if count else {}
