"""Keras's ``fit``, ``evaluate`` and ``predict`` under MultiWorkerMirroredStrategy, made exact
from outside Keras, before a ``train.script`` runs (:func:`prepare_fit`).

Keras 3 (keras-team/keras#20585, open), in ``keras/src/backend/tensorflow/trainer.py``:

- ``TensorFlowTrainer._maybe_symbolic_build`` (Keras >= 3.5) reduces the whole nested data batch
  with ``strategy.reduce("MEAN", batch, axis=None)`` only to learn its shapes; the multi-worker
  strategy's ``reduce`` takes no nested values, so ``fit`` fails at its first batch. Built here
  from the worker's first local replica instead: the same shapes, no collective.
- ``reduce_per_replica``'s multi-worker branch reduces the step's scalar logs with
  ``strategy.reduce("MEAN", v, axis=0)`` ("Invalid reduction dimension 0"); ``axis=None``
  averages across the replicas, which is the global mean of equal shards.
- Keras < 3.5 lacks the cross-worker gradient sum (keras #19969, #20051: fixed in 3.5.0): its
  workers drift apart silently. Refused with more than one worker.
- ``steps_per_execution > 1`` still fails under several workers: refused in one line.
- A model's own ``train_step`` or ``test_step`` (Keras's guide "Customizing what happens in
  fit()"): under a strategy ``compute_loss`` and every Keras loss return the replica's share
  (``keras/src/losses/loss.py``, ``scale_loss_for_distribution``: loss / replicas) so that the
  optimizer's sum of the replicas' gradients (``TFOptimizer._all_reduce_sum_gradients``) is a
  mean. Keras's own trackers multiply it back; a tracker of the user's records 1/N of the truth,
  and a term the user adds to that loss is counted N times in the summed gradient. While a
  model's own step runs (:func:`own_steps_as_on_one_machine`) both are made as on one machine
  instead: losses are the replica's batch mean and the gradients are averaged across replicas
  (:mod:`.keras_own_steps`).

tf_keras (``train.keras: 2``), ``tf_keras/src/engine/training.py``: ``reduce_per_replica``'s
``"auto"`` means ``"sum"`` under this strategy, so ``fit`` reports loss and metrics summed over
the replicas (2 workers: loss 4.03 shown where the model evaluates to 1.99). ``"auto"`` is read
as the mean across replicas here.

Both: a model built outside any strategy's scope, fitted on several workers, would train one
separate copy per worker, silently. ``fit`` refuses that before its first step.

What ``fit`` was called with, for a resume: :mod:`.fit_input`; the variables of a model a
checkpoint holds beyond ``tf.train.Checkpoint(model=...)``: :mod:`.keras_variables`.

Checked against (the names this module and those beside it replace or read):

========================= ==================================================================
keras 3.15.1              ``TensorFlowTrainer._maybe_symbolic_build``, ``_symbolic_build``,
                          ``trainer.reduce_per_replica``, ``steps_per_execution``; for a resume
                          (:mod:`hpctf.compute.script.fit`) ``Model._initial_epoch``,
                          ``metrics_variables`` and the ``seed_generator_state`` variables;
                          ``losses.loss.scale_loss_for_distribution``,
                          ``unscale_loss_for_distribution``,
                          ``TFOptimizer._all_reduce_sum_gradients``, ``Model.evaluate``
tf_keras 2.21.0           ``training.reduce_per_replica``, ``Model.fit``,
                          ``Model._training_state``
========================= ==================================================================

Each name is looked up, never assumed: where one is missing :func:`prepare_fit` says so in its
one line and leaves Keras as it is (a fit that fails then fails in Keras, with Keras's error).
``tests/test_compat_canaries.py`` fails, naming the name and the versions, when one moves.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctf.compute.compat.fit_input import FitInput, input_continues, reshuffled_each_epoch
from hpctf.compute.compat.keras_own_steps import own_steps_as_on_one_machine, own_steps_patched
from hpctf.core.errors import UserError

FIRST_EXACT_KERAS_3 = (3, 5)

NO_STRATEGY = (
    "model.fit on {workers} workers with a model built outside a MultiWorkerMirroredStrategy "
    "scope would train {workers} separate copies: in {script} create `strategy = "
    "tf.distribute.MultiWorkerMirroredStrategy()` first, and build and compile the model under "
    "`with strategy.scope():`"
)


@dataclass(frozen=True)
class FitSupport:
    """What :func:`prepare_fit` found and did: the line every rank logs once."""

    keras: str
    version: str
    patched: tuple[str, ...]
    missing: tuple[str, ...]

    def line(self) -> str:
        done = ", ".join(self.patched) or "nothing patched"
        gone = ""
        if self.missing:
            gone = f"; not found, left as Keras has it: {', '.join(self.missing)}"
        return f"{self.keras} {self.version} fit under MultiWorkerMirroredStrategy: {done}{gone}"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"3.15.1"`` -> ``(3, 15, 1)``; a pre-release's letters end its number (``3.5.0rc1``)."""
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
    return tuple(parts)


