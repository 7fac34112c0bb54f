"""Training entries for tests: the digits example with twists a test needs.

Workers import this module by ``train.entry: entries:NAME`` with
``tests.conftest.ENTRIES_PATH`` as ``train.python_path``: this directory and the examples it
builds on, so the run's code snapshot holds all of them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import digits  # found on train.python_path in a worker
import keras
import loop

import hpctf
from hpctf import Session


def digits_with_schedule(
    hidden: int = 64, learning_rate: float = 0.01, decay_steps: int = 50
) -> hpctf.Task:
    """The digits task with a learning-rate schedule instead of a constant rate."""
    task = digits.build(hidden=hidden, learning_rate=learning_rate)
    schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate, decay_steps, 0.5)
    task.optimizer = keras.optimizers.Adam(schedule)
    return task


def digits_with_dropout(hidden: int = 64, learning_rate: float = 0.01) -> hpctf.Task:
    """The digits task with random layers (seeded GaussianNoise and Dropout): their seed
    states must be checkpointed for a resume to draw what an uninterrupted run draws."""
    task = digits.build(hidden=hidden, learning_rate=learning_rate)
    task.model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.GaussianNoise(0.1, seed=1),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dropout(0.3, seed=2),
            keras.layers.Dense(10),
        ]
    )
    return task


def stuck_at(session: Session, rank: int = 1, step: int = 40) -> None:
    """The custom-loop example, except that rank ``rank`` stops calling collectives at
    ``step`` while staying alive (heartbeats go on): a deadlock in user code."""
    original = session.step_done

    def step_done(current: int, loss: float | None = None) -> None:
        if session.spec.task_index == rank and current == step:
            print(f"rank {rank} stuck at step {step}", flush=True)
            time.sleep(3600)
        original(current, loss=loss)

    session.step_done = step_done  # type: ignore[method-assign]
    loop.main(session)


def crash_at_start(**args: object) -> hpctf.Task:
    """An entry with a bug: it raises before the first step, on every start."""
    raise RuntimeError("a bug in the user's entry")


def data_that_raises(**args: object) -> hpctf.Task:
    """The digits task whose training data function has a bug: it raises when hpctf calls it."""
    task = digits.build(**args)  # type: ignore[arg-type]

    def train_data() -> object:
        rows = {"images": []}
        return rows["labels"]  # KeyError: the user's own line, in this file

    task.train_data = train_data
    return task


def compile_style(examples: int = 64, out: str = "") -> hpctf.Task:
    """A tiny regression written as for model.compile and model.fit: names for optimizer, loss
    and metrics; with ``out``, Keras callbacks: EarlyStopping and ReduceLROnPlateau that act
    at the second epoch's end, TerminateOnNaN, CSVLogger and :class:`Recorder` writing to
    ``out``."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    callbacks: list[keras.callbacks.Callback] = []
    if out:
        rank = os.environ["SLURM_PROCID"]
        never_better = {"monitor": "val_loss", "min_delta": 1e6}  # the second epoch is worse
        callbacks = [
            keras.callbacks.TerminateOnNaN(),
            keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=0, **never_better),
            keras.callbacks.EarlyStopping(patience=1, **never_better),
            keras.callbacks.CSVLogger(f"{out}/history-{rank}.csv"),  # the chief's alone
            Recorder(f"{out}/calls-{rank}.json"),
        ]
    return hpctf.Task(
        model=model,
        optimizer="adam",
        loss="mse",
        metrics=["mae"],
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        callbacks=callbacks,
    )


class Recorder(keras.callbacks.Callback):  # type: ignore[misc]
    """Writes every call it gets to a JSON file: ``[name, epoch or batch, ...]``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)
        self.calls: list[list[object]] = []

    def _add(self, *call: object) -> None:
        self.calls.append(list(call))
        self.path.write_text(json.dumps(self.calls))

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._add("train_begin")

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._add("epoch_begin", epoch)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._add("batch_end", batch, sorted(logs or {}))

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._add("epoch_end", epoch, sorted(logs or {}))

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        self._add("train_end", round(rate, 6))


def digits_with_best_checkpoint(hidden: int = 64, learning_rate: float = 0.01) -> hpctf.Task:
    """The digits task with ``metrics=["accuracy"]`` and callbacks that write relative paths:
    ModelCheckpoint("best.keras") and EarlyStopping on val_accuracy without ``mode``, and
    :class:`RelativeNote` (every rank)."""
    task = digits.build(hidden=hidden, learning_rate=learning_rate)
    task.metrics = ["accuracy"]
    stop = keras.callbacks.EarlyStopping(monitor="val_accuracy", patience=1000)
    task.callbacks = [
        keras.callbacks.ModelCheckpoint("best.keras", monitor="val_accuracy", save_best_only=True),
        stop,
        RelativeNote(stop),
    ]
    return task


class RelativeNote(keras.callbacks.Callback):  # type: ignore[misc]
    """Writes ``note-RANK.json`` (a relative path) at the end: the working directory, and how
    ``stop`` compared its metric (``greater``: maximised)."""

    def __init__(self, stop: keras.callbacks.EarlyStopping) -> None:
        super().__init__()
        self.stop = stop

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        rank = os.environ["SLURM_PROCID"]
        op = getattr(self.stop.monitor_op, "__name__", str(self.stop.monitor_op))
        Path(f"note-{rank}.json").write_text(json.dumps({"cwd": os.getcwd(), "op": op}))


class _Sleep(keras.layers.Layer):  # type: ignore[misc]
    """Passes its input through after sleeping: ``seconds[0]`` per call for the first
    ``switch_after`` calls, ``seconds[1]`` after (a step time that changes mid-run)."""

    def __init__(self, seconds: tuple[float, float], switch_after: int) -> None:
        super().__init__()
        self._seconds = seconds
        self._switch_after = switch_after
        self._calls = 0

    def _sleep(self, x: object) -> object:
        self._calls += 1
        time.sleep(self._seconds[0 if self._calls <= self._switch_after else 1])
        return x

    def call(self, x: object) -> object:
        import tensorflow as tf

        slept = tf.numpy_function(self._sleep, [x], tf.float32, stateful=True)
        return tf.ensure_shape(slept, x.shape)  # type: ignore[attr-defined]


def slow_steps(
    first_seconds: float = 0.05, then_seconds: float = 0.3, switch_after: int = 100
) -> hpctf.Task:
    """A tiny regression whose steps take ``first_seconds`` for ``switch_after`` steps, then
    ``then_seconds`` (a sleep in the model: saves by time must not depend on the step time)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential(
        [
            keras.Input(shape=(4,)),
            _Sleep((first_seconds, then_seconds), switch_after),
            keras.layers.Dense(1),
        ]
    )
    return hpctf.Task(
        model=model,
        optimizer="adam",
        loss="mse",
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
    )
