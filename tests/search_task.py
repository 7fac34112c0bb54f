"""A tiny Task whose objective has a known optimum, for a search (tests and ``make bench``).

A linear model learns ``y = x . w`` (4 features, SGD): its evaluation's ``objective`` is the
model's squared error plus a penalty that only the hyperparameters set, ``(x - 0.7)^2 +
0.05 (depth - 2)^2``. Every trial learns the same curve (same data, same seed), so the
objective ranks trials by their penalty at every evaluation (early stopping has something to
go by) and its best is at ``x = 0.7, depth = 2``. ``step_seconds`` slows each step (a sleep
in the input pipeline, no CPU), so that a trial lasts long enough to be preempted mid-run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import hpctf

BEST_X = 0.7
BEST_DEPTH = 2
WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)


def penalty(x: float, depth: int) -> float:
    """What the hyperparameters add to the objective: 0 at the optimum."""
    return (x - BEST_X) ** 2 + 0.05 * (depth - BEST_DEPTH) ** 2


def _data(seed: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    features = np.random.default_rng(seed).normal(size=(examples, 4)).astype(np.float32)
    return features, (features @ WEIGHTS)[:, None]


def build(
    x: float = 0.5, depth: int = 0, learning_rate: float = 0.05, step_seconds: float = 0.0,
    batch: int = 8,
) -> hpctf.Task:  # fmt: skip
    import keras  # here: the test that runs the search imports penalty() without TensorFlow
    import tensorflow as tf

    extra = np.float32(penalty(x, depth))
    x_train, y_train = _data(0, 512)
    x_val, y_val = _data(1, 64)
    pause = step_seconds / batch  # the pipeline makes one example at a time

    def slowly(features: Any) -> Any:
        time.sleep(pause)
        return features

    def train_data() -> Any:
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        if pause <= 0:
            return data
        return data.map(
            lambda f, y: (tf.ensure_shape(tf.numpy_function(slowly, [f], tf.float32), [4]), y)
        )

    def objective(y_true: Any, y_pred: Any) -> Any:
        return tf.reduce_mean(tf.square(y_pred - y_true), axis=-1) + extra

    model = keras.Sequential(
        [keras.Input(shape=(4,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )
    return hpctf.Task(
        model=model,
        optimizer=keras.optimizers.SGD(learning_rate),
        loss="mse",
        train_data=train_data,
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_val, y_val)),
        metrics={"objective": objective},
        shuffle_buffer=64,
    )
