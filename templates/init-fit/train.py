"""A Keras ``model.fit`` script for hpctf (``train.script``), run as ``__main__`` on every task.

hpctf has set TF_CONFIG: the strategy below finds the other workers. Build and compile the
model in the strategy's scope; batch the data to the *global* batch (fit splits it across the
workers); ``hpctf.keras.callbacks()`` checkpoints, resumes at the exact step and saves at one
agreed step on a preemption warning (``[]`` outside hpctf: ``python train.py`` runs alone).
This one fits a small network to made-up data, so it runs anywhere; replace it with yours.
"""

from __future__ import annotations

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import hpctf.keras

GLOBAL_BATCH = 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any model or dataset
    rng = np.random.default_rng(0)  # the same data on every worker
    features = rng.normal(size=(4096, 8)).astype(np.float32)
    targets = (features.sum(axis=1, keepdims=True) + rng.normal(0, 0.1, (4096, 1))).astype(
        np.float32
    )
    # .repeat() with steps_per_epoch: a resume repeats the uninterrupted run's batches exactly
    # (a finite .shuffle() would draw a new order every epoch).
    train = tf.data.Dataset.from_tensor_slices((features[:3072], targets[:3072]))
    train = train.shuffle(3072, seed=1).repeat().batch(GLOBAL_BATCH)
    validation = tf.data.Dataset.from_tensor_slices((features[3072:], targets[3072:]))
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="mse",
                      metrics=["mae"])  # fmt: skip
    model.fit(
        train,
        epochs=args.epochs,
        steps_per_epoch=3072 // GLOBAL_BATCH,
        validation_data=validation.batch(GLOBAL_BATCH),
        verbose=0,
        callbacks=hpctf.keras.callbacks(),
    )
    # Every rank saves (collectives inside); only the chief's lands in the run directory.
    model.save("model.keras")
    if os.environ.get("HPCTF_IS_CHIEF", "1") == "1":
        print("saved", os.path.abspath("model.keras"))


if __name__ == "__main__":
    main()
