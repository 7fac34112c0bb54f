"""What ``model.compile`` takes, as a :class:`hpctf.Task` may give it, resolved once per run.

- optimizer: a Keras optimizer, or its name (``"adam"``; ``keras.optimizers.get``);
- loss: a function ``(y_true, y_pred)`` returning one value per example, a name (``"mse"``,
  ``"sparse_categorical_crossentropy"``; ``keras.losses.get``) or a ``keras.losses.Loss`` with
  any reduction: hpctf uses a copy that reduces nothing (``reduction=None``) and averages over
  the global batch itself (``tf.nn.compute_average_loss``);
- metrics: a mapping name -> metric, or a list of metrics (named by Keras's own names); each a
  function returning one value per example, a name (``"mae"``; ``"accuracy"`` picked after the
  loss, as ``compile`` does), or a Keras metric that is a mean of per-example values
  (``keras.metrics.MeanAbsoluteError()``, ``SparseCategoricalAccuracy()``). hpctf reports each
  metric's mean over the whole validation set, reduced across workers.

What cannot be used is refused in one :class:`UserError` line saying what to write instead,
before the first step.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import keras

from hpctf.core.errors import UserError

PerExample = Callable[[Any, Any], Any]

LOSS_HINT = (
    "a Keras loss name ('mse', 'sparse_categorical_crossentropy'), a keras.losses object, or a "
    "function (y_true, y_pred) returning one value per example"
)
METRIC_HINT = (
    "a Keras metric name ('mae', 'sparse_categorical_accuracy'), a mean metric object "
    "(keras.metrics.MeanAbsoluteError()), or a function (y_true, y_pred) returning one value "
    "per example"
)
# compile(metrics=["accuracy"]) picks the accuracy that fits the loss; so does hpctf.
_ACCURACY_BY_LOSS = (
    ("sparsecategorical", "sparse_categorical_accuracy"),
    ("binary", "binary_accuracy"),
    ("categorical", "categorical_accuracy"),
)


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else type(value).__name__


def resolve_optimizer(value: Any) -> Any:
    """A Keras optimizer from an optimizer or its name."""
    if isinstance(value, keras.optimizers.Optimizer):
        return value
    if isinstance(value, str):
        try:
            return keras.optimizers.get(value)
        except ValueError:
            pass
    raise UserError(
        f"Task optimizer {_shown(value)} is not a Keras optimizer: give one "
        "(keras.optimizers.Adam(1e-3)) or its name ('adam', 'sgd', 'rmsprop', 'adamw')"
    )


def _check_arity(what: str, function: Callable[..., Any]) -> None:
    """UserError unless ``function`` can be called as ``function(y_true, y_pred)``."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or an extension: not judged
    try:
        signature.bind(None, None)
    except TypeError:
        name = getattr(function, "__name__", type(function).__name__)
        raise UserError(
            f"Task {what} {name}{signature} cannot be called as {name}(y_true, y_pred), "
            "which is how hpctf calls it"
        ) from None


def per_example_loss(loss: Any) -> Any:
    """A Keras loss object that reduces nothing (a copy: the user's is left as it is)."""
    clone = copy.copy(loss)
    clone.reduction = None  # Keras 3: no reduction, one value per example
    return clone


def resolve_loss(value: Any) -> PerExample:
    """A loss returning one value per example, from a function, a name or a Keras loss."""
    if isinstance(value, str):
        try:
            value = keras.losses.get(value)
        except ValueError:
            raise UserError(
                f"Task loss {value!r} is not a Keras loss name; give {LOSS_HINT}"
            ) from None
    if isinstance(value, keras.losses.Loss):
        return per_example_loss(value)  # type: ignore[no-any-return]
    if isinstance(value, type) or not callable(value):
        raise UserError(f"Task loss {_shown(value)} is not a loss; give {LOSS_HINT}")
    _check_arity("loss", value)
    return value  # type: ignore[no-any-return]


def _accuracy_for(loss: Any) -> str | None:
    """The accuracy ``compile(metrics=["accuracy"])`` would pick for ``loss``, or None."""
    if isinstance(loss, str):
        text = loss
    elif isinstance(loss, keras.losses.Loss):  # a LossFunctionWrapper's .fn is its function
        text = f"{type(loss).__name__} {getattr(getattr(loss, 'fn', None), '__name__', '')}"
    else:
        text = str(getattr(loss, "__name__", ""))
    text = text.lower().replace("_", "")
    return next((metric for key, metric in _ACCURACY_BY_LOSS if key in text), None)


