"""The training loop under MultiWorkerMirroredStrategy. The only module importing TensorFlow.

Not ``model.fit``: Keras 3's fit is broken under this strategy (keras-team/keras#20585,
``strategy.reduce`` on a tuple of PerReplica). A custom loop -- ``strategy.run`` inside a
``tf.function``, ``tf.nn.compute_average_loss`` -- works with Keras 3 models and optimizers.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hpctf.api import Task
from hpctf.cluster import ClusterSpec
from hpctf.config import ResolvedConfig
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


def make_strategy(gpus: int) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS over NCCL when this task sees GPUs, RING otherwise."""
    implementation = (
        tf.distribute.experimental.CommunicationImplementation.NCCL
        if gpus
        else tf.distribute.experimental.CommunicationImplementation.RING
    )
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def train_steps(config: ResolvedConfig, task: Task) -> int:
    """Total optimizer steps: train.steps, or train.epochs times full global batches per epoch."""
    train = config.experiment.train
    if train.steps is not None:
        return train.steps
    cardinality = int(task.train_data().cardinality())
    if cardinality < 0:
        raise UserError(
            "train.epochs needs a training dataset of known size; give train.steps instead"
        )
    per_epoch = cardinality // train.global_batch_size
    if per_epoch == 0:
        raise UserError(
            f"train.global_batch_size {train.global_batch_size} exceeds the {cardinality} "
            "training examples"
        )
    return per_epoch * (train.epochs or 1)


def training_dataset(task: Task, global_batch: int, seed: int, start_step: int) -> Any:
    """Shuffled, repeated, batched examples, positioned at ``start_step``.

    The distributed iterator cannot be checkpointed; skipping the batches already trained on
    before distributing the dataset makes a resumed run see exactly the batches an
    uninterrupted one would.
    """
    options = tf.data.Options()
    # Examples from memory or one file cannot be split by file; say so instead of letting
    # AUTO fall back silently (tensorflow#42146).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (
        task.train_data()
        .shuffle(task.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .skip(start_step)
        .prefetch(tf.data.AUTOTUNE)
    )
    return dataset.with_options(options)


class Checkpointer:
    """Chief-only checkpoints in ``RUN_DIR/checkpoints``; every worker takes part in a save.

    Saving under MWMS runs collectives, so every worker must save; the non-chief workers save
    into a node-local throwaway directory that is removed right after (the pattern of TF's
    multi-worker tutorial, tensorflow.org/tutorials/distribute/multi_worker_with_ctl).
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, run: RunDir, spec: ClusterSpec, keep: int):
        self._checkpoint = checkpoint
        self._chief = spec.is_chief
        self._task_index = spec.task_index
        self._dir = run.checkpoints
        self._manager = (
            tf.train.CheckpointManager(checkpoint, str(run.checkpoints), max_to_keep=keep)
            if self._chief
            else None
        )

    def restore_latest(self) -> str | None:
        """Restore every worker from the chief's latest checkpoint; return its path."""
        latest: str | None = tf.train.latest_checkpoint(str(self._dir))
        if latest:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def save(self, step: int) -> None:
        if self._manager is not None:
            log.info("checkpoint %s", self._manager.save(checkpoint_number=step))
            return
        throwaway = tempfile.mkdtemp(prefix=f"hpctf-worker{self._task_index}-ckpt-")
        try:
            manager = tf.train.CheckpointManager(self._checkpoint, throwaway, max_to_keep=1)
            manager.save(checkpoint_number=step)
        finally:
            shutil.rmtree(throwaway, ignore_errors=True)


def _format_eta(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def train(config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> int:
    """Run (or resume) training to the configured step; the chief writes DONE at the end."""
    settings = config.experiment.train
    gpus = tf.config.list_physical_devices("GPU")
    strategy = make_strategy(len(gpus))
    replicas = strategy.num_replicas_in_sync
    global_batch = settings.global_batch_size
    if global_batch % replicas:
        raise UserError(
            f"train.global_batch_size {global_batch} is not divisible by the {replicas} replicas"
        )
    log.info(
        "strategy %s: %d replicas, %d GPU(s) here", type(strategy).__name__, replicas, len(gpus)
    )

    tf.keras.utils.set_random_seed(settings.seed)
    entry = load_entry(settings.entry)
    with strategy.scope():
        task = entry(**settings.args)
        if not isinstance(task, Task):
            raise UserError(
                f"train.entry {settings.entry!r} returned {type(task).__name__}, not hpctf.Task"
            )
        # Build optimizer slots now so a restore fills them instead of deferring.
        task.optimizer.build(task.model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=task.model, optimizer=task.optimizer, step=step_var)
    checkpointer = Checkpointer(checkpoint, run, spec, config.experiment.checkpoint.keep)
    restored = checkpointer.restore_latest()
    start = int(step_var.numpy())
    total = train_steps(config, task)
    if restored:
        log.info("resumed from %s at step %d", restored, start)
    else:
        log.info("no checkpoint in %s: starting at step 0", run.checkpoints)

    iterator = iter(
        strategy.experimental_distribute_dataset(
            training_dataset(task, global_batch, settings.seed, start)
        )
    )
    model, optimizer, loss_fn = task.model, task.optimizer, task.loss

    def replica_step(features: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = tf.nn.compute_average_loss(
                loss_fn(labels, predictions), global_batch_size=global_batch
            )
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(it: Any) -> Any:
        features, labels = next(it)
        per_replica = strategy.run(replica_step, args=(features, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    every = config.experiment.checkpoint.every_steps
    log_every = settings.log_every_steps
    window_start, window_step = time.perf_counter(), start
    for step in range(start + 1, total + 1):
        loss = float(train_step(iterator))
        if not math.isfinite(loss):
            raise UserError(f"loss became {loss} at step {step}; lower the learning rate?")
        if step % log_every == 0 or step == total:
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
            if spec.is_chief:
                _append_metrics(run, {"step": step, "loss": loss, "steps_per_s": round(rate, 3)})
        if step % every == 0 or step == total:
            step_var.assign(step)
            checkpointer.save(step)

    results = evaluate(strategy, task, global_batch) if task.eval_data else {}
    if results:
        log.info("eval at step %d: %s", total, " ".join(f"{k} {v:.4f}" for k, v in results.items()))
    if spec.is_chief:
        if results:
            _append_metrics(run, {"step": total, "eval": results})
        write_atomic(run.done, json.dumps({"step": total, "eval": results}) + "\n")
        log.info("training complete: %s", run.done)
    return 0


def evaluate(strategy: Any, task: Task, global_batch: int) -> dict[str, float]:
    """Mean loss and metrics over the whole validation set, summed across workers."""
    assert task.eval_data is not None
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = task.eval_data().batch(global_batch).with_options(options)
    functions = {"loss": task.loss, **task.metrics}

    def replica_sums(features: Any, labels: Any) -> dict[str, Any]:
        predictions = task.model(features, training=False)
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
    for features, labels in strategy.experimental_distribute_dataset(dataset):
        for name, value in eval_step(features, labels).items():
            totals[name] = totals.get(name, 0.0) + float(value)
    count = totals.pop("count", 0.0)
    return {name: value / count for name, value in totals.items()} if count else {}


def _append_metrics(run: RunDir, record: dict[str, Any]) -> None:
    with run.metrics.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
