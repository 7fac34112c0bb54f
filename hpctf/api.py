"""The contract between hpctf and a user's training code.

The experiment's ``train.entry`` names ``module:function``. hpctf calls that function with the
experiment's ``train.args`` as keyword arguments, inside the distribution strategy's scope, and
it must return a :class:`Task`. hpctf owns everything else: TF_CONFIG, the strategy, batching,
the training loop, checkpoints, signals and logging.

This module imports nothing heavy, so user code and login-node code may both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Files:
    """A data set stored in files, so each worker can read only its own share of them.

    With at least as many files as workers, hpctf shards by file: each worker reads a disjoint
    subset. With fewer, every worker reads every file and keeps its share of the examples
    (DATA sharding); hpctf logs a warning, since that multiplies the reads from the filesystem.

    Attributes:
        paths: the files (sorted by hpctf, so every worker agrees on the split).
        read: ``read(filenames)`` turns a ``tf.data.Dataset`` of file names into a dataset of
            unbatched ``(features, label)`` pairs, e.g. ``filenames.interleave(
            tf.data.TFRecordDataset).map(parse)``.
        examples: how many examples the files hold; needed only for ``train.epochs``.
    """

    paths: Sequence[str]
    read: Callable[[Any], Any]
    examples: int | None = None


DataSource = Callable[[], Any] | Files


@dataclass
class Task:
    """What a training entry returns: what ``model.compile`` and ``model.fit`` would be given.

    Attributes:
        model: a Keras model, built inside the strategy scope (the entry is called there).
        optimizer: a Keras optimizer, or its name as ``model.compile`` takes it (``"adam"``).
        loss: as ``model.compile`` takes it: a name (``"mse"``,
            ``"sparse_categorical_crossentropy"``), a ``keras.losses.Loss`` with any reduction
            (hpctf uses a copy that returns one value per example), or a function
            ``loss(y_true, y_pred)`` returning one value per example. hpctf averages over the
            global batch.
        train_data: a :class:`Files`, or a function returning a ``tf.data.Dataset`` of
            unbatched ``(features, label)`` pairs, one pass over the training set (every worker
            then builds all of it and keeps its share: DATA sharding, logged). hpctf shuffles,
            repeats, shards and batches it.
        eval_data: like ``train_data`` for the validation set, or None. Every worker reads all
            of it and evaluates its share.
        metrics: a list as ``model.compile`` takes it (``["mae"]``, ``["accuracy"]``,
            ``[keras.metrics.MeanAbsoluteError()]``, functions), or a mapping name -> metric.
            Each is a name, a Keras mean metric, or ``fn(y_true, y_pred)`` returning one value
            per example; hpctf reports their means over the whole validation set, reduced
            across workers.
        shuffle_buffer: examples held by the training shuffle buffer.
        callbacks: Keras callbacks (``keras.callbacks.EarlyStopping(...)``, ReduceLROnPlateau,
            CSVLogger, TerminateOnNaN, your own), called as ``model.fit`` calls them
            (:mod:`hpctf.compute.users_code.task_callbacks` says when, and what an epoch is).
    """

    model: Any
    optimizer: Any
    loss: Any
    train_data: DataSource
    eval_data: DataSource | None = None
    metrics: Mapping[str, Any] | Sequence[Any] = field(default_factory=dict)
    shuffle_buffer: int = 10_000
    callbacks: Sequence[Any] = ()
