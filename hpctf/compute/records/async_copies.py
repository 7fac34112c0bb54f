"""Asynchronous checkpoints with Keras 3 variables: the host copies made eagerly, in place.

TensorFlow's asynchronous save (``CheckpointOptions(experimental_enable_async_checkpoint=True)``)
copies every variable to host memory in a ``tf.function`` and writes the copies in a thread.
Keras 3's variable makes its copy with a new ``tf.Variable`` on every call
(``keras/src/backend/tensorflow/core.py``, ``_copy_trackable_to_cpu``), which a ``tf.function``
allows only on its first trace: measured with TF 2.21 and Keras 3.15, the second save of the
digits model fails with "tf.function only supports singleton tf.Variables created on the first
call". :func:`copy_in_place` replaces the helper's copy step with an eager one that assigns
into the copies made at the first save (TF's own first save does the same copies eagerly).
The copy is the only part of a save with collectives (reading a mirrored variable under
MultiWorkerMirroredStrategy), and it still runs in the training thread, in the same order on
every rank.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def copy_in_place(checkpoint: tf.train.Checkpoint) -> bool:
    """Make ``checkpoint``'s asynchronous saves copy eagerly and in place; False when this
    TensorFlow's helper is not the one measured (then the caller saves synchronously)."""
    make = getattr(checkpoint, "_async_checkpointer", None)
    if make is None:
        return False
    helper = make()
    if not all(hasattr(helper, n) for n in ("_saveable_trackables", "_object_map")):
        return False

    def copy_to_cpu() -> None:
        copies: Any = helper._object_map
        for trackable in helper._saveable_trackables:
            inner: Any = getattr(trackable, "value", None)
            if isinstance(trackable, keras.Variable) and trackable in copies:
                inner._copy_trackable_to_cpu(object_map=copies)
                copies[trackable].assign(copies[inner])
            else:
                trackable._copy_trackable_to_cpu(object_map=copies)

    helper._copy_to_cpu = copy_to_cpu
    return True