def check_keras_3(version: str, workers: int) -> None:
    """A UserError for a Keras 3 whose ``fit`` cannot be made exact on ``workers`` workers."""
    if workers > 1 and version_tuple(version)[:2] < FIRST_EXACT_KERAS_3:
        raise UserError(
            f"Keras {version} cannot train on {workers} workers: before 3.5 its fit does not "
            "sum gradients across workers (keras-team/keras#19969), so they drift apart. "
            "Install keras>=3.5 on the compute nodes, or set train.keras: 2 (tf_keras)"
        )


def prepare_fit(legacy: bool, workers: int, script: str) -> FitSupport:
    """Make this process's Keras ``fit`` exact under MultiWorkerMirroredStrategy on
    ``workers`` workers; ``legacy``: tf_keras (``train.keras: 2``) rather than Keras 3.
    Imports TensorFlow and Keras; a UserError when the installed Keras cannot be made exact."""
    if legacy:
        return _prepare_tf_keras(workers, script)
    return _prepare_keras_3(workers, script)


# --- Keras 3 ---------------------------------------------------------------------------------


def _prepare_keras_3(workers: int, script: str) -> FitSupport:
    import keras

    version = keras.version()
    check_keras_3(version, workers)
    trainer: Any = importlib.import_module("keras.src.backend.tensorflow.trainer")
    patched: list[str] = []
    missing: list[str] = []
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is not None and all(
        hasattr(cls, name) for name in ("_maybe_symbolic_build", "_symbolic_build")
    ):
        cls._maybe_symbolic_build = _maybe_symbolic_build
        patched.append("build from the local replica")
    else:
        missing.append("TensorFlowTrainer._maybe_symbolic_build")
    original = getattr(trainer, "reduce_per_replica", None)
    if original is not None and not getattr(original, "_hpctf", False):
        trainer.reduce_per_replica = _mean_across_replicas(original, {"auto", "mean"})
        patched.append("logs averaged across replicas")
    elif original is None:
        missing.append("trainer.reduce_per_replica")
    one_machine = own_steps_patched(trainer)
    if one_machine:
        missing.extend(one_machine)
    else:
        patched.append("a model's own train_step and test_step as on one machine")
    if cls is not None and hasattr(cls, "fit"):
        before = None if one_machine else own_steps_as_on_one_machine
        cls.fit = _refusing_copies(cls.fit, workers, script, before)
        if hasattr(cls, "evaluate") and before is not None:
            cls.evaluate = _before(cls.evaluate, before)
        patched.append("fit without a strategy refused")
    return FitSupport("keras", version, tuple(patched), tuple(missing))


def _before(method: Any, prepare: Callable[[Any], object]) -> Any:
    """``method`` of a model, with ``prepare(model)`` called first."""
    if getattr(method, "_hpctf", False):
        return method

    @functools.wraps(method)
    def prepared(self: Any, *args: Any, **kwargs: Any) -> Any:
        prepare(self)
        return method(self, *args, **kwargs)

    prepared._hpctf = True  # type: ignore[attr-defined]
    return prepared