def _metric(value: Any, loss: Any) -> tuple[str, PerExample]:
    """One metric: its name and a function returning one value per example."""
    if isinstance(value, str):
        wanted = value
        if value.lower() in ("accuracy", "acc"):
            picked = _accuracy_for(loss)
            if picked is None:
                raise UserError(
                    f"Task metric {value!r}: which accuracy cannot be told from the loss; name "
                    "it: 'sparse_categorical_accuracy' (integer labels), "
                    "'categorical_accuracy' (one-hot) or 'binary_accuracy'"
                )
            wanted = picked
        try:
            resolved = keras.metrics.get(wanted)
        except ValueError:
            raise UserError(
                f"Task metric {value!r} is not a Keras metric name; give {METRIC_HINT}"
            ) from None
        return value, _metric(resolved, loss)[1]
    if isinstance(value, keras.metrics.Metric):
        # A MeanMetricWrapper (MeanAbsoluteError, SparseCategoricalAccuracy, ...) averages its
        # function's per-example values: that function is what hpctf needs. Keras keeps it in
        # _fn/_fn_kwargs (keras/src/metrics/reduction_metrics.py).
        function = getattr(value, "_fn", None)
        if not isinstance(value, keras.metrics.MeanMetricWrapper) or function is None:
            raise UserError(
                f"Task metric {type(value).__name__} keeps a state across batches that hpctf "
                f"does not reduce across workers; give {METRIC_HINT}"
            )
        kwargs = dict(getattr(value, "_fn_kwargs", {}) or {})
        return value.name, lambda y_true, y_pred: function(y_true, y_pred, **kwargs)
    if isinstance(value, type) or not callable(value):
        raise UserError(f"Task metric {_shown(value)} is not a metric; give {METRIC_HINT}")
    _check_arity("metric", value)
    return str(getattr(value, "__name__", type(value).__name__)), value


def resolve_metrics(metrics: Any, loss: Any) -> dict[str, PerExample]:
    """name -> per-example function, from a mapping or a list (``loss``: as the Task gave it,
    to pick the accuracy)."""
    if isinstance(metrics, Mapping):
        return {str(name): _metric(value, loss)[1] for name, value in metrics.items()}
    if isinstance(metrics, str) or not isinstance(metrics, list | tuple):
        raise UserError(
            f"Task metrics {_shown(metrics)}: give a list (['mae']) or a mapping "
            "({'mae': 'mae'}) of metrics"
        )
    resolved: dict[str, PerExample] = {}
    for value in metrics:
        name, function = _metric(value, loss)
        if name in resolved:
            raise UserError(f"Task metrics: {name!r} given twice; give each metric once")
        resolved[name] = function
    return resolved


def metric_directions(metrics: Any, loss: Any) -> dict[str, str]:
    """name -> ``"up"`` (higher is better) or ``"down"``, for the Task's metrics as given (before
    :func:`resolve_metrics`), for Keras callbacks whose ``mode`` is ``"auto"``: what Keras 3's
    ``fit`` reads from the compiled metric (its ``_direction``: accuracies, AUC, precision up;
    metrics that wrap a loss down), else tf_keras's rule by name (``acc`` in it, or
    ``fmeasure...``: up). A metric neither tells is left out (Keras then asks for ``mode``).
    Call it outside the strategy's scope: a name becomes a Keras metric, with variables."""
    if isinstance(metrics, Mapping):
        named = [(str(name), value) for name, value in metrics.items()]
    elif isinstance(metrics, list | tuple):
        named = [(_metric(value, loss)[0], value) for value in metrics]
    else:
        return {}
    directions = {}
    for name, value in named:
        direction = _direction(value, loss)
        if direction is None and ("acc" in name or name.startswith("fmeasure")):
            direction = "up"
        if direction is not None:
            directions[name] = direction
    return directions


def _direction(value: Any, loss: Any) -> str | None:
    if isinstance(value, str):
        wanted = _accuracy_for(loss) if value.lower() in ("accuracy", "acc") else value
        try:
            value = keras.metrics.get(wanted or value)
        except ValueError:
            return None
    if isinstance(value, keras.metrics.Metric):
        direction = getattr(value, "_direction", None)  # keras/src/metrics/*: "up" or "down"
        return direction if direction in ("up", "down") else None
    if str(getattr(value, "__module__", "")).startswith("keras.src.losses"):
        return "down"  # a Keras loss function used as a metric, as MeanMetricWrapper says
    return None
