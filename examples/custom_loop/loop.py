"""A training loop of the user's own, with hpctf's guarantees through the Session.

hpctf calls ``main(session, **train.args)`` on every rank (``train.loop: custom``). The session
has already made TF_CONFIG and the strategy; ``track`` restores the newest whole checkpoint,
``distribute`` positions the data after it, ``step_done`` checkpoints and handles preemption,
``evaluated`` records an evaluation (and, in a search's trial, may prune the run there).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from hpctf import Session


def main(session: Session, learning_rate: float = 0.1) -> None:
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    held_out = len(labels) // 5  # the last fifth, for evaluations
    features, x_val = features[:-held_out], features[-held_out:]
    labels, y_val = labels[:-held_out], labels[-held_out:]
    strategy = session.strategy
    global_batch = session.settings.global_batch_size

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(64,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.SGD(learning_rate)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    start = session.track(model=model, optimizer=optimizer)
    iterator = session.distribute(lambda: tf.data.Dataset.from_tensor_slices((features, labels)))
    steps = session.total_steps  # train.steps, or train.epochs over the data just given

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                loss_fn(y, model(x, training=True)), global_batch_size=global_batch
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(it: Any) -> Any:
        x, y = next(it)
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None
        )

    validation = session.evaluation_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((x_val, y_val))
    )

    def replica_sums(x: Any, y: Any) -> tuple[Any, Any]:
        per_example = loss_fn(y, model(x, training=False))
        return tf.reduce_sum(per_example), tf.cast(tf.shape(y)[0], tf.float32)

    @tf.function
    def eval_step(x: Any, y: Any) -> tuple[Any, Any]:
        total, count = strategy.run(replica_sums, args=(x, y))
        sum_ = tf.distribute.ReduceOp.SUM
        return strategy.reduce(sum_, total, axis=None), strategy.reduce(sum_, count, axis=None)

    def evaluate() -> dict[str, float]:
        session.equalize()  # BatchNormalization's statistics: one model on every rank
        total = count = 0.0
        for x, y in strategy.experimental_distribute_dataset(validation):
            batch_total, batch_count = eval_step(x, y)
            total, count = total + float(batch_total), count + float(batch_count)
        return {"loss": total / count}

    every = session.settings.eval_every_steps
    for step in range(start + 1, steps + 1):
        session.step_done(step, loss=float(train_step(iterator)))
        if every and step % every == 0:
            session.evaluated(step, evaluate())  # every rank; a search may prune the run here
    session.finish(steps)
