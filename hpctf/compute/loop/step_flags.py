"""Preemption warnings carried in the step's own reduction: no extra collective per step.

The ranks must agree on one step to save at when any of them is warned. A separate agreement
(:meth:`hpctf.compute.loop.preemption.PreemptionWatch.agree` over a gather) costs one more
collective and a host sync every ``train.preemption_check_every_steps`` steps, warned or not:
about 5 points of the digits example's runtime (issue #21). Each built-in step already reduces
its loss across every replica (``strategy.reduce(SUM, loss)`` in
:func:`hpctf.compute.loop.training.make_train_step`); here that one reduction carries, beside
the loss, one count per watched signal (the rank's ``pending`` flags, which its signal handler
raises), the rank's vote for a save by time (``checkpoint.every_seconds``) and the rank's
seconds per step. What comes back is the same on every rank after the
same step, so every rank folds it into ``agreed`` (sticky) and ``step_ms`` at the same step,
and reading them every N steps (a local read, no collective) gives every rank the same answer
at the same step: the save is at one agreed step, as before.

Why this cannot deadlock or miss a warning: no collective is added or made conditional (the
vector replaces the scalar in a reduction every rank already runs at every step); a flag,
once raised, stays raised until the run exits, so a warning that lands between two steps is in
the next step's reduction; and every rank decides from values read after the same step number,
which are the same everywhere. The check cadence comes from those same values (the step times
are whole milliseconds, exact in float32 up to 2**24, so their sum is the same bits on every
rank whatever the order of the additions), so every rank checks at the same steps. The bound
from warning to save is the check cadence in steps plus one step.

Only hpctf's built-in loop carries the flags
(:meth:`hpctf.compute.loop.session.Session.step_flags`); a custom loop or ``model.fit`` keeps
the gather.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hpctf.compute.compat.tensorflow_internals import fixed_instance_keys
from hpctf.compute.loop.preemption import Agreement

WATCHED = (signal.SIGUSR2, signal.SIGTERM)  # Slurm's warning; a preemption or the time limit
_MS_EXACT = float(1 << 24)  # float32 holds whole numbers exactly up to here


class StepFlags:
    """This rank's pending warnings and step time, and what every rank had as of the last step.

    Create it outside the strategy's scope: all are plain local variables.
    """

    def __init__(self) -> None:
        self.pending = tf.Variable(tf.zeros([len(WATCHED)]), trainable=False, name="pending")
        self.agreed = tf.Variable(tf.zeros([len(WATCHED)]), trainable=False, name="agreed")
        self.my_step_ms = tf.Variable(0.0, trainable=False, name="my_step_ms")
        self.step_ms = tf.Variable(0.0, trainable=False, name="step_ms")  # summed over replicas
        self.my_save_vote = tf.Variable(0.0, trainable=False, name="my_save_vote")
        self.save_votes = tf.Variable(0.0, trainable=False, name="save_votes")  # as step_ms
        self._raised: list[int] = []  # set by the signal handler: no TensorFlow call there
        self._pushed = 0
        self._vote = 0.0  # what my_save_vote holds, so an unchanged vote costs no assignment

    def raise_flag(self, signum: int) -> None:
        """For the signal handler: remember ``signum`` (one of :data:`WATCHED`)."""
        if signum in WATCHED and signum not in self._raised:
            self._raised.append(signum)

    def push(self) -> None:
        """Before a step, in the loop: put flags raised since the last push into ``pending``.
        Not in the signal handler: it may run while a ``tf.function`` is being traced, and an
        assignment there would land in that graph."""
        if len(self._raised) == self._pushed:
            return
        for signum in self._raised[self._pushed :]:
            self.pending[WATCHED.index(signum)].assign(1.0)
        self._pushed = len(self._raised)

    def agree(self, step_seconds: float, replicas: int, save_vote: bool = False) -> Agreement:
        """At a check: the signal some rank had got as of the last step (SIGTERM over SIGUSR2,
        as the gather's agreement; 0 for none), the ranks' mean seconds per step as they last
        brought it, and whether any rank's vote for a save by time was in the last step, the
        same on every rank after the same step. Brings ``step_seconds`` and ``save_vote``
        (this rank's) to the next steps; a vote that this agreement's save answers is not
        brought again. Waits for the dispatched steps."""
        counts, summed = self.agreed.numpy(), float(self.step_ms.numpy())
        save = float(self.save_votes.numpy()) > 0
        self.my_step_ms.assign(min(round(step_seconds * 1e3), _MS_EXACT / max(replicas, 1) - 1))
        vote = 1.0 if save_vote and not save else 0.0
        if vote != self._vote:
            self.my_save_vote.assign(vote)
            self._vote = vote
        signum = max((int(s) for s, c in zip(WATCHED, counts, strict=True) if c > 0), default=0)
        return Agreement(signum, summed / max(replicas, 1) / 1e3, save)


def flagged_train_step(
    strategy: Any, replica_step: Callable[[Any, Any], Any], flags: StepFlags
) -> Callable[..., Any]:
    """``train_step(iterator, steps=1)``: ``steps`` steps in one call of one ``tf.function``
    (as Keras's ``steps_per_execution``: the Python of a call is paid once for them), each
    running ``replica_step`` on the next batch on every replica, with the flags in the step's
    one reduction. Returns the last step's loss summed over replicas; folds every rank's
    pending flags into ``flags.agreed`` and step times into ``flags.step_ms``."""

    def replica(features: Any, labels: Any) -> Any:
        loss = tf.reshape(tf.cast(replica_step(features, labels), tf.float32), [1])
        step_ms = tf.reshape(flags.my_step_ms.read_value(), [1])
        vote = tf.reshape(flags.my_save_vote.read_value(), [1])
        return tf.concat([loss, flags.pending.read_value(), vote, step_ms], axis=0)

    @tf.function
    def train_steps(iterator: Any, steps: Any) -> Any:
        loss = tf.constant(0.0)
        # Traced once (a tensor count, one iterator per run): keys fixed at trace time keep
        # RSS flat (fixed_instance_keys).
        with fixed_instance_keys():
            for _ in tf.range(steps):
                features, labels = next(iterator)
                per_replica = strategy.run(replica, args=(features, labels))
                total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
                seen = tf.cast(total[1 : 1 + len(WATCHED)] > 0, tf.float32)
                flags.agreed.assign(tf.maximum(flags.agreed, seen))
                flags.save_votes.assign(total[-2])
                flags.step_ms.assign(total[-1])
                loss = total[0]
        return loss

    counts: dict[int, Any] = {}  # a tensor per count: a Python int would trace once per value

    def train_step(iterator: Any, steps: int = 1) -> Any:
        count = counts.get(steps)
        if count is None:
            count = counts[steps] = tf.constant(steps, tf.int32)
        return train_steps(iterator, count)

    return train_step
