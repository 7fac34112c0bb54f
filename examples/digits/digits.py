"""Handwritten digits (scikit-learn's 8x8 set, shipped with it: no download) with a small MLP."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpctf


def accuracy(labels: Any, logits: Any) -> Any:
    """1.0 per correctly classified example."""
    predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    return tf.cast(tf.equal(labels, predicted), tf.float32)


def build(
    hidden: int = 64, learning_rate: float = 0.01, validation_fraction: float = 0.2
) -> hpctf.Task:
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=validation_fraction, random_state=0, stratify=labels
    )
    model = keras.Sequential(
        [
            keras.Input(shape=(features.shape[1],)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    return hpctf.Task(
        model=model,
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x_val, y_val)),
        metrics={"accuracy": accuracy},
    )
