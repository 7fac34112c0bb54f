"""Preemption warnings carried in the step's own reduction: no extra collective per step.

Today's agreement (:class:`hpctf.compute.loop.preemption.PreemptionWatch`) gathers every rank's
signal every ``train.preemption_check_every_steps`` steps: one more collective, and a host
sync, whether or not any rank was warned (~5 points of the digits example's runtime, issue
#21). Each built-in step already reduces its loss across every replica
(``strategy.reduce(SUM, loss)`` in :func:`hpctf.compute.loop.training.make_train_step`). Here that
one reduction carries, beside the loss, one count per watched signal: the rank's ``pending``
flags, which its signal handler raises. What comes back is the same on every rank after the
same step, so every rank folds it into ``agreed`` (sticky) at the same step, and reading
``agreed`` every N steps (a local read, no collective) gives every rank the same answer at the
same step: the save is at one agreed step, as before.

Why this cannot deadlock or miss a warning: no collective is added or made conditional (the
vector replaces the scalar in a reduction every rank already runs at every step); a flag,
once raised, stays raised until the run exits, so a warning that lands between two steps is in
the next step's reduction; and every rank decides from ``agreed`` read after the same step
number, which holds the same values everywhere. The bound from warning to save is the check
cadence in steps (which must be the same number on every rank: a fixed count, or one computed
from values of this same reduction) plus one step.

Not wired in yet (the session and preemption modules are being restructured): the loop would
build its step with :func:`flagged_train_step`, call :meth:`StepFlags.push` before each step
(an integer compare unless a signal came) and :meth:`StepFlags.agreed_signal` where it checks
today.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hpctf.compute.start.joining import fixed_instance_keys

WATCHED = (signal.SIGUSR2, signal.SIGTERM)  # Slurm's warning; a preemption or the time limit


class StepFlags:
    """This rank's pending warnings and the warnings every rank had as of the last step.

    Create it outside the strategy's scope: both are plain local variables, one float per
    signal of :data:`WATCHED`.
    """

    def __init__(self) -> None:
        self.pending = tf.Variable(tf.zeros([len(WATCHED)]), trainable=False, name="pending")
        self.agreed = tf.Variable(tf.zeros([len(WATCHED)]), trainable=False, name="agreed")
        self._raised: list[int] = []  # set by the signal handler: no TensorFlow call there
        self._pushed = 0

    def raise_flag(self, signum: int) -> None:
        """For the signal handler: remember ``signum`` (one of :data:`WATCHED`)."""
        if signum in WATCHED and signum not in self._raised:
            self._raised.append(signum)

    def push(self) -> None:
        """Before a step, in the loop: put flags raised since the last push into ``pending``."""
        if len(self._raised) == self._pushed:
            return
        for signum in self._raised[self._pushed :]:
            self.pending[WATCHED.index(signum)].assign(1.0)
        self._pushed = len(self._raised)

    def agreed_signal(self) -> int | None:
        """The signal some rank had got as of the last step (the same answer on every rank
        after the same step), or None. Waits for the dispatched steps: call it every N steps."""
        counts = self.agreed.numpy()
        for signum, count in zip(WATCHED, counts, strict=True):
            if count > 0:
                return int(signum)
        return None


def flagged_train_step(
    strategy: Any, replica_step: Callable[[Any, Any], Any], flags: StepFlags
) -> Any:
    """``make_train_step``'s step with the flags in its one reduction: returns the loss summed
    over replicas, and folds every rank's pending flags into ``flags.agreed``."""

    def replica(features: Any, labels: Any) -> Any:
        loss = tf.reshape(tf.cast(replica_step(features, labels), tf.float32), [1])
        return tf.concat([loss, flags.pending.read_value()], axis=0)

    @tf.function
    def train_step(iterator: Any) -> Any:
        with fixed_instance_keys():  # traced once: see make_train_step
            features, labels = next(iterator)
            per_replica = strategy.run(replica, args=(features, labels))
            total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        flags.agreed.assign(tf.maximum(flags.agreed, tf.cast(total[1:] > 0, tf.float32)))
        return total[0]

    return train_step
