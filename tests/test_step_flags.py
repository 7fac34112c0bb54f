"""Preemption warnings carried in the steps' own reduction (hpctf/compute/loop/step_flags.py): one
reduction per call, after its last step; the loss unchanged, a warning seen after the next call."""

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
    # No warning yet; no step time brought yet. This rank brings 0.0123 s from now on.
    assert flags.agree(0.0123, replicas=1) == (0, 0.0, False)

    flags.raise_flag(signal.SIGUSR2)  # what the handler does: no TensorFlow call
    assert flags.agree(0.0123, replicas=1)[0] == 0  # not before the next step carries it
    flags.push()
    assert float(step(data)) == pytest.approx(2 * 1.8)
    assert flags.agree(0.5, replicas=1) == (signal.SIGUSR2, 0.012, False)  # whole ms
    flags.raise_flag(signal.SIGTERM)
    flags.push()
    step(data)
    # Sticky; SIGTERM (a preemption) wins over the walltime warning, as the gather's agreement.
    assert flags.agree(0.5, replicas=1) == (signal.SIGTERM, 0.5, False)
    assert flags.agreed == [1.0, 1.0]
    assert len(reductions) == 1  # no retracing, no second reduction


def test_a_call_of_many_steps_runs_each_and_reduces_once_after_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The steps before a call's last one reduce nothing (a loss nobody reads would cost a
    collective a step); every one of them still runs (its state changes, its batch is taken)."""
    import tensorflow as tf

    from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step

    strategy = tf.distribute.get_strategy()
    weight = tf.Variable(2.0)

    def replica_step(features: Any, labels: Any) -> Any:
        weight.assign_sub(0.1)
        return tf.reduce_sum(features * weight - labels)

    graphs: list[str] = []  # where each reduction was traced
    reduce = strategy.reduce

    def traced_reduce(*args: Any, **kwargs: Any) -> Any:
        graphs.append(tf.compat.v1.get_default_graph().name)
        return reduce(*args, **kwargs)

    monkeypatch.setattr(strategy, "reduce", traced_reduce)
    step = flagged_train_step(strategy, replica_step, StepFlags())
    data = iter(tf.data.Dataset.from_tensor_slices(([1.0, 2.0, 3.0, 4.0, 5.0], [0.0] * 5)))
    assert float(step(data, 4)) == pytest.approx(4 * 1.6)  # the 4th batch, after 4 updates
    assert float(weight) == pytest.approx(1.6)
    assert float(step(data, 1)) == pytest.approx(5 * 1.5)  # the 5th: the call took 4 batches
    assert len(graphs) == 1 and "while" not in graphs[0], graphs  # after the loop, once


def test_a_vote_for_a_save_by_time_rides_in_the_next_steps_and_is_answered_once() -> None:
    """checkpoint.every_seconds: a rank's vote cast at one check is seen by every rank at the
    next (after a step carried it); the save it calls for answers it, so it is not brought
    again."""
    import tensorflow as tf

    from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step

    flags = StepFlags()
    step = flagged_train_step(tf.distribute.get_strategy(), lambda f, y: tf.reduce_sum(f), flags)
    data = iter(tf.data.Dataset.from_tensor_slices(([1.0], [0.0])).repeat())
    step(data)
    assert flags.agree(0.01, replicas=1, save_vote=True).save is False  # cast, not yet carried
    step(data, 3)
    assert flags.agree(0.01, replicas=1, save_vote=True).save is True  # seen: save this step
    step(data)
    assert flags.agree(0.01, replicas=1, save_vote=False).save is False  # answered: not again
    step(data)
    assert flags.agree(0.01, replicas=1).save is False


def test_the_step_time_is_whole_milliseconds_whose_sum_is_exact() -> None:
    from hpctf.compute.loop.step_flags import StepFlags

    flags = StepFlags()
    flags.agree(1e9, replicas=4)  # a step of 31 years: clamped so that 4 of them add up exactly
    assert float(flags.brought.numpy()[-1]) * 4 < 2**24


def test_a_watch_whose_steps_carry_the_flags_never_gathers() -> None:
    """Session.step_flags: a real signal to this process reaches the agreement through the next
    step's reduction; the watch's gather is never called."""
    import os

    import tensorflow as tf

    from hpctf.compute.loop.preemption import PreemptionWatch
    from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step

    def gather(value: int) -> list[int]:
        raise AssertionError("a collective the flags were to replace")

    step = flagged_train_step(
        tf.distribute.get_strategy(), lambda f, y: tf.reduce_sum(f - y), flags := StepFlags()
    )
    data = iter(tf.data.Dataset.from_tensor_slices(([1.0], [0.0])).repeat())
    with PreemptionWatch(gather) as watch:
        watch.carry(flags, replicas=1)
        step(data)
        assert watch.agree(0.002) == (0, 0.0, False)
        os.kill(os.getpid(), signal.SIGUSR2)
        flags.push()
        step(data)
        assert watch.agree(0.002) == (signal.SIGUSR2, 0.002, False)


def test_the_chiefs_vote_to_prune_is_read_alike_after_the_next_step() -> None:
    """A search's trial (compute/loop/pruning.py): the chief's vote rides in the next call's
    steps, is read after it as the same answer on every rank, stays, and leaves the warnings,
    the save vote and the step time as they were."""
    import tensorflow as tf

    from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step

    flags = StepFlags()
    step = flagged_train_step(tf.distribute.get_strategy(), lambda f, y: tf.reduce_sum(f), flags)
    data = iter(tf.data.Dataset.from_tensor_slices(([1.0], [0.0])).repeat())
    assert flags.pruned is False  # before any step
    step(data)
    flags.agree(0.004, replicas=1, save_vote=True)
    flags.vote_prune()
    assert flags.pruned is False  # cast, not carried yet
    assert float(step(data)) == 1.0  # the loss is still the first value of the vector
    assert flags.pruned is True
    assert flags.agree(0.004, replicas=1) == (0, 0.004, True)
    flags.raise_flag(signal.SIGUSR2)
    flags.push()
    step(data, 2)
    assert flags.pruned is True and flags.agreed == [1.0, 0.0]
