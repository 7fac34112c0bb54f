"""MLflow as a tracker (``tracking: mlflow:``; ``mlflow`` or ``mlflow-skinny``, the extra
``hpctf[mlflow]``)."""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from hpctf.core.settings.tracking import MLflowTracking

# MLflow's limits: 100 params per batch call, values of at most 6,000 characters.
_PARAMS_PER_CALL = 100
_PARAM_CHARS = 500


def is_file_store(uri: str) -> bool:
    """Whether MLflow reads ``uri`` as its file store: ``file:`` or a plain local path (but
    ``databricks``, a scheme-less name MLflow reads as Databricks)."""
    if uri == "databricks":
        return False
    return urllib.parse.urlparse(uri).scheme in ("", "file")


class MLflowBackend:
    """MLflow through its client API (no global active run), e.g. a file store
    (``file:///path``) or a tracking server."""

    name = "mlflow"

    def __init__(self, settings: MLflowTracking, default_experiment: str) -> None:
        self._settings = settings
        self._experiment = settings.experiment or default_experiment
        self._client: Any = None
        self._run_id = ""

    def start(self, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> str:
        # MLflow retries an HTTP call up to 7 times with a growing pause (minutes on a server
        # that is down); hpctf retries each call itself, RETRIES times: unless the user chose.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        uri = self._settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is not None and is_file_store(uri):
            # MLflow 3.17 refuses a file store ("maintenance mode") unless opted out; on a
            # cluster without an MLflow server it is the natural store on the shared
            # filesystem. A value the user set (false) is kept.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient  # seconds to import: here, off the training

        self._client = MlflowClient(tracking_uri=self._settings.tracking_uri)
        if run_id is None:
            found = self._client.get_experiment_by_name(self._experiment)
            experiment_id = (
                found.experiment_id if found else self._client.create_experiment(self._experiment)
            )
            run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        else:
            self._client.update_run(run_id, status="RUNNING")
        self._run_id = run_id
        for key, value in tags.items():
            self._client.set_tag(run_id, key, value)
        return run_id

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), _PARAMS_PER_CALL):
            self._client.log_batch(self._run_id, params=items[i : i + _PARAMS_PER_CALL])

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def finish(self, done: bool) -> None:
        self._client.set_terminated(self._run_id, "FINISHED" if done else "KILLED")
