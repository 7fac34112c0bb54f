"""An experiment's ``tracking:`` section: the experiment trackers the chief logs the run to
(:mod:`hpctf.compute.records.tracking`), one tracker run per hpctf run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpctf.core.settings.values import MarkableText, Strict


class MLflowTracking(Strict):
    """Where the chief logs the run in MLflow (:mod:`hpctf.compute.records.tracking`)."""

    tracking_uri: MarkableText | None = Field(
        None, description="e.g. http://mlflow:5000 or file:///path; default: $MLFLOW_TRACKING_URI"
    )
    experiment: str | None = Field(None, description="MLflow experiment; default: the name")


class WandbTracking(Strict):
    """Where the chief logs the run in Weights & Biases (:mod:`hpctf.compute.records.tracking`)."""

    project: str | None = Field(None, description="default: $WANDB_PROJECT, else the name")
    entity: str | None = Field(None, description="team or user; default: $WANDB_ENTITY, W&B's")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="default: $WANDB_MODE, else online; offline writes RUN_DIR/tracking/wandb "
        "for `wandb sync`",
    )


class Tracking(Strict):
    """Experiment trackers: one tracker run per hpctf run, across every requeue and resubmit."""

    mlflow: MLflowTracking | None = None
    wandb: WandbTracking | None = None
