"""``tracking:`` at validate, render and submit: a tracker whose package the compute nodes'
Python lacks is one line here, not a warning in the rank log after the job started.
Checked only when the compute nodes run this same interpreter (no site ``python``/``venv``),
as the training entry is (:func:`hpctf.login.resolving.loader.entry_problem`)."""

from __future__ import annotations

import importlib.util

from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.sources import KeyPath

# Tracker -> (the module the chief imports, what to install).
PACKAGES = {
    "mlflow": ("mlflow", "pip install mlflow-skinny (or mlflow; the extra hpctf[mlflow])"),
    "wandb": ("wandb", "pip install 'wandb>=0.19.10,<0.31' (the extra hpctf[wandb])"),
}


def tracking_problems(config: ResolvedConfig) -> list[tuple[KeyPath, str]]:
    if config.site.python or config.site.venv:
        return []  # another environment: hpctf worker says so in the rank log if it lacks one
    tracking = config.experiment.tracking
    configured = {"mlflow": tracking.mlflow, "wandb": tracking.wandb}
    problems: list[tuple[KeyPath, str]] = []
    for tracker, settings in configured.items():
        module, install = PACKAGES[tracker]
        if settings is not None and importlib.util.find_spec(module) is None:
            problems.append(
                (("tracking", tracker), f"the {module} package is not installed here: {install}")
            )
    return problems
