"""``train.scale_learning_rate``: the optimizer's learning rate multiplied by the number of
replicas (:func:`learning_rate_scaler`), a schedule wrapped (:class:`ScaledSchedule`), applied
after a restore so the rate is this job's, not that of the job that saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from hpctf.compute.compat import tensorflow_internals


class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """A user's learning-rate schedule times a constant factor."""

    def __init__(self, schedule: Any, factor: float) -> None:
        self.schedule = schedule
        self.factor = factor

    def __call__(self, step: Any) -> Any:
        return self.schedule(step) * self.factor

    def get_config(self) -> dict[str, Any]:
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "factor": self.factor,
        }


def learning_rate_scaler(optimizer: Any, replicas: int) -> Callable[[], str]:
    """For ``train.scale_learning_rate``: a function that sets ``optimizer``'s learning rate
    to the rate the entry gave times ``replicas`` and says what it did.

    Call it after restoring a checkpoint: a constant rate is an optimizer variable, so a
    restore would bring back the rate scaled for the replica count of the job that saved it.
    A schedule cannot be assigned a number (Keras raises TypeError) and is wrapped instead.
    Where Keras keeps the given rate elsewhere: an EnvironmentProblem naming the version
    (:func:`hpctf.compute.compat.tensorflow_internals.given_learning_rate`).
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under LossScaleOptimizer
    given = tensorflow_internals.given_learning_rate(inner)
    if isinstance(given, keras.optimizers.schedules.LearningRateSchedule):
        scaled: Any = ScaledSchedule(given, replicas)
        text = f"{type(given).__name__} x {replicas}"
    elif callable(given):  # Keras calls a plain callable without the step
        scaled = ScaledSchedule(lambda step: given(), replicas)
        text = f"{given!r} x {replicas}"
    else:
        base = float(keras.ops.convert_to_numpy(given))
        scaled = base * replicas
        text = f"{base:g} -> {scaled:g}"

    def apply() -> str:
        inner.learning_rate = scaled
        return f"learning rate scaled by {replicas} replicas: {text}"

    return apply
