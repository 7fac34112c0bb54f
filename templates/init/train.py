"""A training entry for hpctf: ``build(**train.args)`` returns an hpctf.Task.

hpctf calls ``build`` on every worker, inside the distribution strategy's scope, and owns the
rest: TF_CONFIG, the strategy, batching, sharding, the training loop, checkpoints and logs.
This one fits a small network to made-up data (y = sum of x, plus noise), so it runs anywhere;
replace the data and the model with yours.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

import hpctf


def mean_absolute_error(y_true: Any, y_pred: Any) -> Any:
    """One value per example; hpctf averages it over the whole validation set."""
    return tf.reduce_mean(tf.abs(y_true - y_pred), axis=-1)


def build(hidden: int = 32, learning_rate: float = 0.01, examples: int = 4096) -> hpctf.Task:
    rng = np.random.default_rng(0)  # the same data on every worker
    features = rng.normal(size=(examples, 8)).astype(np.float32)
    targets = features.sum(axis=1, keepdims=True) + rng.normal(0, 0.1, (examples, 1))
    targets = targets.astype(np.float32)
    split = examples * 4 // 5
    model = keras.Sequential(
        [
            keras.Input(shape=(features.shape[1],)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    return hpctf.Task(
        model=model,
        optimizer=keras.optimizers.Adam(learning_rate),
        # reduction=None: one loss per example; hpctf averages over the global batch.
        loss=keras.losses.MeanSquaredError(reduction=None),
        train_data=lambda: tf.data.Dataset.from_tensor_slices(
            (features[:split], targets[:split])
        ),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((features[split:], targets[split:])),
        metrics={"mae": mean_absolute_error},
    )
