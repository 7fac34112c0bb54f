"""The built-in loop's evaluation (:class:`Evaluator`): mean loss and metrics over the whole
validation set, summed across workers, logged and recorded by the chief.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import tensorflow as tf

from hpctf.api import DataSource, Task
from hpctf.compute.loop.session import Session
from hpctf.compute.users_code import attribution as user_code

log = logging.getLogger("hpctf.worker")


class Evaluator:
    """Mean loss and metrics over the whole validation set, summed across workers.

    Built once per run, so its ``tf.function`` is traced once (and once more for a last,
    smaller batch), not at every evaluation.
    """

    def __init__(self, session: Session, eval_data: DataSource, task: Task) -> None:
        strategy = self._strategy = session.strategy
        self._keepalive = session.keepalive
        self._record = session.record
        self._equalize = session.equalize
        self._dataset = session.evaluation_dataset(eval_data)
        # build_task resolved the metrics to name -> per-example function.
        functions = {"loss": task.loss, **cast(Mapping[str, Any], task.metrics)}

        def replica_sums(features: Any, labels: Any) -> dict[str, Any]:
            predicted = user_code.model_call(task.model, features, training=False)
            predictions = tf.cast(predicted, tf.float32)
            sums = {
                name: tf.reduce_sum(
                    tf.cast(user_code.metric_call(fn, labels, predictions), tf.float64)
                )
                for name, fn in functions.items()
            }
            sums["count"] = tf.cast(tf.shape(labels)[0], tf.float64)
            return sums

        @tf.function(reduce_retracing=True)
        def eval_step(features: Any, labels: Any) -> dict[str, Any]:
            per_replica = strategy.run(replica_sums, args=(features, labels))
            return {
                name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for name, value in per_replica.items()
            }

        self._eval_step = eval_step

    def at(self, step: int) -> dict[str, float]:
        """Evaluate at ``step``: the results logged, recorded (group ``eval``) and returned."""
        self._equalize()  # every rank scores the model the checkpoint holds
        results = self()
        log.info("eval at step %d: %s", step, " ".join(f"{k} {v:.4f}" for k, v in results.items()))
        self._record(step, results, group="eval")
        return results

    def __call__(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for features, labels in self._strategy.experimental_distribute_dataset(self._dataset):
            for name, value in self._eval_step(features, labels).items():
                totals[name] = totals.get(name, 0.0) + float(value)
            self._keepalive("evaluation batch")
        count = totals.pop("count", 0.0)
        return {name: value / count for name, value in totals.items()} if count else {}
