"""The contract between hpctf and a user's training code.

The experiment's ``train.entry`` names ``module:function``. hpctf calls that function with the
experiment's ``train.args`` as keyword arguments, inside the distribution strategy's scope, and
it must return a :class:`Task`. hpctf owns everything else: TF_CONFIG, the strategy, batching,
the training loop, checkpoints, signals and logging.

This module imports nothing heavy, so user code and login-node code may both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """What a training entry returns.

    Attributes:
        model: a Keras model, built inside the strategy scope (the entry is called there).
        optimizer: a Keras optimizer.
        loss: ``loss(y_true, y_pred)`` returning one loss value per example (for Keras losses,
            pass ``reduction=None``); hpctf averages over the global batch.
        train_data: returns a ``tf.data.Dataset`` of unbatched ``(features, label)`` pairs, one
            pass over the training set. hpctf shuffles, repeats, batches and shards it.
        eval_data: like ``train_data`` for the validation set, or None.
        metrics: name -> ``fn(y_true, y_pred)`` returning one value per example; hpctf reports
            their means over the whole validation set, reduced across workers.
        shuffle_buffer: examples held by the training shuffle buffer.
    """

    model: Any
    optimizer: Any
    loss: Callable[[Any, Any], Any]
    train_data: Callable[[], Any]
    eval_data: Callable[[], Any] | None = None
    metrics: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    shuffle_buffer: int = 10_000
