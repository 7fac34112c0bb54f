"""The typed command layer's functions, one per request (:mod:`.models`), and
:func:`answer`, which runs any request: here for the Python API, on the login host for a
laptop (``hpctf _call``). Each goes through the function its CLI command calls: no second
path."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hpctf.core.secrets import redact, redact_data
from hpctf.login.calls.models import (
    Cancelled,
    CancelRequest,
    Logs,
    LogsRequest,
    Metrics,
    MetricsRequest,
    PointRef,
    Request,
    ResubmitRequest,
    Result,
    RunPage,
    RunPageRequest,
    RunsPage,
    RunsPageRequest,
    Started,
    Statuses,
    StatusRequest,
    SweepPage,
    SweepPageRequest,
    SweepRequest,
    SweepView,
)

if TYPE_CHECKING:
    from hpctf.core.run.rundir import RunDir
    from hpctf.login.submitting.launchers import Caller


def status(request: StatusRequest) -> Statuses:
    """Each run's ``status --json`` document, whole, as ``hpctf status RUN`` makes it: one
    squeue call for all of them, one sacct call more with ``hours``."""
    from hpctf.login.reading.runs import RunRecord
    from hpctf.login.watching.status import run_documents

    records = [RunRecord.read(Path(path)) for path in request.run_dirs]
    documents, _, _ = run_documents(
        records, whole=True, with_hours=request.hours, watching=request.watching
    )
    return Statuses(runs=redact_data(documents))


def cancel(request: CancelRequest) -> Cancelled:
    """``hpctf cancel RUN``: its open jobs cancelled and recorded."""
    from hpctf.login.reading.runs import RunRecord
    from hpctf.login.watching.cancel import cancel_run

    jobs = cancel_run(Path(request.run_dir))
    record = RunRecord.read(Path(request.run_dir))
    return Cancelled(run_dir=str(record.run.path), jobs=jobs, state=record.state.state)


def resubmit(request: ResubmitRequest, caller: Caller | None = None) -> Started:
    """``hpctf resubmit RUN``: a new job on the run (``caller``: how a local run's workers are
    watched; default the CLI's)."""
    from hpctf.core.run.rundir import RunDir
    from hpctf.login.submitting.launchers import CLI
    from hpctf.login.submitting.resubmit import resubmit_run

    path = Path(request.run_dir)
    status = resubmit_run(
        path,
        request.exclude,
        request.retry_failed_nodes,
        request.update_code,
        request.from_scratch,
        request.overrides,
        caller or CLI,
    )
    return started(RunDir(path.resolve()), status)


def started(run: RunDir, status: int) -> Started:
    """The :class:`Started` of ``run`` after its start returned ``status``: its last
    submitted job (None on a local site) and its state."""
    from hpctf.core.run.history import read_history

    history = read_history(run)
    submitted = history.submissions
    job = str(submitted[-1].job_id) if submitted and submitted[-1].job_id is not None else None
    return Started(run_dir=str(run.path), job_id=job, exit_status=status, state=history.state.state)


def metrics(request: MetricsRequest) -> Metrics:
    """The run's metrics.jsonl by step (:func:`hpctf.core.run.metrics_history.by_step`)."""
    from hpctf.core.run.metrics_history import by_step, metric_records
    from hpctf.core.run.rundir import RunDir

    run = RunDir.open(Path(request.run_dir))
    return Metrics(rows=redact_data(by_step(metric_records(run.path / "metrics.jsonl"))))


def logs(request: LogsRequest) -> Logs:
    """One rank's log across every start, as ``hpctf logs RUN --rank N [--job ID]`` prints
    it (its checks: :func:`hpctf.login.watching.logs.check_request`)."""
    from hpctf.login.reading.runs import RunRecord
    from hpctf.login.watching.logs import LogReader, check_request

    record = RunRecord.read(Path(request.run_dir))
    check_request(record, request.rank, request.job, follow=False)
    reader = LogReader(record.run, request.rank, request.job)
    return Logs(text=redact("".join(reader.read(record.history, final=True))))


def sweep(request: SweepRequest) -> SweepView:
    """A sweep's points, their documents, whether it is over, and its best point."""
    from hpctf.login.sweeps.sweep_dir import SweepDir
    from hpctf.login.sweeps.sweep_view import best_of, documents_of, is_over, points_of

    record = SweepDir.read(Path(request.sweep_dir))
    points = [PointRef(**point) for point in points_of(record)]
    view = SweepView(sweep_dir=str(record.path), search=record.is_search, points=points)
    if not request.documents:
        return view
    documents = documents_of(record, request.watching)
    best = best_of(record, documents, request.metric, request.mode)
    return view.model_copy(
        update={
            "documents": redact_data(documents),
            "over": is_over(record, documents),
            "best": None if best is None else PointRef(**best),
        }
    )


def answer(request: Request) -> Result:
    """Run ``request`` here."""
    from hpctf.login.calls import pages

    if isinstance(request, RunsPageRequest):
        return pages.runs_page(request)
    if isinstance(request, RunPageRequest):
        return pages.run_page(request)
    if isinstance(request, SweepPageRequest):
        return pages.sweep_page(request)
    if isinstance(request, SweepRequest):
        return sweep(request)
    if isinstance(request, StatusRequest):
        return status(request)
    if isinstance(request, CancelRequest):
        return cancel(request)
    if isinstance(request, ResubmitRequest):
        return resubmit(request)
    if isinstance(request, MetricsRequest):
        return metrics(request)
    return logs(request)


RESULTS: dict[str, type[Result]] = {
    "status": Statuses,
    "cancel": Cancelled,
    "resubmit": Started,
    "metrics": Metrics,
    "logs": Logs,
    "sweep": SweepView,
    "runs_page": RunsPage,
    "run_page": RunPage,
    "sweep_page": SweepPage,
}
