"""One model on every rank: the state each replica keeps to itself made equal.

BatchNormalization's moving mean and variance are updated by each replica from its own shard
of the batch (:func:`hpctf.compute.compat.keras_variables.replica_local_variables`); the trainable
weights stay equal (their gradients are all-reduced), these do not. Only the chief's copy is
saved, so without this the in-run evaluation is not the saved model's, and a resumed run
(every rank restored from the chief's copy) differs from an uninterrupted one.

:class:`ReplicaState` averages them across every replica of every worker before each save and
each evaluation. Averaging, not the chief's copy: both statistics are exponential moving
averages, linear in the batch statistics, so the average at any step is the same whether or
not it was also taken at earlier steps: a resumed run's statistics match an uninterrupted
run's at every save and evaluation (to float rounding), and they are the statistics of the
global batch's shards, not of one rank's.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from hpctf.compute.compat.keras_variables import replica_local_variables

log = logging.getLogger("hpctf.worker")


class ReplicaState:
    """The replica-local state of ``objects``' models under ``strategy``; :meth:`equalize`
    averages it across replicas. Every rank calls :meth:`equalize` at the same point (one
    all-reduce inside); a no-op with one replica or no such state."""

    def __init__(self, strategy: Any, objects: dict[str, Any]) -> None:
        self._variables = replica_local_variables(objects)
        self._replicas = int(strategy.num_replicas_in_sync)
        self._strategy = strategy
        self._step: Any = None
        if self._variables and self._replicas > 1:
            log.info(
                "%d BatchNormalization statistics are averaged across %d replicas at each save "
                "and evaluation (each replica updates them from its own shard)",
                len(self._variables),
                self._replicas,
            )

    def __bool__(self) -> bool:
        return bool(self._variables) and self._replicas > 1

    def equalize(self) -> None:
        """Set every replica's copy to the mean over all replicas."""
        if not self:
            return
        if self._step is None:
            self._step = self._make_step()
        self._step()

    def _make_step(self) -> Any:
        variables, strategy = self._variables, self._strategy

        def replica_fn() -> None:
            context = tf.distribute.get_replica_context()
            # A replica-context read is this replica's own copy (aggregation NONE).
            values = [tf.identity(_value(v)) for v in variables]
            means = context.all_reduce(tf.distribute.ReduceOp.MEAN, values)
            for variable, mean in zip(variables, means, strict=True):
                variable.assign(mean)

        @tf.function
        def equalize() -> None:
            strategy.run(replica_fn)

        return equalize


def _value(variable: Any) -> Any:
    """The TF variable under a Keras 3 variable (tf_keras's is one)."""
    return variable if isinstance(variable, tf.Variable) else variable.value
