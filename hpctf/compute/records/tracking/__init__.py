"""The chief's experiment trackers (an experiment's ``tracking:`` section): ONE tracker run
per hpctf run, across every requeue and resubmit.

- The tracker's run id is kept in the run directory (``tracking/<tracker>.json``) and resumed
  by every later start, with the last step logged per group, so a step retrained after a
  failure is not logged twice (W&B also refuses a step below its last one) and the parameters
  (the resolved config, ``env`` and ``setup`` left out: they may hold secrets) are logged once.
- Only the chief tracks (:class:`hpctf.compute.records.chief_records.ChiefRecords`), from a
  thread of its own with a bounded queue: a tracker that is slow or down never stops training.
  A failed call is retried (``RETRIES``, with a pause), said once in the rank log, and after
  ``MAX_FAILURES`` failed calls the tracker is off for the rest of this start. At exit (DONE,
  or an agreed preemption save) what is queued is sent for at most ``FLUSH_S`` (the worker
  leaves within 4 s of the end of training: :data:`hpctf.compute.process.leaving.LEAVE_WITHIN_S`),
  and the tracker run is marked finished (DONE) or stopped, to be resumed.
- A tracker is one small class behind :class:`~.tracker.Backend`: MLflow
  (:mod:`.mlflow_run`, the extra ``hpctf[mlflow]``) and Weights & Biases (:mod:`.wandb_run`,
  the extra ``hpctf[wandb]``).

Imports no TensorFlow (and a tracker's package only when the run uses it, from its thread).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

from hpctf.compute.records.tracking.mlflow_run import MLflowBackend
from hpctf.compute.records.tracking.tracker import Backend, Tracker, flat_params, run_tags
from hpctf.compute.records.tracking.wandb_run import WandbBackend
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.config import ResolvedConfig

__all__ = ["Backend", "Tracker", "flat_params", "run_tags", "start_tracking"]

log = logging.getLogger("hpctf.worker")


def _backends(run: RunDir, config: ResolvedConfig) -> list[tuple[str, str, Callable[[], Backend]]]:
    """(tracker, the module it imports, its backend) for each tracker the config names."""
    tracking, name = config.experiment.tracking, config.experiment.name
    found: list[tuple[str, str, Callable[[], Backend]]] = []
    if (mlflow := tracking.mlflow) is not None:
        found.append(("mlflow", "mlflow", lambda: MLflowBackend(mlflow, name)))
    if (wandb := tracking.wandb) is not None:
        directory = run.path / "tracking"
        found.append(("wandb", "wandb", lambda: WandbBackend(wandb, name, directory)))
    return found


def start_tracking(run: RunDir, config: ResolvedConfig) -> list[Tracker]:
    """The chief's trackers for ``run``, from its ``config``'s ``tracking:`` section; none when
    it has none. A tracker whose package is missing here is said once and left out."""
    trackers = []
    for tracker, module, backend in _backends(run, config):
        if importlib.util.find_spec(module) is None:
            log.warning("tracking.%s: the %s package is not installed in this Python; not "
                        "tracked (the extra hpctf[%s])", tracker, module, tracker)  # fmt: skip
        else:
            trackers.append(Tracker(run, backend(), config))
    return trackers
