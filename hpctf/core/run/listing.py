"""What a listing of runs shows of one run, read from its directory once: :class:`RunFacts`.

``hpctf status``, ``hpctf runs`` and ``hpctf status SWEEP`` show, per run, its site, its state
and why (from its history), its jobs and starts, its last logged step, loss and rate, its last
and best evaluation and its code's commit. All of that is on disk and changes only when the run
directory does; what Slurm says and what the clock says are added at each listing. So the
facts are JSON-ready and kept per runs root (:mod:`hpctf.core.run.run_index`), and a listing
of 10,000 runs reads one index and a few ``stat`` calls per run instead of every run's config,
journal, metrics and snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctf.core.run import snapshot
from hpctf.core.run.history import EndReason, Job, RunHistory, RunState, read_history
from hpctf.core.run.metrics_history import metric_records
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import NotARegularFile, read_bounded
from hpctf.core.scheduler.launcher import launcher_for

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

# How much of the end of metrics.jsonl a listing reads (the last few logged steps).
METRICS_TAIL_BYTES = 64 << 10


@dataclass(frozen=True)
class RunFacts:
    """One run as a listing shows it, from its directory alone (no Slurm, no clock)."""

    path: str
    site: str
    scheduler: str
    slurm: bool
    # The site's budgets: requeues after preemption, after failures.
    max_requeues: int
    max_failure_requeues: int
    state: RunState
    jobs: tuple[Job, ...] = ()
    cancelled_jobs: tuple[str, ...] = ()
    # How the last start ended, also when its batch shell was killed before it could say.
    closed_last_reason: EndReason | None = None
    extensions: tuple[dict[str, Any], ...] = ()
    created: str = ""
    last_time: str | None = None
    step: int | None = None
    last_logged_step: int | None = None  # metrics.jsonl's (step: DONE's, once there is one)
    total_steps: int | None = None
    loss: Any = None
    steps_per_s: Any = None
    last_eval: dict[str, float] = field(default_factory=dict)
    best_eval: dict[str, float] = field(default_factory=dict)
    code: tuple[dict[str, Any], ...] = ()
    damaged: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def job(self) -> str | None:
        """The run's current job: the last one submitted or started."""
        return self.state.jobs[-1] if self.state.jobs else None

    @property
    def last_event_time(self) -> float:
        return 0.0 if self.last_time is None else epoch_seconds(self.last_time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunFacts:
        """The facts :meth:`to_json` wrote; a KeyError, TypeError or ValueError when ``data``
        is not that."""
        closed = data["closed_last_reason"]
        return cls(
            **{
                **data,
                "state": RunState.from_json(data["state"]),
                "closed_last_reason": None if closed is None else EndReason(closed),
                "jobs": tuple(Job(**j) for j in data["jobs"]),
                "cancelled_jobs": tuple(data["cancelled_jobs"]),
                "extensions": tuple(data["extensions"]),
                "code": tuple(data["code"]),
                "damaged": tuple(data["damaged"]),
            }
        )


# DONE is a line of JSON; more is no DONE hpctf wrote.
DONE_BYTES = 64 << 10


def facts_of(run: RunDir, config: ResolvedConfig, history: RunHistory) -> RunFacts:
    """The facts of ``run`` (its frozen ``config`` and ``history`` already read)."""
    records = metric_records(run.metrics, METRICS_TAIL_BYTES)
    step, total, last = _progress(run, config, records)
    last_eval, best_eval = eval_results(run, records)
    closed = history.closed_last_start()
    first = history.created
    return RunFacts(
        path=str(run.path),
        site=config.site.name,
        scheduler=config.site.scheduler,
        slurm=launcher_for(config.site).slurm,
        max_requeues=config.site.preemption.max_requeues,
        max_failure_requeues=config.site.preemption.max_failure_requeues,
        state=history.state,
        jobs=history.jobs,
        cancelled_jobs=history.cancelled_jobs,
        closed_last_reason=None if closed is None else closed.reason,
        extensions=tuple({"time": e.time, "changes": e.changes} for e in history.extensions),
        created=first.time if first else iso_time(run.config_file.stat().st_mtime),
        last_time=history.last_time,
        step=step,
        last_logged_step=max((int(r["step"]) for r in records), default=None),
        total_steps=total,
        loss=last.get("loss"),
        steps_per_s=last.get("steps_per_s"),
        last_eval=last_eval,
        best_eval=best_eval,
        code=tuple(
            {"source": s.source, "git_commit": s.git_commit, "git_dirty": s.git_dirty}
            for s in snapshot.read(run.path)
        ),
        damaged=history.damaged,
    )


def read_facts(path: Path) -> RunFacts:
    """The facts of the run at ``path``: its config, journal, metrics' tail and snapshot read
    once. A UserError when it is not a run; an EnvironmentProblem when it cannot be read."""
    run = RunDir(path)
    return facts_of(run, run.load_config(), read_history(run))


def _progress(
    run: RunDir, config: ResolvedConfig, records: list[dict[str, Any]]
) -> tuple[int | None, int | None, dict[str, Any]]:
    """The last logged step (DONE's when the run is done), the total (``train.steps``, else
    the chief's records: ``train.epochs``, a ``train.script``'s fit) and the last record with
    a loss."""
    losses = [r for r in records if isinstance(r.get("loss"), (int, float))]
    step = max((int(r["step"]) for r in records), default=None)
    total = config.experiment.train.steps or next(
        (int(r["total_steps"]) for r in reversed(records) if isinstance(r.get("total_steps"), int)),
        None,
    )
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, NotARegularFile):
        step = int(json.loads(read_bounded(run.done, DONE_BYTES, "DONE"))["step"])
    return step, total, (losses[-1] if losses else {})


def eval_results(
    run: RunDir, records: list[dict[str, Any]]
) -> tuple[dict[str, float], dict[str, float]]:
    """The last evaluation's metrics and, per metric, the best one logged (lowest for names
    with ``loss`` or ``error``, highest for the rest), from ``records`` (metrics.jsonl's) and
    DONE."""
    evals = [r["eval"] for r in records if isinstance(r.get("eval"), dict)]
    try:
        final = json.loads(read_bounded(run.done, DONE_BYTES, "DONE")).get("eval")
    except (OSError, ValueError, AttributeError, NotARegularFile):
        final = None
    if isinstance(final, dict) and final:
        evals.append(final)
    numbers = [{k: v for k, v in e.items() if isinstance(v, (int, float))} for e in evals]
    best: dict[str, float] = {}
    for entry in numbers:
        for name, value in entry.items():
            lower = "loss" in name or "error" in name
            if name not in best or (value < best[name] if lower else value > best[name]):
                best[name] = value
    return (numbers[-1] if numbers else {}), best


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def epoch_seconds(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return 0.0
