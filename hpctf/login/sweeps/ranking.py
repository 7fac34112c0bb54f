"""A sweep's points ranked by a metric: ``hpctf status SWEEP --sort eval.accuracy --top K``
and :meth:`hpctf.Sweep.best`. Pure: it reads the point documents of
:func:`hpctf.login.sweeps.sweep_dir.point_documents`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from hpctf.core.errors import UserError

Mode = Literal["max", "min"]


def default_mode(metric: str) -> Mode:
    """Lower is better for names with ``loss`` or ``error`` in them, higher for the rest (as
    a sweep's best evaluation is chosen)."""
    name = metric.rsplit(".", 1)[-1]
    return "min" if "loss" in name or "error" in name else "max"


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
        value = (document.get(section) or {}).get(name)
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
    """The points best first by ``metric`` (``mode``: ``max``/``min``, default by its name),
    those without a value last in point order; the first ``top`` when given."""
    mode = mode or default_mode(metric)
    if mode not in ("max", "min"):
        raise UserError(f"mode {mode!r}: expected max or min")
    valued = [(metric_value(d, metric), i, d) for i, d in enumerate(documents)]
    with_value = sorted(
        ((v, i, d) for v, i, d in valued if v is not None),
        key=lambda t: (-t[0] if mode == "max" else t[0], t[1]),
    )
    ranked = [d for _, _, d in with_value] + [d for v, _, d in valued if v is None]
    return ranked[:top] if top is not None else ranked
