"""Training entries for tests: the digits example with twists a test needs.

Workers import this module by ``train.entry: entries:NAME`` with
``tests.conftest.ENTRIES_PATH`` as ``train.python_path``: this directory and the examples it
builds on, so the run's code snapshot holds all of them.
"""

from __future__ import annotations

import time

import digits  # found on train.python_path in a worker
import keras
import loop

import hpctf
from hpctf.compute.session import Session


def digits_with_schedule(
    hidden: int = 64, learning_rate: float = 0.01, decay_steps: int = 50
) -> hpctf.Task:
    """The digits task with a learning-rate schedule instead of a constant rate."""
    task = digits.build(hidden=hidden, learning_rate=learning_rate)
    schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate, decay_steps, 0.5)
    task.optimizer = keras.optimizers.Adam(schedule)
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


def compile_style(examples: int = 64) -> hpctf.Task:
    """A tiny regression written as for model.compile: names for optimizer, loss and metrics."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    return hpctf.Task(
        model=model,
        optimizer="adam",
        loss="mse",
        metrics=["mae"],
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
    )
