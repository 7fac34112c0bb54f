"""The multi-worker Keras tutorial's script, as written for one machine, plus one line.

    hpctf submit examples/keras_fit/experiment.yaml --site local

TensorFlow's tutorial (tensorflow.org/tutorials/distribute/multi_worker_with_keras): a
MultiWorkerMirroredStrategy at the top (it reads TF_CONFIG, which hpctf sets), a dataset batched
by the global batch, a model compiled in the strategy's scope, ``model.fit``, and the chief alone
keeping the model. The one hpctf line is ``callbacks=hpctf.keras.callbacks()``: resume at the
exact step, checkpoints, preemption saves, progress and DONE. Keras 3's fit, which fails
under this strategy upstream (keras-team/keras#20585), is made exact by hpctf before the script
runs; ``train.keras: 2`` runs the same script on tf_keras.
"""

import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf

import hpctf.keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(f"Number of replicas: {strategy.num_replicas_in_sync}")

GLOBAL_BATCH = 32
rng = np.random.default_rng(0)
features = rng.normal(size=(2048, 8)).astype("float32")
labels = features @ rng.normal(size=(8, 1)).astype("float32")
dataset = (
    tf.data.Dataset.from_tensor_slices((features, labels))
    .shuffle(2048, seed=0)
    .repeat()
    .batch(GLOBAL_BATCH)
)

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(8,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3  # train.script_args: [EPOCHS]
model.fit(dataset, epochs=epochs, steps_per_epoch=20, callbacks=hpctf.keras.callbacks())

# Saving reads the metrics' variables, a collective: every worker saves, and only the
# chief's copy is kept (as the tutorial does).
chief = os.environ.get("HPCTF_IS_CHIEF", "1") == "1"
directory = "." if chief else tempfile.mkdtemp()
model.save(os.path.join(directory, "model.keras"))
if not chief:
    shutil.rmtree(directory)
