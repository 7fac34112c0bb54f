"""Preemption warnings carried in the step's own reduction (hpctf/compute/loop/step_flags.py): one
reduction per step as before, the loss unchanged, a warning seen after the next step."""

from __future__ import annotations

import signal
from typing import Any

import pytest

pytestmark = pytest.mark.tf


def test_the_flags_ride_in_the_one_reduction_of_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow as tf

    from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step

    strategy = tf.distribute.get_strategy()
    weight = tf.Variable(2.0)

    def replica_step(features: Any, labels: Any) -> Any:
        weight.assign_sub(0.1)  # a step that changes state, as an optimizer's does
        return tf.reduce_sum(features * weight - labels)

    reductions: list[Any] = []
    reduce = strategy.reduce
    monkeypatch.setattr(strategy, "reduce", lambda *a, **k: reductions.append(a) or reduce(*a, **k))

    flags = StepFlags()
    step = flagged_train_step(strategy, replica_step, flags)
    data = iter(tf.data.Dataset.from_tensor_slices(([1.0, 2.0, 3.0, 4.0], [0.0] * 4)).repeat())
    assert float(step(data)) == pytest.approx(1.9)  # 1 x 1.9
    assert len(reductions) == 1  # traced once: one reduction, as make_train_step's
    assert flags.agreed_signal() is None

    flags.raise_flag(signal.SIGUSR2)  # what the handler does: no TensorFlow call
    assert flags.agreed_signal() is None  # not before the next step carries it
    flags.push()
    assert float(step(data)) == pytest.approx(2 * 1.8)
    assert flags.agreed_signal() == signal.SIGUSR2
    flags.raise_flag(signal.SIGTERM)
    flags.push()
    step(data)
    assert flags.agreed_signal() == signal.SIGUSR2  # sticky; WATCHED order decides the name
    assert list(flags.agreed.numpy()) == [1.0, 1.0]
    assert len(reductions) == 1  # no retracing, no second reduction
