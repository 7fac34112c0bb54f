"""One run from Python: :func:`run`, :func:`runs` and :class:`Run` (:func:`hpctf.submit` is
:mod:`hpctf.python_api.submit_api`).

Each call goes through the functions the CLI commands call (``hpctf submit``, ``status
--json``, ``logs``, ``cancel``, ``resubmit``): no second path. Errors are the CLI's: a
:class:`~hpctf.core.errors.UserError` (what was wrong and what is allowed), an
:class:`~hpctf.core.errors.EnvironmentProblem` (Slurm or the disk failed), and
:class:`RunFailed` from :meth:`Run.wait` when asked to raise. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctf.core.errors import UserError
from hpctf.core.run.history import RunStatus
from hpctf.login.calls.models import (
    Cancelled,
    CancelRequest,
    Logs,
    LogsRequest,
    Metrics,
    MetricsRequest,
    Request,
    ResubmitRequest,
    Result,
    Statuses,
    StatusRequest,
)
from hpctf.login.reading.run_report import has_ended

Settings = Mapping[str, Any] | Sequence[str] | None


class RunFailed(Exception):
    """:meth:`Run.wait` with ``check=True``: the run ended other than ``done``."""

    def __init__(self, path: Path, state: RunStatus, why: str) -> None:
        super().__init__(f"{path}: {state}{f': {why}' if why else ''}")
        self.path, self.state, self.why = path, state, why


def set_texts(values: Settings) -> list[str]:
    """``{"train.steps": 100}`` as ``--set`` takes it (``["train.steps=100"]``): strings as
    given, other values as JSON (which YAML reads back as the same number, bool, list)."""
    if values is None:
        return []
    if isinstance(values, Mapping):
        return [f"{key}={value_text(value)}" for key, value in values.items()]
    return [str(item) for item in values]


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class Run:
    """A run directory, as ``hpctf status RUN`` and the other commands read it. Cheap to make:
    every method reads the directory (and asks Slurm) afresh."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from hpctf.login.reading.runs import RunRecord

        self.path = Path(path).resolve()
        RunRecord.read(self.path)  # a UserError now, when it is not a run directory

    def __repr__(self) -> str:
        return f"hpctf.Run({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    def _answer(self, request: Request) -> Result:
        """``request`` answered by the typed command layer (:mod:`hpctf.login.calls`): here,
        or on the login host for a run there (:class:`hpctf.python_api.remote_run.RemoteRun`)."""
        from hpctf.login.calls.table import answer

        return answer(request)

    def status(self) -> dict[str, Any]:
        """The document ``hpctf status RUN --json`` prints for this run (its ``runs[0]``):
        state and why, job, Slurm's word, step, loss, evaluations, each start, and the
        node- and GPU-hours it cost (``hours``: one sacct call; "unaccounted" without
        Slurm's accounting)."""
        return self._document(hours=True)

    def _document(self, hours: bool) -> dict[str, Any]:
        answered = self._answer(StatusRequest(run_dirs=[str(self.path)], hours=hours))
        assert isinstance(answered, Statuses)
        return answered.runs[0]

    @property
    def state(self) -> RunStatus:
        """The run's state as ``hpctf status`` decides it (a ``str``: ``run.state == "done"``
        holds): queued, running, requeued, preempted, done, failed, gave_up, cancelled,
        pruned, or (a local run whose launcher was stopped by a signal) interrupted."""
        return RunStatus(self._document(hours=False)["state"])

    def wait(
        self, timeout: float | None = None, poll: float = 10.0, check: bool = False
    ) -> RunStatus:
        """Block until the run ends (done, failed, gave_up, cancelled; preempted with no job
        left to resume it) and return that state. Requeues are waited through. ``poll``:
        seconds before the second look, growing to :data:`MAX_POLL` (:func:`wait_all`);
        ``timeout``: a TimeoutError after that many seconds; ``check``: raise
        :class:`RunFailed` unless the run is done."""
        return wait_all([self], timeout, poll, check)[0]

    def logs(self, rank: int = 0, job: str | None = None) -> str:
        """One rank's log across every start (``hpctf logs RUN --rank N [--job ID]``), with
        the separator line where each start begins."""
        answered = self._answer(LogsRequest(run_dir=str(self.path), rank=rank, job=job))
        assert isinstance(answered, Logs)
        return answered.text

    def metrics(self, frame: bool | None = None) -> Any:
        """One row per logged step of the run's metrics.jsonl, its training values (loss,
        time, ...) and its evaluation's (under ``eval``) together; each step once, from the
        start that logged it last. A pandas DataFrame (``eval`` flattened to ``eval.NAME``
        columns) when pandas is installed, else a list of dicts; ``frame=False``: always the
        list, ``frame=True``: a UserError when pandas is missing."""
        answered = self._answer(MetricsRequest(run_dir=str(self.path)))
        assert isinstance(answered, Metrics)
        return metrics_frame(answered.rows, frame)

    def cancel(self) -> list[str]:
        """``hpctf cancel RUN``: the run's open jobs cancelled and recorded; their ids."""
        answered = self._answer(CancelRequest(run_dir=str(self.path)))
        assert isinstance(answered, Cancelled)
        return answered.jobs

    def resubmit(
        self,
        set: Settings = None,
        exclude: str | None = None,
        update_code: bool = False,
        from_scratch: bool = False,
        retry_failed_nodes: bool = False,
        echo: bool = False,
    ) -> Run:
        """``hpctf resubmit RUN``: a new job on this run, resuming from its last checkpoint;
        ``set={"train.steps": N}`` continues a done run (only keys that change neither model
        nor script). Returns this run; on a local site it has run by then (``echo``, Ctrl-C:
        as :func:`submit`)."""
        from hpctf.login.calls.table import resubmit
        from hpctf.login.submitting.launchers import Caller

        resubmit(
            self._resubmit_request(set, exclude, update_code, from_scratch, retry_failed_nodes),
            Caller(echo=echo, interrupt=True),
        )
        return self

    def _resubmit_request(
        self,
        set: Settings,
        exclude: str | None,
        update_code: bool,
        from_scratch: bool,
        retry_failed_nodes: bool,
    ) -> ResubmitRequest:
        return ResubmitRequest(
            run_dir=str(self.path),
            overrides=set_texts(set),
            exclude=exclude,
            update_code=update_code,
            from_scratch=from_scratch,
            retry_failed_nodes=retry_failed_nodes,
        )


