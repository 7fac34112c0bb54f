"""A sweep's points ranked by a metric: ``hpctf status SWEEP --sort eval.accuracy --top K``
and :meth:`hpctf.Sweep.best`. Pure: it reads the point documents of
:func:`hpctf.login.sweeps.sweep_dir.point_documents`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from hpctf.core.errors import UserError
from hpctf.core.run.metrics_history import eval_metric

Mode = Literal["max", "min"]


# Metric names where lower is better, as Keras names them (keras.metrics and keras.losses):
# a name holding one of these ranks lowest first; any other (accuracy, auc, precision, ...)
# highest first. ``--sort NAME:min`` or ``:max`` says it outright.
_LOWER_IS_BETTER = (
    "loss", "error", "mae", "mse", "mape", "msle", "rmse", "crossentropy", "hinge",
    "perplexity", "divergence", "poisson", "logcosh", "huber", "wer", "cer",
)  # fmt: skip


def default_mode(metric: str) -> Mode:
    """Lower is better for names holding ``loss``, ``error``, ``mae``, ``mse``, ``rmse``,
    ``crossentropy`` and the like (:data:`_LOWER_IS_BETTER`), higher for the rest (as a
    sweep's best evaluation is chosen)."""
    name = metric.rsplit(".", 1)[-1].lower()
    return "min" if any(word in name for word in _LOWER_IS_BETTER) else "max"


def split_mode(sort: str) -> tuple[str, Mode | None]:
    """``eval.mae:min`` -> (``eval.mae``, ``min``); without a suffix the mode is None (the
    name's default)."""
    metric, sep, mode = sort.rpartition(":")
    if not sep:
        return sort, None
    if mode not in ("max", "min"):
        raise UserError(f"--sort {sort!r}: after ':' give min or max, e.g. eval.mae:min")
    return metric, mode  # type: ignore[return-value]


def metric_value(document: Mapping[str, Any], metric: str) -> float | None:
    """A point's value of ``metric``: ``eval.NAME`` (its last evaluation), ``best_eval.NAME``
    (its best one), ``loss`` (its last logged training loss), or a bare ``NAME`` (``eval.NAME``).
    None when the point has not logged it (yet)."""
    section, _, name = metric.partition(".")
    if not name:
        section, name = ("loss", "") if metric == "loss" else ("eval", metric)
    if section == "loss":
        value = document.get("loss")
    elif section in ("eval", "best_eval"):
        value = eval_metric(document.get(section), name)  # a fit script's val_NAME too
    else:
        raise UserError(
            f"--sort {metric!r}: expected eval.NAME, best_eval.NAME or loss, e.g. eval.accuracy"
        )
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rank(
    documents: Sequence[Mapping[str, Any]],
    metric: str,
    mode: Mode | None = None,
    top: int | None = None,
) -> list[Mapping[str, Any]]:
    """The points best first by ``metric`` (``NAME:min``/``NAME:max``, or ``mode``, default by
    its name), those without a value last in point order; the first ``top`` when given."""
    metric, said = split_mode(metric)
    mode = mode or said or default_mode(metric)
    if mode not in ("max", "min"):
        raise UserError(f"mode {mode!r}: expected max or min")
    valued = [(metric_value(d, metric), i, d) for i, d in enumerate(documents)]
    with_value = sorted(
        ((v, i, d) for v, i, d in valued if v is not None),
        key=lambda t: (-t[0] if mode == "max" else t[0], t[1]),
    )
    ranked = [d for _, _, d in with_value] + [d for v, _, d in valued if v is None]
    return ranked[:top] if top is not None else ranked
