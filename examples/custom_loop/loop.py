"""A training loop of the user's own, with hpctf's guarantees through the Session.

hpctf calls ``main(session, **train.args)`` on every rank (``train.loop: custom``). The session
has already made TF_CONFIG and the strategy; ``track`` restores the newest whole checkpoint,
``distribute`` positions the data after it, ``step_done`` checkpoints and handles preemption.
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

    for step in range(start + 1, steps + 1):
        session.step_done(step, loss=float(train_step(iterator)))
    session.finish(steps)