# A waiter's pause grows from its poll by BACKOFF a look, to MAX_POLL.
MAX_POLL = 120.0
BACKOFF = 1.5


def statuses(runs: Sequence[Run], hours: bool = False) -> list[dict[str, Any]]:
    """Each run's ``status --json`` document, from one call for all of them (one squeue;
    ``hours``: one sacct more), as a watcher looks (the user's shared view of the queue,
    :data:`hpctf.login.reading.slurm_view.WATCH_SHARE_S`). The runs are answered where the
    first one is (here, or over its connection)."""
    if not runs:
        return []
    paths = [str(r.path) for r in runs]
    answered = runs[0]._answer(StatusRequest(run_dirs=paths, hours=hours, watching=True))
    assert isinstance(answered, Statuses)
    return answered.runs


def wait_all(
    runs: Sequence[Run], timeout: float | None = None, poll: float = 10.0, check: bool = False
) -> list[RunStatus]:
    """Wait until every run has ended; their final states, in order. One status call per
    poll for all of them; the pause starts at ``poll`` and grows by :data:`BACKOFF` to
    :data:`MAX_POLL`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = poll
    while True:
        documents = statuses(runs)
        if all(has_ended(d) for d in documents):
            states = [RunStatus(d["state"]) for d in documents]
            for run, document, state in zip(runs, documents, states, strict=True):
                if check and state != RunStatus.DONE:
                    raise RunFailed(run.path, state, str(document.get("why") or ""))
            return states
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(runs)} run(s) not ended after {timeout} s")
        left = pause if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(pause, left)))
        pause = min(MAX_POLL, max(pause, poll) * BACKOFF)


def run(path: str | os.PathLike[str]) -> Run:
    """The run at ``path`` (a run directory ``hpctf submit`` printed)."""
    return Run(path)


def runs(root: str | os.PathLike[str] | None = None, site: str | None = None) -> list[Run]:
    """The runs under a runs root, newest first, as ``hpctf runs [--root DIR] [--site NAME]``
    finds them (default: $HPCTF_RUNS_ROOT, else the site's runs_root)."""
    from hpctf.login.reading.runs import find_runs, runs_root_for

    where = runs_root_for(None if root is None else Path(root), site, os.environ)
    return [Run(record.path) for record in find_runs(where)]


def metrics_frame(rows: list[dict[str, Any]], frame: bool | None) -> Any:
    """:meth:`Run.metrics`' answer from its rows: a pandas DataFrame (``eval`` flattened to
    ``eval.NAME``) when pandas is installed and ``frame`` is not False, else the rows; a
    UserError for ``frame=True`` without pandas."""
    if frame is False:
        return rows
    try:
        import pandas
    except ImportError:
        if frame:
            raise UserError("metrics(frame=True) needs pandas: pip install pandas") from None
        return rows
    return pandas.json_normalize(rows) if rows else pandas.DataFrame()
