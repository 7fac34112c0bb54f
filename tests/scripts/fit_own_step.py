"""A newcomer's Keras 3 fit script with a ``train_step`` and ``test_step`` of its own, as
tests/test_fit_own_step.py runs it on 2 local workers (or alone, to score the saved model).

    fit_own_step.py MODEL INPUT LR STOP_AT [KILL_AT [EPOCHS]]   # under hpctf (train.script)
    fit_own_step.py score WEIGHTS MODEL             # alone: the saved weights on the validation set

MODEL ``plain`` (Conv2D, Dense) or ``bn`` (Conv2D + BatchNormalization twice, Dense, Dropout);
INPUT ``repeat`` (``.repeat()`` with ``steps_per_epoch``) or ``finite`` (``.shuffle().batch()``,
re-iterated every epoch); LR the learning rate; STOP_AT: rank 0 sends itself SIGUSR2 at that
optimizer step of the first start (0: never); KILL_AT: rank 1 kills itself (SIGKILL) at that
step, as a lost node or the out-of-memory killer would end it; EPOCHS: fit's (4).

The steps are written as Keras's guide "Customizing what happens in fit()" writes them: the
cross-entropy from ``self.compute_loss``, an L2 term added by hand, ``keras.metrics.Mean``
trackers of their own. Prints each rank's weights (``WEIGHTS``), its non-trainable state
(``STATE``), the in-run ``evaluate`` (``EVALUATE``); rank 0 saves ``final.weights.h5``.
"""

import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

L2 = 1e-3
GLOBAL_BATCH = 32


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8, 8, 3)).astype("float32")
    y = (x[:, :4].mean(axis=(1, 2, 3)) > x[:, 4:].mean(axis=(1, 2, 3))).astype("int64")
    return x, y


class Classifier(keras.Model):
    """Conv2D (+ BatchNormalization), Dense; its own steps and trackers."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.body = [keras.layers.Conv2D(8, 3, activation="relu")]
        if kind == "bn":
            self.body += [
                keras.layers.BatchNormalization(),
                keras.layers.Conv2D(8, 3, activation="relu"),
                keras.layers.BatchNormalization(),
            ]
        self.body.append(keras.layers.Flatten())
        if kind == "bn":
            self.body.append(keras.layers.Dropout(0.1, seed=4))
        self.body.append(keras.layers.Dense(2))
        self.ce_tracker = keras.metrics.Mean(name="ce")
        self.l2_tracker = keras.metrics.Mean(name="l2")
        self.accuracy_tracker = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def call(self, x, training=False):
        for layer in self.body:
            x = layer(x, training=training)
        return x

    @property
    def metrics(self):
        return [self.ce_tracker, self.l2_tracker, self.accuracy_tracker]

    def l2(self):
        return L2 * tf.add_n([tf.reduce_sum(tf.square(w)) for w in self.trainable_weights])

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            ce = self.compute_loss(y=y, y_pred=logits)
            l2 = self.l2()
            loss = ce + l2
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(gradients, self.trainable_weights)
        self.ce_tracker.update_state(ce)
        self.l2_tracker.update_state(l2)
        self.accuracy_tracker.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, batch):
        x, y = batch
        logits = self(x, training=False)
        self.ce_tracker.update_state(self.compute_loss(y=y, y_pred=logits))
        self.l2_tracker.update_state(self.l2())
        self.accuracy_tracker.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}


def build(kind: str, learning_rate: float) -> Classifier:
    keras.utils.set_random_seed(0)
    model = Classifier(kind)
    model(np.zeros((1, 8, 8, 3), "float32"))  # builds every layer
    schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate, 16, 0.9)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def validation() -> tf.data.Dataset:
    x, y = data()
    return tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(GLOBAL_BATCH)


def score(weights: str, kind: str) -> None:
    """The saved weights, alone in this process: the numbers to hold the records against."""
    model = build(kind, 0.0)
    model.load_weights(weights)
    result = model.evaluate(validation(), verbose=0, return_dict=True)
    print("ALONE", json.dumps({k: float(v) for k, v in result.items()}))


class StopOnce(keras.callbacks.Callback):
    """A preemption warning to rank 0 at one step of the first start; rank 1 killed at
    another."""

    def __init__(self, stop_at: int, kill_at: int) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.kill_at = kill_at

    def on_train_batch_end(self, batch, logs=None):
        checkpoints = os.path.join(os.environ["HPCTF_RUN_DIR"], "checkpoints")
        first_start = not os.path.isdir(checkpoints) or not os.listdir(checkpoints)
        step = int(self.model.optimizer.iterations.numpy())
        rank = os.environ["HPCTF_RANK"]
        if self.stop_at and rank == "0" and first_start and step == self.stop_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if self.kill_at and rank == "1" and step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def main(
    kind: str, given: str, learning_rate: float, stop_at: int, kill_at: int, epochs: int
) -> None:
    import hpctf.keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build(kind, learning_rate)
    x, y = data()
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=1)
    fit_args = {}
    if given == "repeat":
        train = train.repeat()
        fit_args["steps_per_epoch"] = 16
    train = train.batch(GLOBAL_BATCH, drop_remainder=True)
    model.fit(
        train,
        epochs=epochs,
        validation_data=validation(),
        verbose=0,
        callbacks=[*hpctf.keras.callbacks(), StopOnce(stop_at, kill_at)],
        **fit_args,
    )
    result = model.evaluate(validation(), verbose=0, return_dict=True)
    print("EVALUATE", json.dumps({k: float(v) for k, v in result.items()}))
    print("WEIGHTS", json.dumps([float(np.abs(w).sum()) for w in model.get_weights()]))
    state = [v.numpy().tolist() for v in model.non_trainable_variables if "moving" in v.path]
    print("STATE", json.dumps(state))
    if os.environ.get("HPCTF_RANK", "0") == "0":
        model.save_weights(os.path.join(os.environ["HPCTF_RUN_DIR"], "final.weights.h5"))


if __name__ == "__main__":
    if sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3])
    else:
        kill_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        epochs = int(sys.argv[6]) if len(sys.argv) > 6 else 4
        main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), kill_at, epochs)
