"""Preemption warnings carried in the steps' own reduction: no extra collective.

The ranks must agree on one step to save at when any of them is warned. A separate agreement
(:meth:`hpctf.compute.loop.preemption.PreemptionWatch.agree` over a gather) costs one more
collective and a host sync every ``train.preemption_check_every_steps`` steps, warned or not:
about 5 points of the digits example's runtime (issue #21). The built-in loop runs the steps up
to the next one that calls for anything in one call, and reduces the last step's loss across
every replica (``strategy.reduce(SUM, loss)``, :func:`flagged_train_step`; the steps before it
reduce only their gradients); here that one reduction carries, beside the loss, one count per
watched signal (the rank's flags, which its signal handler raises), the rank's vote to prune
the run (a search's trial: :mod:`hpctf.compute.loop.pruning`), the rank's vote for a save by
time (``checkpoint.every_seconds``) and the rank's seconds per step. What comes back is the
same on every rank after the same call; reading it after a call (a local read, no collective)
gives every rank the same answer at the same step: the save is at one agreed step, as before.
A flag stays raised on its rank, so the count in any later call's vector still holds it.

Why this cannot deadlock or miss a warning: no collective is added or made conditional (the
vector replaces the scalar in a reduction every rank runs at the end of every call); a flag,
once raised, stays raised until the run exits, so a warning that lands between two calls is in
the next call's reduction; and every rank decides from values read after the same step number,
which are the same everywhere. The check cadence comes from those same values (the step times
are whole milliseconds, exact in float32 up to 2**24, so their sum is the same bits on every
rank whatever the order of the additions), so every rank checks at the same steps. The bound
from warning to save is the check cadence in steps plus one step.

Only hpctf's built-in loop carries the flags
(:meth:`hpctf.compute.loop.session.Session.step_flags`); a custom loop or ``model.fit`` keeps
the gather.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hpctf.compute.compat.tensorflow_internals import fixed_instance_keys
from hpctf.compute.loop.agreement import WATCHED_SIGNALS, Agreement

_MS_EXACT = float(1 << 24)  # float32 holds whole numbers exactly up to here


class StepFlags:
    """What this rank brings to the next steps (its pending warnings, its vote for a save by
    time, its step time: one local variable, written between calls only when it changes) and
    what every rank brought as of the last step (the last call's reduced vector, kept as the
    call returned it: no assignment inside the steps).

    Create it outside the strategy's scope: a plain local variable.
    """

    def __init__(self) -> None:
        self._mine = [0.0] * _WIDTH  # flags, prune vote, save vote, step ms: ``brought``
        self.brought = tf.Variable(self._mine, trainable=False, name="brought")
        self.last: Any = None  # the last step's reduced vector: loss, then ``brought`` summed
        self._raised: list[int] = []  # set by the signal handler: no TensorFlow call there
        self._pushed = 0

    def raise_flag(self, signum: int) -> None:
        """For the signal handler: remember ``signum`` (one of :data:`WATCHED_SIGNALS`)."""
        if signum in WATCHED_SIGNALS and signum not in self._raised:
            self._raised.append(signum)

    def push(self) -> None:
        """Before a step, in the loop: put flags raised since the last push into what this rank
        brings. Not in the signal handler: it may run while a ``tf.function`` is being traced,
        and an assignment there would land in that graph."""
        if len(self._raised) == self._pushed:
            return
        for signum in self._raised[self._pushed :]:
            self._mine[WATCHED_SIGNALS.index(signum)] = 1.0
        self._pushed = len(self._raised)
        self.brought.assign(self._mine)

    def vote_prune(self) -> None:
        """This rank (the chief, for a search's trial) votes to prune the run: from the next
        call on every step carries the vote, and :attr:`pruned` says so on every rank after
        it. A vote, once cast, stays: the run ends at the agreed step."""
        if not self._mine[_PRUNE]:
            self._mine[_PRUNE] = 1.0
            self.brought.assign(self._mine)

    @property
    def pruned(self) -> bool:
        """Whether some rank's vote to prune was in the last step (the same on every rank after
        the same call; waits for it)."""
        return bool(self._summed()[_PRUNE] > 0)

    @property
    def agreed(self) -> list[float]:
        """Per watched signal, how many ranks had it as of the last step (a rank's flag, once
        raised, stays raised: so does the count)."""
        return [float(v) for v in self._summed()[: len(WATCHED_SIGNALS)]]

    def _summed(self) -> Any:
        if self.last is None:
            return [0.0] * _WIDTH
        return self.last.numpy()[1:]

    def agree(self, step_seconds: float, replicas: int, save_vote: bool = False) -> Agreement:
        """At a check: the signal some rank had got as of the last step (SIGTERM over SIGUSR2,
        as the gather's agreement; 0 for none), the ranks' mean seconds per step as they last
        brought it, and whether any rank's vote for a save by time was in the last step, the
        same on every rank after the same step. Brings ``step_seconds`` and ``save_vote``
        (this rank's) to the next steps; a vote that this agreement's save answers is not
        brought again. Waits for the dispatched steps."""
        summed = self._summed()
        counts, save, step_ms = summed[: len(WATCHED_SIGNALS)], summed[-2] > 0, float(summed[-1])
        mine = list(self._mine)
        mine[-2] = 1.0 if save_vote and not save else 0.0
        mine[-1] = min(round(step_seconds * 1e3), _MS_EXACT / max(replicas, 1) - 1)
        if mine != self._mine:
            self._mine = mine
            self.brought.assign(mine)
        signum = max(
            (int(s) for s, c in zip(WATCHED_SIGNALS, counts, strict=True) if c > 0), default=0
        )
        return Agreement(signum, step_ms / max(replicas, 1) / 1e3, bool(save))


def flagged_train_step(
    strategy: Any, replica_step: Callable[[Any, Any], Any], flags: StepFlags
) -> Callable[..., Any]:
    """``train_step(iterator, steps=1)``: ``steps`` steps in one call of one ``tf.function``
    (as Keras's ``steps_per_execution``: the Python of a call is paid once for them), each
    running ``replica_step`` on the next batch on every replica, with what every rank brings
    (``flags.brought``, read once per call) in the last step's reduction, the call's one.
    Returns the last step's loss summed over replicas; keeps the last step's reduced vector in
    ``flags.last``.

    Nothing but that reduction is added to a call: the vector leaves with the call's result, so
    no variable is written inside the steps (a write per step cost about a point of the digits
    example's runtime)."""

    train_steps = _steps_function(strategy, replica_step, flags)
    counts: dict[int, Any] = {}  # a tensor per count: a Python int would trace once per value

    def train_step(iterator: Any, steps: int = 1) -> Any:
        count = counts.get(steps)
        if count is None:
            count = counts[steps] = tf.constant(steps, tf.int32)
        loss, flags.last = train_steps(iterator, count)
        return loss

    return train_step


def _steps_function(
    strategy: Any, replica_step: Callable[[Any, Any], Any], flags: StepFlags
) -> Any:
    """The ``tf.function`` of :func:`flagged_train_step`: ``(iterator, steps)`` -> the last
    step's loss and reduced vector."""

    # Not converted by autograph (as Keras's own steps_per_execution loop): converting this
    # closure took 1.6 s of the first step's 2.5 s (measured, TF 2.21, a loaded 2-core VM),
    # against 0.3 s for a hand-written loop whose steps are the same. The steps' code runs
    # as written: the user's model and loss are Keras's to trace, as under model.fit.
    @tf.function(autograph=False)
    def train_steps(iterator: Any, steps: Any) -> Any:
        brought = tf.reshape(flags.brought.read_value(), [_WIDTH])

        def bare(features: Any, labels: Any) -> None:
            replica_step(features, labels)

        def replica(features: Any, labels: Any) -> Any:
            loss = tf.reshape(tf.cast(replica_step(features, labels), tf.float32), [1])
            return tf.concat([loss, brought], axis=0)

        def step(done: Any) -> Any:
            features, labels = next(iterator)
            strategy.run(bare, args=(features, labels))
            return done + 1

        # Traced once (a tensor count, one iterator per run): keys fixed at trace time keep
        # RSS flat (fixed_instance_keys). The steps before the call's last one reduce nothing
        # but their gradients (a loss nobody reads costs a collective a step: about a third of
        # the digits example's steps/s, measured against a plain loop of 10 steps per call).
        # The ops of the loop's body run in order, the iterator's and the variables' alike:
        # a tf.function orders a body's stateful ops (automatic control dependencies).
        with fixed_instance_keys():
            tf.while_loop(lambda done: done < steps - 1, step, (tf.constant(0),))
            features, labels = next(iterator)
            per_replica = strategy.run(replica, args=(features, labels))
            total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total[0], total

    return train_steps


_PRUNE = len(WATCHED_SIGNALS)  # where a rank's vote to prune is, after its flags
_WIDTH = len(WATCHED_SIGNALS) + 3  # what a rank brings: its flags, prune vote, save vote, step time
