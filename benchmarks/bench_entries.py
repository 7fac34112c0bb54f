"""Training entries for the benchmarks (``train.entry`` with ``train.python_path`` on this folder).

``timed_saves`` is hpctf's built-in loop, unchanged, with one thing added: the time of every
save, as the loop waits for it, is written to ``metrics.jsonl`` (``{"step": N, "bench":
{"save_s": ...}}``). ``dense_stack`` is a model of any size in weights (a stack of square Dense
layers on synthetic data), for the checkpoint stall of a ~100 MB model. ``soak_task`` is the
smallest step, for the 100,000-step soak.
"""

from __future__ import annotations

import time
from typing import Any

import hpctf


def timed_saves(session: Any, builder: str, **args: Any) -> None:
    """``train.loop: custom`` entry: hpctf's built-in loop over the Task that ``builder``
    (``module:function``) returns for ``args``, every ``Session.save`` timed on the chief."""
    from hpctf.compute.loop.training import builtin_loop, load_entry

    build = load_entry(builder)
    control = session.control  # the step protocol: its step_done calls its save
    save = control.save

    def task(**_: Any) -> hpctf.Task:
        built: hpctf.Task = build(**args)
        weights = sum(int(v.numpy().nbytes) for v in built.model.weights)
        session.record(0, {"weights_mb": weights / 1e6}, group="bench")
        return built

    def timed(step: int) -> None:
        started = time.perf_counter()
        save(step)  # every rank takes part; the loop waits for it
        session.record(step, {"save_s": time.perf_counter() - started}, group="bench")

    control.save = timed  # type: ignore[method-assign]  # the instance attribute wins
    builtin_loop(session, task)


def dense_stack(
    width: int = 2048,
    depth: int = 7,
    features: int = 64,
    classes: int = 10,
    examples: int = 4096,
    learning_rate: float = 1e-3,
) -> hpctf.Task:
    """``depth`` Dense layers ``width`` wide, then ``classes`` logits (about
    4 x (depth - 1) x width**2 bytes of float32 weights: 101 MB with the defaults), on
    ``examples`` random feature vectors."""
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((examples, features), dtype=np.float32)
    y = rng.integers(0, classes, examples).astype(np.int64)
    layers: list[Any] = [keras.Input((features,)), keras.layers.Dense(width, activation="relu")]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth - 1)]
    layers.append(keras.layers.Dense(classes))
    return hpctf.Task(
        model=keras.Sequential(layers),
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
    )


def soak_task(features: int = 8, classes: int = 2, examples: int = 64) -> hpctf.Task:
    """The smallest step hpctf's built-in loop can take, for the soak: one Dense layer without
    bias (``features`` x ``classes`` weights, one variable, so one gradient all-reduce), plain
    SGD (no optimizer slots), ``examples`` random vectors. What 100,000 steps of it soak is
    hpctf's worker and TensorFlow's MWMS, not a model: measured on 2 cores, a step of it took
    about 2/3 of the time of a digits step (4,000-step runs alternated: 181 and 232 steps/s
    against 111 and 163)."""
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((examples, features), dtype=np.float32)
    y = rng.integers(0, classes, examples).astype(np.int64)
    model = keras.Sequential(
        [keras.Input((features,)), keras.layers.Dense(classes, use_bias=False)]
    )
    return hpctf.Task(
        model=model,
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)),
    )
