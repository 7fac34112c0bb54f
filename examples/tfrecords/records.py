"""Digits read from sharded TFRecord files: each worker reads only its own files (FILE sharding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

import hpctf

_FEATURES = {
    "x": tf.io.FixedLenFeature([64], tf.float32),
    "y": tf.io.FixedLenFeature([], tf.int64),
}


def _parse(record: Any) -> tuple[Any, Any]:
    example = tf.io.parse_single_example(record, _FEATURES)
    return example["x"], example["y"]


def read(filenames: Any) -> Any:
    """File names -> (features, label) pairs."""
    return filenames.interleave(tf.data.TFRecordDataset, cycle_length=2, deterministic=True).map(
        _parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def accuracy(labels: Any, logits: Any) -> Any:
    return tf.cast(
        tf.equal(labels, tf.argmax(logits, axis=-1, output_type=labels.dtype)), tf.float32
    )


def build(data_dir: str, hidden: int = 64, learning_rate: float = 0.01) -> hpctf.Task:
    root = Path(data_dir)
    train_files = sorted(str(p) for p in root.glob("train-*.tfrecord"))
    val_files = sorted(str(p) for p in root.glob("val-*.tfrecord"))
    if not train_files:
        raise FileNotFoundError(
            f"no train-*.tfrecord in {root}: run examples/tfrecords/write_shards.py {root}"
        )
    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    return hpctf.Task(
        model=model,
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=hpctf.Files(train_files, read),
        eval_data=hpctf.Files(val_files, read),
        metrics={"accuracy": accuracy},
    )
