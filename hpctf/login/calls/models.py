"""The requests and results of the typed command layer: pydantic models, each result
JSON-ready, and the one envelope a call's answer travels in (:class:`Answer`, versioned)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpctf.core.run.history import RunStatus

VERSION = 1
Mode = Literal["min", "max"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- requests ---------------------------------------------------------------------------------


class StatusRequest(_Model):
    """``hpctf status --json RUN...``: each run's document; ``hours``: with its node- and
    GPU-hours (one sacct call for all)."""

    command: Literal["status"] = "status"
    run_dirs: list[str] = Field(min_length=1)
    hours: bool = False
    # A watcher's look (Run.wait): the user's shared view of the queue, at most 30 s old.
    watching: bool = False


class CancelRequest(_Model):
    """``hpctf cancel RUN``."""

    command: Literal["cancel"] = "cancel"
    run_dir: str


class ResubmitRequest(_Model):
    """``hpctf resubmit RUN [--set ...] [--exclude ...] [--from-scratch]
    [--retry-failed-nodes]``. ``update_code`` copies the code again from the run's
    python_path where the call is answered: a laptop's RemoteRun refuses it (the cluster's
    copy is the one shipped at submit, not the laptop's code)."""

    command: Literal["resubmit"] = "resubmit"
    run_dir: str
    overrides: list[str] = []
    exclude: str | None = None
    update_code: bool = False
    from_scratch: bool = False
    retry_failed_nodes: bool = False


class MetricsRequest(_Model):
    """:meth:`hpctf.Run.metrics`: the run's metrics, one row per step."""

    command: Literal["metrics"] = "metrics"
    run_dir: str


class LogsRequest(_Model):
    """``hpctf logs RUN --rank N [--job ID]``, whole (no follow)."""

    command: Literal["logs"] = "logs"
    run_dir: str
    rank: int = Field(default=0, ge=0)
    job: str | None = None


class SweepRequest(_Model):
    """:class:`hpctf.Sweep`: its points; with ``documents``, their ``status SWEEP --json``
    documents too (one squeue call), whether it is over, and its best point by ``metric``
    (``mode``: min or max; a search without a metric: its study's best trial)."""

    command: Literal["sweep"] = "sweep"
    sweep_dir: str
    documents: bool = True
    watching: bool = False  # Sweep.wait: the user's shared view of the queue
    metric: str | None = None
    mode: Mode | None = None


class RunsPageRequest(_Model):
    """``hpctf ui``'s runs page: every run under a runs root (``root``, else the runs_root of
    ``site``) as a listing shows it, with Slurm's word, why a job is pending and when it may
    start; ``hours``: each run's node- and GPU-hours too (one sacct call)."""

    command: Literal["runs_page"] = "runs_page"
    root: str | None = None
    site: str | None = None
    hours: bool = False


class RunPageRequest(_Model):
    """``hpctf ui``'s page of one run: its document, curves, marks, config and the tail of
    rank ``rank``'s log (its last ``log_bytes``)."""

    command: Literal["run_page"] = "run_page"
    run_dir: str
    rank: int = Field(default=0, ge=0)
    log_bytes: int = Field(default=64 << 10, ge=1024, le=4 << 20)
    hours: bool = False


class SweepPageRequest(_Model):
    """``hpctf ui``'s page of a sweep or search: its points or trials, their curves."""

    command: Literal["sweep_page"] = "sweep_page"
    sweep_dir: str


Request = (
    StatusRequest
    | CancelRequest
    | ResubmitRequest
    | MetricsRequest
    | LogsRequest
    | SweepRequest
    | RunsPageRequest
    | RunPageRequest
    | SweepPageRequest
)


class Call(_Model):
    """One request as it travels to the login host: the laptop's site (the document
    :func:`hpctf.login.remote.site_file.site_document` makes) and the request."""

    version: int = VERSION
    site: dict[str, Any]
    request: Request = Field(discriminator="command")


# --- results ----------------------------------------------------------------------------------


class Statuses(_Model):
    """One ``status --json`` document per run asked for, in order."""

    runs: list[dict[str, Any]]


class Cancelled(_Model):
    """The run and the jobs cancelled (none when none was open; a local run: its launcher's)."""

    run_dir: str
    jobs: list[str]
    state: RunStatus


class Started(_Model):
    """A run and the job that starts it: ``submit`` and ``resubmit``. ``job_id`` None: a local
    site (its workers have run by then: ``exit_status``)."""

    run_dir: str
    job_id: str | None = None
    exit_status: int = 0
    state: RunStatus


class Metrics(_Model):
    rows: list[dict[str, Any]]


class Logs(_Model):
    text: str


class PointRef(_Model):
    """One point of a sweep (a search's trial: index is its number): the values it set, as
    the experiment took them, and its run directory."""

    index: int
    values: dict[str, Any]
    run_dir: str


class SweepView(_Model):
    """A sweep as :class:`hpctf.Sweep` reads it."""

    sweep_dir: str
    search: bool
    points: list[PointRef]
    documents: list[dict[str, Any]] = []
    over: bool = False
    best: PointRef | None = None


class SweepStarted(_Model):
    """``hpctf sweep``'s answer: the sweep directory and the exit status (a local sweep's
    points', else 0)."""

    sweep_dir: str
    exit_status: int = 0


class RunsPage(_Model):
    """The runs page: one row per run (the listing's part of its ``status --json`` document,
    with its last evaluation, when it was created, how many starts, and its ``hours`` when
    asked), one row per sweep, and notes (Slurm did not answer, runs not read yet)."""

    root: str
    runs: list[dict[str, Any]]
    sweeps: list[dict[str, Any]]
    notes: list[str] = []
    unread: int = 0


class Mark(_Model):
    """A vertical line on a run's curves: a restart (at the step it resumed from) or a prune."""

    step: int
    kind: Literal["restart", "pruned"]
    text: str


class RunPage(_Model):
    """One run's page: its ``status RUN --json`` document, its metrics by step (thinned to at
    most a few thousand rows; every evaluation kept), its marks, its resolved config with
    secrets as ``***``, the ranks that have a log and the tail of the one asked for."""

    document: dict[str, Any]
    rows: list[dict[str, Any]]
    marks: list[Mark]
    config: dict[str, Any]
    ranks: list[int]
    rank: int
    log: str


class SweepPage(_Model):
    """A sweep's page: its ``status SWEEP --json`` document (a search's: its trials, read
    from the study with Optuna), each point's or trial's eval curve of ``metric``, and for a
    search the objective per trial with the best so far."""

    sweep_dir: str
    search: bool
    document: dict[str, Any]
    metric: str | None = None
    direction: str | None = None
    curves: list[dict[str, Any]] = []
    objective: list[tuple[int, float]] = []
    best_so_far: list[tuple[int, float]] = []


Result = (
    Statuses | Cancelled | Started | Metrics | Logs | SweepView | RunsPage | RunPage | SweepPage
)


class Failure(_Model):
    """Whose fault, as the CLI says it: the user's input (exit 2) or the environment's (exit 3)."""

    kind: Literal["user", "environment"]
    message: str


class Answer(_Model):
    """A call's answer: its result, or what failed."""

    version: int = VERSION
    result: dict[str, Any] | None = None
    failure: Failure | None = None
