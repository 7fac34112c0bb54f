"""A researcher's Keras fit script, as tests/test_fit_scripts.py runs it on 2 local workers.

    fit_matrix.py KERAS MODEL LR STOP_AT [STRATEGY [STEPS_PER_EXECUTION]]

KERAS ``3`` (keras) or ``2`` (tf_keras); MODEL ``plain`` (Conv2D, Dense) or ``random``
(RandomFlip and Dropout too); LR the learning rate (0: the model never changes, so each epoch's
mean training loss is the loss ``evaluate`` gives on the same examples); STOP_AT: rank 0 sends
itself SIGUSR2 at that optimizer step of a run with no checkpoint yet (0: never); STRATEGY
``none`` builds the model outside any strategy's scope, as a script written for one machine;
STEPS_PER_EXECUTION is given to ``compile`` (1 by default).
Prints each rank's weights (``WEIGHTS``) and ``evaluate``'s numbers (``EVALUATE``).
"""

import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

if sys.argv[1] == "2":
    import tf_keras as keras
else:
    import keras

import hpctf.keras

model_kind, learning_rate, stop_at = sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with_strategy = (sys.argv[5] if len(sys.argv) > 5 else "strategy") != "none"
steps_per_execution = int(sys.argv[6]) if len(sys.argv) > 6 else 1
strategy = tf.distribute.MultiWorkerMirroredStrategy() if with_strategy else None
keras.utils.set_random_seed(0)
GLOBAL_BATCH = 32
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8, 8, 3)).astype("float32")
y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")
train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=1).repeat()
train = train.batch(GLOBAL_BATCH)
validation = tf.data.Dataset.from_tensor_slices((x[:128], y[:128])).batch(GLOBAL_BATCH)


def build():
    layers = [keras.layers.Input((8, 8, 3))]
    if model_kind == "random":
        layers.append(keras.layers.RandomFlip("horizontal", seed=3))
    layers += [keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten()]
    if model_kind == "random":
        layers.append(keras.layers.Dropout(0.2, seed=4))
    layers.append(keras.layers.Dense(2))
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


if strategy is not None:
    with strategy.scope():
        model = build()
else:
    model = build()


class StopOnce(keras.callbacks.Callback):
    """A preemption warning to rank 0 at one step of the first start."""

    def on_train_batch_end(self, batch, logs=None):
        checkpoints = os.path.join(os.environ["HPCTF_RUN_DIR"], "checkpoints")
        first_start = not os.path.isdir(checkpoints) or not os.listdir(checkpoints)
        step = int(self.model.optimizer.iterations.numpy())
        if stop_at and os.environ["HPCTF_RANK"] == "0" and first_start and step == stop_at:
            os.kill(os.getpid(), signal.SIGUSR2)


model.fit(
    train,
    epochs=4,
    steps_per_epoch=8,
    validation_data=validation,
    verbose=0,
    callbacks=[*hpctf.keras.callbacks(), StopOnce()],
)
result = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
print("EVALUATE", json.dumps({k: float(v) for k, v in result.items()}))
print("WEIGHTS", json.dumps([float(np.abs(w).sum()) for w in model.get_weights()]))
model.save("final.keras")
