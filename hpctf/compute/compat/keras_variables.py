"""The variables of Keras models that a checkpoint or the ranks must hold beyond what
``tf.train.Checkpoint(model=...)`` tracks: the random layers' seed states
(:func:`random_state_variables`), every weight of a Keras 3 model (:func:`model_weights`) and
BatchNormalization's per-replica statistics (:func:`replica_local_variables`).

Checked against keras 3.15.1 (``seed_generator_state`` variables, ``Model.weights``,
``Layer._flatten_layers``) and tf_keras 2.21.0 (``Layer._flatten_layers``).
"""

from __future__ import annotations

from typing import Any


def random_state_variables(objects: dict[str, Any]) -> list[Any]:
    """The Keras 3 random layers' seed states (``SeedGenerator``, named
    ``seed_generator_state``: RandomFlip, RandomCrop, Dropout, GaussianNoise, ...) of the models
    among ``objects``. ``tf.train.Checkpoint(model=...)`` leaves them out (it tracks layers'
    weights, not their seed generators), so a resumed run with augmentation would draw other
    random numbers than an uninterrupted one; checkpointed beside the model they are restored.
    ``model.non_trainable_variables`` holds them, each under its ``path``."""
    found: list[Any] = []
    seen: set[int] = set()
    for value in objects.values():
        for variable in getattr(value, "non_trainable_variables", None) or []:
            path = str(getattr(variable, "path", "") or getattr(variable, "name", ""))
            name = path.rsplit("/", 1)[-1]
            if name.startswith("seed_generator_state") and id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def model_weights(objects: dict[str, Any]) -> list[Any]:
    """Every weight (trainable and not: BatchNormalization's statistics too) of the Keras 3
    models among ``objects``, for the checkpoint beside the models themselves.

    ``tf.train.Checkpoint(model=...)`` finds a Keras 3 model's weights through TensorFlow's
    object graph, and a subclassed model that keeps its layers in a Python list
    (``self.body = [Conv2D(...), BatchNormalization(), ...]``) shows it none: Keras 3 wraps
    the list in its own ``TrackedList``, which TensorFlow does not follow. Measured: such a
    checkpoint held no ``model/`` value at all; the trainable weights came back only through
    the optimizer's own list, and BatchNormalization's statistics not at all (a resumed run's
    accuracy 0.637 where the uninterrupted run had 0.773). Listed here, each weight is in the
    checkpoint whatever the model's structure (a weight also under ``model/`` is stored once)."""
    found: list[Any] = []
    seen: set[int] = set()
    for value in objects.values():
        if not _keras_3_model(value):
            continue
        for variable in getattr(value, "weights", None) or []:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def _keras_3_model(value: Any) -> bool:
    return any(
        klass.__module__.startswith("keras.") and klass.__name__ == "Layer"
        for klass in type(value).__mro__
    )


def replica_local_variables(objects: dict[str, Any]) -> list[Any]:
    """The state each replica updates from its own shard of the batch, in the models among
    ``objects``: the moving statistics of BatchNormalization layers (Keras 3 and tf_keras;
    ``synchronized=True`` layers left out, their statistics are the global batch's already).
    Under MultiWorkerMirroredStrategy Keras 3 keeps them as mirrored variables with aggregation
    NONE, so each replica's assign changes its own copy only: the ranks' copies drift apart
    (measured: 0.0164 after 640 steps on 2 workers) while the trainable weights stay equal.
    Found through ``Layer._flatten_layers`` (both Keras), in the order the layers are built."""
    found: list[Any] = []
    seen: set[int] = set()
    for value in objects.values():
        flatten = getattr(value, "_flatten_layers", None)
        if not callable(flatten):
            continue
        for layer in flatten(include_self=True, recursive=True):
            if "BatchNormalization" not in type(layer).__name__:
                continue
            if getattr(layer, "synchronized", False):
                continue
            for variable in getattr(layer, "non_trainable_weights", None) or []:
                dtype = getattr(variable, "dtype", None)
                floating = getattr(dtype, "is_floating", None)
                floating = floating if floating is not None else "float" in str(dtype)
                if floating and id(variable) not in seen:
                    seen.add(id(variable))
                    found.append(variable)
    return found
