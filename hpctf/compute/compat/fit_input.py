"""What a Keras ``fit`` was called with that a resume needs (:class:`FitInput`): whether its
input continues across epochs and whether each epoch's order is drawn anew. Noted by the
``fit`` that :mod:`.keras_fit` wraps, read by :mod:`hpctf.compute.script.fit`.

Checked against tensorflow 2.21.0: ``Dataset._inputs()`` and
``_ShuffleDataset._reshuffle_each_iteration`` (tensorflow/python/data/ops/shuffle_op.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FitInput:
    """What ``fit`` was called with that a resume needs: whether its input continues across
    epochs (:func:`input_continues`), its ``initial_epoch``, and whether each epoch's order is
    drawn anew (:func:`reshuffled_each_epoch`: a resume then cannot repeat it)."""

    continues: bool = False
    initial_epoch: int = 0
    reshuffled: bool = False


RESHUFFLED_INPUT = (
    "fit's input draws a new order every epoch (a finite dataset with .shuffle(), which fit "
    "iterates anew each epoch, or arrays with fit's shuffle=True): a resume (hpctf resubmit, a "
    "requeue) restarts its epoch in another order, so the resumed run will not see the batches "
    "an uninterrupted one would; for an exact resume give fit "
    "dataset.shuffle(N, seed=S).repeat() and steps_per_epoch=K"
)


def reshuffled_each_epoch(data: Any, shuffle: Any) -> bool:
    """Whether ``fit`` (not continuing across epochs) draws each epoch's order anew: a
    ``tf.data`` pipeline with a ``shuffle`` that reshuffles on each iteration (the default),
    found through ``Dataset._inputs()`` and ``_ShuffleDataset._reshuffle_each_iteration``
    (tensorflow/python/data/ops/shuffle_op.py); or arrays that ``fit`` shuffles itself
    (``shuffle=True``, its default, from Keras's global generator)."""
    import tensorflow as tf

    if not isinstance(data, tf.data.Dataset):
        arrays = hasattr(data, "shape") or isinstance(data, (list, tuple, dict))
        return bool(shuffle) and arrays
    seen: set[int] = set()
    pending = [data]
    while pending:
        dataset = pending.pop()
        if id(dataset) in seen:
            continue
        seen.add(id(dataset))
        reshuffles = getattr(dataset, "_reshuffle_each_iteration", None)
        if reshuffles is not None and "Shuffle" in type(dataset).__name__:
            try:
                if bool(reshuffles):
                    return True
            except (TypeError, ValueError):  # a tensor in graph mode: take it as the default
                return True
        inputs = getattr(dataset, "_inputs", None)
        if callable(inputs):
            try:
                pending.extend(inputs())
            except (TypeError, ValueError, NotImplementedError):
                continue
    return False


def fit_input(model: Any) -> FitInput:
    """The :class:`FitInput` of ``model``'s running ``fit`` (the defaults outside hpctf)."""
    found = getattr(model, "_hpctf_fit", None)
    return found if isinstance(found, FitInput) else FitInput()


def input_continues(data: Any, steps_per_epoch: Any) -> bool:
    """Whether ``fit`` takes every epoch's batches from one iterator (an endless dataset with
    ``steps_per_epoch``: epoch 2 continues where epoch 1 stopped) rather than one per epoch.
    A resume then passes over every batch trained before the checkpoint, not only those of the
    epoch it resumes in."""
    if steps_per_epoch is None:
        return False
    import tensorflow as tf

    if not isinstance(data, tf.data.Dataset):
        return False
    return bool(data.cardinality().numpy() == tf.data.INFINITE_CARDINALITY)