def _multi_worker(strategy: Any) -> bool:
    import tensorflow as tf

    extended = getattr(strategy, "extended", None)
    in_multi_worker = getattr(extended, "_in_multi_worker_mode", None)
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        in_multi_worker is not None and in_multi_worker()
    )


def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> None:
    """Keras 3's ``TensorFlowTrainer._maybe_symbolic_build``, with the batch's shapes taken
    from the first local replica instead of a ``strategy.reduce`` of the whole batch."""
    import tensorflow as tf
    from keras.src import tree

    if self._distribute_strategy is None:
        return  # no strategy: Keras builds when it traces the step
    strategy = self.distribute_strategy
    if _multi_worker(strategy) and int(getattr(self, "steps_per_execution", 1) or 1) > 1:
        raise UserError(
            f"compile(steps_per_execution={self.steps_per_execution}) fails in Keras 3 under "
            f"MultiWorkerMirroredStrategy with {strategy.num_replicas_in_sync} replicas: use "
            "steps_per_execution=1 (the default)"
        )
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)

            def local(value: Any) -> Any:
                if isinstance(value, tf.distribute.DistributedValues):
                    return strategy.experimental_local_results(value)[0]
                return value

            data_batch = tree.map_structure(local, batch)
            break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def _mean_across_replicas(original: Any, readings: set[str]) -> Any:
    """``reduce_per_replica`` that reads the reductions in ``readings`` as the mean across every
    replica of every worker (``axis=None``) under the multi-worker strategy, and leaves the
    rest (``concat`` for predict, ``sum``, ``first``, other strategies) to ``original``."""

    @functools.wraps(original)
    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction not in readings or not _multi_worker(strategy):
            return original(values, strategy, reduction)
        import tensorflow as tf

        def mean(value: Any) -> Any:
            if isinstance(value, (tf.distribute.DistributedValues, tf.Tensor)):
                return strategy.reduce("MEAN", value, axis=None)
            return value

        return tf.nest.map_structure(mean, values)

    reduce_per_replica._hpctf = True  # type: ignore[attr-defined]
    return reduce_per_replica


def _refusing_copies(
    fit: Any, workers: int, script: str, prepare: Callable[[Any], object] | None = None
) -> Any:
    """``fit`` that notes where its input continues (:func:`input_continues`) and raises a
    UserError, before its first step, for a model built outside any strategy's scope while
    ``workers`` > 1 (one separate training per worker); ``prepare(model)`` then, if given."""
    if getattr(fit, "_hpctf", False):
        return fit

    @functools.wraps(fit)
    def checked_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = getattr(self, "_distribution_strategy", None) or getattr(
            self, "_distribute_strategy", None
        )
        if workers > 1 and (strategy is None or not _multi_worker(strategy)):
            name = script.rsplit("/", 1)[-1]
            raise UserError(NO_STRATEGY.format(workers=workers, script=name))
        data = args[0] if args else kwargs.get("x")
        continues = input_continues(data, kwargs.get("steps_per_epoch"))
        self._hpctf_fit = FitInput(
            continues,
            int(kwargs.get("initial_epoch") or 0),
            not continues and reshuffled_each_epoch(data, kwargs.get("shuffle", True)),
        )
        if prepare is not None:
            prepare(self)
        return fit(self, *args, **kwargs)

    checked_fit._hpctf = True  # type: ignore[attr-defined]
    return checked_fit


# --- tf_keras --------------------------------------------------------------------------------


def _prepare_tf_keras(workers: int, script: str) -> FitSupport:
    import tf_keras

    training: Any = importlib.import_module("tf_keras.src.engine.training")
    patched: list[str] = []
    missing: list[str] = []
    original = getattr(training, "reduce_per_replica", None)
    if original is not None and not getattr(original, "_hpctf", False):
        training.reduce_per_replica = _mean_across_replicas(original, {"auto"})
        patched.append("logs averaged across replicas, not summed")
    elif original is None:
        missing.append("training.reduce_per_replica")
    model = getattr(training, "Model", None)
    if model is not None:
        model.fit = _refusing_copies(model.fit, workers, script)
        patched.append("fit without a strategy refused")
    return FitSupport("tf_keras", tf_keras.__version__, tuple(patched), tuple(missing))
