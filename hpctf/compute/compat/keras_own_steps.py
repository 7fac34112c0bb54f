"""A Keras 3 model's own ``train_step`` and ``test_step`` run as on one machine under a
strategy (:func:`own_steps_as_on_one_machine`), for :mod:`.keras_fit`.

Keras's guide "Customizing what happens in fit()": under a strategy ``compute_loss`` and every
Keras loss return the replica's share (``keras/src/losses/loss.py``,
``scale_loss_for_distribution``: loss / replicas) so that the optimizer's sum of the replicas'
gradients (``TFOptimizer._all_reduce_sum_gradients``) is a mean. Keras's own trackers multiply
it back; a tracker of the user's records 1/N of the truth, and a term the user adds to that loss
is counted N times in the summed gradient. While a model's own step is traced both are made as
on one machine instead: losses are the replica's batch mean and the gradients are averaged
across replicas.

Checked against keras 3.15.1: ``losses.loss.scale_loss_for_distribution``,
``unscale_loss_for_distribution``, ``TFOptimizer._all_reduce_sum_gradients``,
``TensorFlowTrainer.train_step`` and ``test_step``.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from typing import Any

log = logging.getLogger("hpctf.worker")

# A model's own train_step or test_step, traced as on one machine: MirroredStrategy traces each
# local replica's step in a thread of its own, so this is a count over every thread, not a
# thread-local flag.
_own_step_lock = threading.Lock()
_own_steps_tracing = 0


def _tracing_own_step() -> bool:
    return _own_steps_tracing > 0


def own_steps_patched(trainer: Any) -> list[str]:
    """Keras's loss scaling and gradient sum, as on one machine while a model's own step is
    traced (:func:`own_steps_as_on_one_machine`); the names not found (nothing patched then)."""
    loss_module: Any = importlib.import_module("keras.src.losses.loss")
    optimizer_module: Any = importlib.import_module("keras.src.backend.tensorflow.optimizer")
    optimizer: Any = getattr(optimizer_module, "TFOptimizer", None)
    names = {
        "losses.loss.scale_loss_for_distribution": getattr(
            loss_module, "scale_loss_for_distribution", None
        ),
        "losses.loss.unscale_loss_for_distribution": getattr(
            loss_module, "unscale_loss_for_distribution", None
        ),
        "TFOptimizer._all_reduce_sum_gradients": getattr(
            optimizer, "_all_reduce_sum_gradients", None
        ),
        "TensorFlowTrainer.train_step": getattr(
            getattr(trainer, "TensorFlowTrainer", None), "train_step", None
        ),
    }
    missing = [name for name, found in names.items() if found is None]
    if missing:
        return missing
    for name in ("scale_loss_for_distribution", "unscale_loss_for_distribution"):
        original = getattr(loss_module, name)
        if not getattr(original, "_hpctf", False):
            setattr(loss_module, name, _unscaled_in_own_steps(original))
    original_sum = optimizer._all_reduce_sum_gradients
    if not getattr(original_sum, "_hpctf", False):
        optimizer._all_reduce_sum_gradients = _averaged_in_own_steps(original_sum)
    return []


def _unscaled_in_own_steps(original: Any) -> Any:
    @functools.wraps(original)
    def scaling(value: Any) -> Any:
        return value if _tracing_own_step() else original(value)

    scaling._hpctf = True  # type: ignore[attr-defined]
    return scaling


def _averaged_in_own_steps(original: Any) -> Any:
    @functools.wraps(original)
    def all_reduce(self: Any, grads_and_vars: Any) -> Any:
        reduced = original(self, grads_and_vars)
        if not _tracing_own_step():
            return reduced
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas == 1:
            return reduced
        return [
            (None if g is None else tf.math.scalar_mul(1.0 / replicas, g), v) for g, v in reduced
        ]

    all_reduce._hpctf = True  # type: ignore[attr-defined]
    return all_reduce


def _traced_as_own_step(step: Any) -> Any:
    @functools.wraps(step)
    def own_step(*args: Any, **kwargs: Any) -> Any:
        global _own_steps_tracing
        with _own_step_lock:
            _own_steps_tracing += 1
        try:
            return step(*args, **kwargs)
        finally:
            with _own_step_lock:
                _own_steps_tracing -= 1

    own_step._hpctf = True  # type: ignore[attr-defined]
    return own_step


def own_steps_as_on_one_machine(model: Any) -> tuple[str, ...]:
    """Make ``model``'s own ``train_step`` and ``test_step`` (those its class overrides) run
    as on one machine under a strategy: ``compute_loss`` and Keras's losses return the mean
    over the replica's batch (not that over the replica count), so trackers of the user's
    record the truth and a term added to the loss counts once; the gradients are averaged
    across replicas instead of summed. Returns the steps it found (said once per model, in the
    rank log, with several replicas). Keras's own steps are left as Keras has them."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    own = tuple(
        name
        for name in ("train_step", "test_step")
        if getattr(type(model), name, None) is not getattr(TensorFlowTrainer, name)
    )
    wrapped = False
    for name in own:
        current = getattr(model, name)
        if not getattr(current, "_hpctf", False):
            # object's own setattr: Keras's would try to track the function as state.
            object.__setattr__(model, name, _traced_as_own_step(current))
            wrapped = True
    strategy = getattr(model, "_distribute_strategy", None)
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    if wrapped and replicas > 1:
        log.info(
            "%s has its own %s: on %d replicas hpctf runs %s as on one machine "
            "(self.compute_loss and Keras losses give this replica's batch mean, terms you add "
            "count once, gradients are averaged across replicas): do not divide by the replica "
            "count or the global batch yourself (docs: how-to/own-train-step)",
            type(model).__name__,
            " and ".join(own),
            replicas,
            "it" if len(own) == 1 else "them",
        )
    return own
