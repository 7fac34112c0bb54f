"""Life after submit: ``status``, ``runs``, ``logs``, ``cancel`` and ``plot``.

Everything here works from run directories; Slurm is asked at most ONE ``squeue`` and ONE
``sacct`` call per command, however many runs it shows (:func:`slurm_records`), so a user
with fifty runs never floods slurmctld. What Slurm says comes first (squeue), then the
accounting database (sacct, for jobs slurmctld has forgotten after MinJobAge), then the run
directory's own journal, so a forgotten job still shows how it ended. Slurm down or slow is one
line on stderr, and the journal's view.

Where runs are found, without RUN arguments: ``--root DIR``, else ``$HPCTF_RUNS_ROOT`` (which
overrides every site's runs_root at submit), else the runs_root of the site ``--site NAME``,
``$HPCTF_SITE`` or ``local``. Plotting imports matplotlib only inside ``hpctf plot``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from hpctf.core import slurm, snapshot
from hpctf.core.config import ResolvedConfig
from hpctf.core.errors import UserError
from hpctf.core.rundir import RunDir, job_history, run_dirs_under
from hpctf.core.runstate import RunState, Start, run_state
from hpctf.core.slurm import JobRecord, SlurmFailure

# Runs `hpctf status` shows without RUN arguments: those still queued or running, and those
# whose journal moved within this many days (--all: every run).
RECENT_DAYS = 7
FINAL_RUN_STATES = frozenset({"done", "failed", "gave_up", "cancelled"})
ACTIVE_RUN_STATES = frozenset({"queued", "running", "requeued"})
# Slurm's states of a job back in the queue after a requeue.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# The first line every worker writes at each start (hpctf.compute.runtime.run_worker).
WORKER_HEADER = re.compile(
    rb"^\d\d:\d\d:\d\d rank \d+: host \S+ pid \d+ \(SLURMD_NODENAME [^)]*\) SLURM_PROCID "
)
# How much of the end of metrics.jsonl the table reads (the last few logged steps).
METRICS_TAIL_BYTES = 64 << 10
SPARK = "▁▂▃▄▅▆▇█"

_runs_option = click.argument(
    "run_dirs", nargs=-1, type=click.Path(path_type=Path, file_okay=False), metavar="[RUN]..."
)
_root_option = click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Look for runs here (default: $HPCTF_RUNS_ROOT, else the site's runs_root).",
)
_where_site_option = click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="Whose runs_root to look in (default: $HPCTF_SITE, else local).",
)
_json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document.")


# --- finding runs ----------------------------------------------------------------------------


def runs_root_for(root: Path | None, site_name: str | None, env: Mapping[str, str]) -> Path:
    """Where runs live, without RUN arguments (see the module docstring for the order)."""
    if root is not None:
        return root
    from hpctf.core.sites import load_named_site
    from hpctf.login.resolve import expand_path

    if env.get("HPCTF_RUNS_ROOT"):
        where, value = "HPCTF_RUNS_ROOT", env["HPCTF_RUNS_ROOT"]
    else:
        name = site_name or env.get("HPCTF_SITE") or "local"
        where, value = f"site {name}: runs_root", load_named_site(name, env).runs_root
    try:
        return Path(expand_path(value, env))  # as at submit: ~ and $VARS
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None


@dataclass
class Run:
    """One run directory, read once: its config, journal and the state derived from it."""

    run: RunDir
    config: ResolvedConfig
    events: list[dict[str, Any]]
    state: RunState

    @classmethod
    def read(cls, path: Path) -> Run:
        """The run at ``path``, or a UserError saying it is not one."""
        run = RunDir(path.resolve())
        config = run.load_config()
        events = run.events()
        return cls(run, config, events, run_state(events))

    @property
    def name(self) -> str:
        return self.run.path.name

    @property
    def slurm(self) -> bool:
        return self.config.site.scheduler == "slurm"

    @property
    def job(self) -> str | None:
        """The run's current job: the last one submitted or started."""
        return self.state.jobs[-1] if self.state.jobs else None

    @property
    def created(self) -> str:
        first = next((e for e in self.events if e.get("event") == "created"), None)
        return str(first["time"]) if first else _iso(self.run.config_file.stat().st_mtime)

    @property
    def last_event_time(self) -> float:
        return _epoch(self.events[-1]["time"]) if self.events else 0.0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def _epoch(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return 0.0


def find_runs(root: Path) -> list[Run]:
    """The runs under ``root``, newest first; directories that are not runs are skipped."""
    runs = []
    for path in run_dirs_under(root):
        try:
            runs.append(Run.read(path))
        except UserError:
            continue  # a damaged config.json: `hpctf status DIR` says what is wrong with it
    return sorted(runs, key=lambda r: r.created, reverse=True)


# --- what Slurm says: one squeue, one sacct -------------------------------------------------


@dataclass
class SlurmView:
    """What Slurm said of some jobs, and what could not be asked (one line for stderr)."""

    records: dict[str, JobRecord]
    answered: bool
    problem: str = ""


def slurm_records(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> SlurmView:
    """Ask ONE squeue about ``job_ids``, then ONE sacct about the ones squeue no longer knows.

    A failing query (Slurm down, slow, not installed) is no error here: what was learned is
    returned, with ``problem`` saying in one line what could not be asked.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return SlurmView({}, True)
    records: dict[str, JobRecord] = {}
    problems = []
    answered = True
    try:
        records.update(slurm.squeue_jobs(ids, env))
    except (SlurmFailure, UserError) as exc:
        problems.append(f"squeue: {exc}")
        answered = False
    missing = [i for i in ids if i not in records]
    if missing:
        try:
            records.update(slurm.sacct_jobs(missing, env))
        except (SlurmFailure, UserError) as exc:
            problems.append(f"sacct: {exc}")
    problem = ""
    if problems:
        problem = (
            f"hpctf: Slurm did not answer ({'; '.join(problems)}); "
            "showing what the run directories recorded"
        )
    return SlurmView(records, answered, problem)


def _job_states(runs: Sequence[Run], all_jobs: bool) -> SlurmView:
    ids: list[str] = []
    for run in runs:
        if run.slurm:
            ids.extend(run.state.jobs if all_jobs else [run.job] if run.job else [])
    view = slurm_records(ids)
    if view.problem:
        click.echo(view.problem, err=True)
    return view


def slurm_state(run: Run, job_id: str | None, view: SlurmView) -> dict[str, str] | None:
    """The state of one job of ``run``: Slurm's word when squeue or sacct knows the job, else
    the end the journal recorded (``ENDED`` and its reason), else UNKNOWN. None on local
    sites."""
    if not run.slurm:
        return None
    if job_id is None:
        return {"state": "", "reason": "not submitted", "source": "journal"}
    record = view.records.get(job_id)
    if record is not None:
        return {"state": record.state, "reason": record.reason, "source": record.source}
    starts = [s for s in run.state.starts if s.job_id == job_id]
    requeued = job_id == run.job and run.state.state in ACTIVE_RUN_STATES  # not over yet
    if starts and starts[-1].reason is not None and not requeued:
        return {"state": "ENDED", "reason": starts[-1].reason, "source": "journal"}
    if _cancelled(run.events, job_id):
        return {"state": "ENDED", "reason": "cancelled", "source": "journal"}
    reason = "gone from Slurm" if view.answered else "Slurm did not answer"
    return {"state": "UNKNOWN", "reason": reason, "source": "journal"}


def _cancelled(events: Sequence[Mapping[str, Any]], job_id: str) -> bool:
    return any(e.get("event") == "cancelled" and job_id in e.get("jobs", ()) for e in events)


def _slurm_text(state: Mapping[str, str] | None) -> str:
    if state is None:
        return "local"
    if not state["state"]:
        return "-"
    reason = f" ({state['reason']})" if state["reason"] else ""
    return f"{state['state']}{reason}"


# --- progress, from metrics.jsonl and the journal ----------------------------------------------


def metric_records(path: Path, tail_bytes: int | None = None) -> list[dict[str, Any]]:
    """The records of metrics.jsonl (only those in its last ``tail_bytes`` when given)."""
    try:
        with path.open("rb") as handle:
            if tail_bytes is not None:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(0, size - tail_bytes))
                if size > tail_bytes:
                    handle.readline()  # a partial first line
            data = handle.read()
    except OSError:
        return []
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line still being written
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def elapsed_seconds(events: Sequence[Mapping[str, Any]], running: bool, now: float) -> float:
    """Time spent in starts, over all of them: each from its ``started`` record to its
    ``ended`` one (a start killed without one: to its last record; the running one: to
    ``now``)."""
    total = 0.0
    since: float | None = None
    last = 0.0
    for event in events:
        moment = _epoch(str(event.get("time", "")))
        if event.get("event") == "started":
            if since is not None:
                total += last - since
            since = last = moment
        elif since is not None:
            last = moment
            if event.get("event") == "ended":
                total += moment - since
                since = None
    if since is not None:
        total += (now if running else last) - since
    return max(total, 0.0)


def progress(
    run: Run, now: float, records: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """Step, total, last loss, steps/s, elapsed and ETA of ``run`` (None where unknown)."""
    if records is None:
        records = metric_records(run.run.metrics, METRICS_TAIL_BYTES)
    losses = [r for r in records if isinstance(r.get("loss"), (int, float))]
    last = losses[-1] if losses else {}
    step = max((int(r["step"]) for r in records), default=None)
    total = run.config.experiment.train.steps
    if run.run.done.exists():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            step = int(json.loads(run.run.done.read_text(encoding="utf-8"))["step"])
    rate = last.get("steps_per_s")
    running = run.state.state == "running"
    eta = None
    if running and total and step is not None and isinstance(rate, (int, float)) and rate > 0:
        eta = max(total - step, 0) / rate
    return {
        "step": step,
        "total_steps": total,
        "loss": last.get("loss"),
        "steps_per_s": rate,
        "elapsed_s": round(elapsed_seconds(run.events, running, now)),
        "eta_s": None if eta is None else round(eta),
    }


def duration(seconds: float | None) -> str:
    """``1d02:03:04``, ``2:03:04``, ``3:04``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """``values`` as at most ``width`` block characters (bucket means; log scale when every
    value is positive, so a loss falling by decades still shows its shape)."""
    points = [float(v) for v in values if math.isfinite(v)]
    if not points:
        return ""
    log = all(v > 0 for v in points)
    if log:
        points = [math.log10(v) for v in points]
    buckets = min(width, len(points))
    means = []
    for i in range(buckets):
        part = points[i * len(points) // buckets : (i + 1) * len(points) // buckets]
        means.append(sum(part) / len(part))
    low, high = min(means), max(means)
    span = high - low or 1.0
    return "".join(SPARK[min(int((m - low) / span * len(SPARK)), len(SPARK) - 1)] for m in means)


def code_text(code: Sequence[Mapping[str, Any]]) -> str:
    """A run's code snapshot in a word: each source's commit (+dirty), or no-git; - for none."""
    words = [
        "no-git"
        if c["git_commit"] is None
        else c["git_commit"][:8] + ("+dirty" if c["git_dirty"] else "")
        for c in code
    ]
    return ",".join(dict.fromkeys(words)) or "-"


# --- status ------------------------------------------------------------------------------------


def run_document(run: Run, view: SlurmView, now: float, full: bool = False) -> dict[str, Any]:
    """Everything `hpctf status` says of one run, as one JSON-ready mapping."""
    records = metric_records(run.run.metrics, None if full else METRICS_TAIL_BYTES)
    budgets = run.config.site.preemption
    current = slurm_state(run, run.job, view)
    state, why = run.state.state, run.state.why
    last = run.state.last
    if state in ("failed", "running") and current and current["state"] in REQUEUED_STATES:
        # Slurm requeues a job itself after a node failure (or scontrol requeue): the journal
        # says the start failed, or (its batch shell killed first) is still running, while
        # the job is back in the queue; its next start records itself.
        after = f" after {last.reason}" if last and last.reason else ""
        state, why = "requeued", f"by Slurm{after}"
    document: dict[str, Any] = {
        "run": run.name,
        "path": str(run.run.path),
        "site": run.config.site.name,
        "scheduler": run.config.site.scheduler,
        "job": run.job,
        "slurm": current,
        "state": state,
        "why": why,
        "requeues": {
            "preemption": [run.state.preemption_requeues, budgets.max_requeues],
            "failure": [run.state.failure_requeues, budgets.max_failure_requeues],
        },
        **progress(run, now, records),
        "code": [
            {"source": s.source, "git_commit": s.git_commit, "git_dirty": s.git_dirty}
            for s in snapshot.read(run.run.path)
        ],
        "starts": [
            {
                "job": s.job_id,
                "from_step": s.step,
                "reason": s.reason,
                "exit_code": s.exit_code,
                "end_step": s.end_step,
                "nodes": s.nodes,
            }
            for s in run.state.starts
        ],
        "jobs": [],
    }
    for job in job_history(run.events):
        document["jobs"].append(
            {
                "job": job["job_id"],
                "slurm": slurm_state(run, job["job_id"], view),
                "ended": "ended" in job,
                "exit_code": job.get("exit_code"),
                "starts": job["starts"],
                "nodes": job.get("nodes"),
            }
        )
    if full:
        document["losses"] = [[r["step"], r["loss"]] for r in records if "loss" in r]
    return document


def _number(value: Any, digits: int = 4) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.{digits}g}"


TABLE_COLUMNS = (
    "RUN", "JOB", "SLURM", "STATE", "STARTS", "STEP", "LOSS", "STEPS/S", "ELAPSED", "ETA", "CODE",
)  # fmt: skip


def table_rows(documents: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for d in documents:
        total = d["total_steps"] or "?"
        step = "-" if d["step"] is None else f"{d['step']}/{total}"
        rows.append(
            (
                d["run"],
                d["job"] or "-",
                _slurm_text(d["slurm"]),
                d["state"],
                str(len(d["starts"])),
                step,
                _number(d["loss"]),
                _number(d["steps_per_s"], 3),
                duration(d["elapsed_s"]) if d["starts"] else "-",
                duration(d["eta_s"]),
                code_text(d["code"]),
            )
        )
    return rows


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


def status_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """The runs as one table, then a line for each run whose state has a why, and a legend
    when a state comes from the journal alone."""
    text = format_table(TABLE_COLUMNS, table_rows(documents))
    for d in documents:
        if d["why"]:
            text += f"{d['run']}: {d['state']}: {d['why']}\n"
    if any((d["slurm"] or {}).get("state") == "ENDED" for d in documents):
        text += (
            "ENDED (reason): Slurm no longer knows the job; its end as the run directory "
            "recorded it\n"
        )
    return text


def describe_run(run: Run, document: Mapping[str, Any]) -> str:
    """The single-run view: state and why, budgets, code, Slurm, progress, each job, each
    start."""
    lines = []
    pre, fail = document["requeues"]["preemption"], document["requeues"]["failure"]
    why = f" ({document['why']})" if document["why"] else ""
    lines.append(
        f"run: {document['state']}{why}; requeues after preemption {pre[0]}/{pre[1]}, "
        f"after failures {fail[0]}/{fail[1]}"
    )
    lines.extend(f"code: {source.describe()}" for source in snapshot.read(run.run.path))
    if run.slurm and document["job"]:
        lines.append(f"slurm: job {document['job']} {_slurm_text(document['slurm'])}")
    total = document["total_steps"] or "?"
    if document["step"] is not None:
        lines.append(
            f"progress: step {document['step']}/{total}, loss {_number(document['loss'])}, "
            f"{_number(document['steps_per_s'], 3)} steps/s, elapsed "
            f"{duration(document['elapsed_s'])}, eta {duration(document['eta_s'])}"
        )
    losses = [loss for _, loss in document.get("losses", [])]
    if len(losses) > 1:
        lines.append(
            f"loss: {_number(losses[0])} {sparkline(losses)} {_number(losses[-1])} "
            f"(steps {document['losses'][0][0]}-{document['losses'][-1][0]})"
        )
    for job in document["jobs"]:
        state = job["slurm"]
        if job["ended"] and (state is None or state["source"] == "journal" or _final(state)):
            text = "ENDED"
        elif state is None:
            text = "PENDING/RUNNING"
        elif state["state"] == "UNKNOWN":
            text = f"UNKNOWN ({state['reason']})"
        else:
            text = _slurm_text(state)
        exit_text = f" exit {job['exit_code']}" if job["exit_code"] is not None else ""
        lines.append(
            f"job {job['job']}: {text}{exit_text} starts {job['starts']} "
            f"nodes {job['nodes'] or '-'}"
        )
    jobs = {job["job"]: job["slurm"] for job in document["jobs"]}
    for number, start in enumerate(run.state.starts, 1):
        lines.append(
            f"start {number}: job {start.job_id} from step {start.step}: "
            f"{_end(start, jobs.get(start.job_id))}"
        )
    lines.append(f"last logged step: {document['step'] if document['step'] is not None else '-'}")
    done = run.run.done.read_text().strip() if run.run.done.exists() else "no"
    lines.append(f"done: {done}")
    return "\n".join(lines) + "\n"


def _final(state: Mapping[str, str]) -> bool:
    return state["state"] in slurm.FINAL_STATES


def _end(start: Start, job: Mapping[str, str] | None) -> str:
    if not start.reason:
        # Its batch shell was killed before it could record the end (scancel, KillWait).
        if job is not None and job["source"] != "journal" and _final(job):
            return f"ended without a record of its own (Slurm: {job['state']})"
        return "not ended"
    return f"{start.reason} at step {start.end_step} (exit {start.exit_code})"


def _selected_runs(
    run_dirs: Sequence[Path], root: Path | None, site_name: str | None, every: bool
) -> list[Run]:
    if run_dirs:
        return [Run.read(path) for path in run_dirs]
    where = runs_root_for(root, site_name, os.environ)
    runs = find_runs(where)
    if not every:
        cutoff = time.time() - RECENT_DAYS * 86400
        runs = [
            r for r in runs if r.state.state in ACTIVE_RUN_STATES or r.last_event_time >= cutoff
        ]
    if not runs:
        click.echo(f"no {'' if every else 'recent '}runs under {where}", err=True)
    return runs


@click.command()
@_runs_option
@_json_option
@click.option("--all", "every", is_flag=True, help="Every run, not only the recent ones.")
@_root_option
@_where_site_option
def status(
    run_dirs: tuple[Path, ...], as_json: bool, every: bool, root: Path | None, site_name: str | None
) -> None:
    """Show runs: one RUN in full (state and why, budgets, code, Slurm, progress, each job and
    start), several as a table; without RUN, the recent runs under the runs root (--all:
    every run). At most one squeue and one sacct call, however many runs."""
    runs = _selected_runs(run_dirs, root, site_name, every)
    single = len(run_dirs) == 1
    view = _job_states(runs, all_jobs=single)
    now = time.time()
    documents = [run_document(run, view, now, full=single) for run in runs]
    if as_json:
        click.echo(
            json.dumps(
                {"runs": documents, "notes": [view.problem] if view.problem else []}, indent=2
            )
        )
    elif single:
        click.echo(describe_run(runs[0], documents[0]), nl=False)
    elif documents:
        click.echo(status_table(documents), nl=False)


# --- runs --------------------------------------------------------------------------------------


@click.command()
@_json_option
@_root_option
@_where_site_option
def runs(as_json: bool, root: Path | None, site_name: str | None) -> None:
    """List the runs under the runs root, newest first: name, created, site, state, last step.

    From the run directories alone (no Slurm call): the state is hpctf's, from each journal.
    """
    where = runs_root_for(root, site_name, os.environ)
    found = find_runs(where)
    documents: list[dict[str, Any]] = []
    for run in found:
        records = metric_records(run.run.metrics, METRICS_TAIL_BYTES)
        documents.append(
            {
                "run": run.name,
                "path": str(run.run.path),
                "created": run.created,
                "site": run.config.site.name,
                "state": run.state.state,
                "last_step": max((int(r["step"]) for r in records), default=None),
            }
        )
    if as_json:
        click.echo(json.dumps({"root": str(where), "runs": documents}, indent=2))
        return
    if not documents:
        click.echo(f"no runs under {where}", err=True)
        return
    rows = [
        (d["run"], d["created"], d["site"], d["state"], str(d["last_step"] or "-"))
        for d in documents
    ]
    click.echo(format_table(("RUN", "CREATED", "SITE", "STATE", "LAST STEP"), rows), nl=False)


# --- logs --------------------------------------------------------------------------------------


def worker_starts(events: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The ``started`` records (numbered from 1) whose start ran the worker: not those that
    ``job-start`` stopped at once (a ``gave_up`` of the same job right after)."""
    found: list[tuple[int, Mapping[str, Any]]] = []
    number = 0
    for i, event in enumerate(events):
        if event.get("event") != "started":
            continue
        number += 1
        after = events[i + 1] if i + 1 < len(events) else {}
        if after.get("event") == "gave_up" and after.get("job_id") == event.get("job_id"):
            continue
        found.append((number, event))
    return found


def separator(number: int, started: Mapping[str, Any], rank: int) -> str:
    return (
        f"===== start {number}: job {started.get('job_id')}, rank {rank}, started "
        f"{started.get('time')}, from step {started.get('step', 0)} =====\n"
    )


class LogReader:
    """One rank's log across every start of its run, with a separator where each start
    begins (at the worker's first line), optionally only one job's part."""

    def __init__(self, run: RunDir, rank: int, job: str | None) -> None:
        self.run = run
        self.rank = rank
        self.job = job
        self.position = 0
        self.headers = 0
        self.showing = job is None  # before the first start's line: everything, unless --job
        self.pending = b""

    def read(self, events: Sequence[Mapping[str, Any]], final: bool = False) -> Iterator[str]:
        """The text the log gained since the last call, separators included. Call with the
        journal read BEFORE the log, so every start whose lines are read is already known."""
        try:
            with self.run.rank_log(self.rank).open("rb") as handle:
                handle.seek(self.position)
                data = handle.read()
        except FileNotFoundError:
            return
        self.position += len(data)
        data = self.pending + data
        lines = data.split(b"\n")
        self.pending = b"" if final else lines.pop()
        if final and lines and lines[-1] == b"":
            lines.pop()
        starts = worker_starts(events)
        for line in lines:
            if WORKER_HEADER.match(line):
                self.headers += 1
                # The n-th worker header begins the n-th start that ran the worker; a header
                # the journal does not know of yet belongs to its latest start.
                index = min(self.headers, len(starts)) - 1
                number, started = starts[index] if starts else (self.headers, {})
                self.showing = self.job is None or str(started.get("job_id")) == self.job
                if self.showing:
                    yield separator(number, started, self.rank)
            if self.showing:
                yield line.decode("utf-8", errors="replace") + "\n"


def _job_alive(run: Run) -> bool | None:
    """Whether Slurm still runs or holds the run's current job (None: it did not answer)."""
    if not run.slurm or run.job is None:
        return False
    view = slurm_records([run.job])
    record = view.records.get(run.job)
    if record is not None:
        return not record.final
    return False if view.answered else None


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Which task's log.")
@click.option("--job", "job_id", metavar="ID", help="Only the part written by job ID.")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing, across requeues, until the run ends."
)
def logs(run_dir: Path, rank: int, job_id: str | None, follow: bool) -> None:
    """Print one rank's log of RUN_DIR across every start, a separator line where each begins.

    With -f, follow the live job, and the next one after a requeue, until the run is done,
    failed, gave up or was cancelled (Slurm is asked at most every 30 s, and only while the
    journal alone cannot tell).
    """
    run = Run.read(run_dir)
    path = run.run.rank_log(rank)
    if job_id is not None and job_id not in run.state.jobs:
        raise UserError(
            f"{run.run.path}: no job {job_id}; its jobs: {', '.join(run.state.jobs) or 'none yet'}"
        )
    if not path.exists() and (not follow or run.state.state in FINAL_RUN_STATES):
        ranks = sorted(p.stem.split("-")[1] for p in run.run.logs.glob("rank-*.log"))
        raise UserError(
            f"{path}: no log for rank {rank}; ranks with logs: {', '.join(ranks) or 'none yet'}"
        )
    reader = LogReader(run.run, rank, job_id)
    if not follow:
        for text in reader.read(run.events, final=True):
            click.echo(text, nl=False)
        return
    next_check = 0.0
    gone = 0
    last_state = ""
    while True:
        current = Run.read(run_dir)
        for text in reader.read(current.events):
            click.echo(text, nl=False)
        state = current.state.state
        if state != last_state:  # a failed start: ask soon, once job-end had time to requeue
            gone, last_state = 0, state
            next_check = min(next_check, time.monotonic() + (3 if state == "failed" else 30))
        over = state in FINAL_RUN_STATES - {"failed"}
        if not over and time.monotonic() >= next_check:
            # The journal cannot always tell: a failed start may be requeued by Slurm itself
            # (a node failure), and a job killed hard never records its end.
            alive = _job_alive(current) if current.slurm else state != "failed"
            if state == "failed":
                over = alive is not True
            else:
                gone = gone + 1 if alive is False else 0
                over = gone >= 2
            next_check = time.monotonic() + (10 if state == "failed" else 30)
        if over:
            for text in reader.read(Run.read(run_dir).events, final=True):
                click.echo(text, nl=False)
            return
        time.sleep(1)


# --- cancel ------------------------------------------------------------------------------------


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def cancel(run_dir: Path) -> None:
    """Cancel the job of RUN_DIR that has not ended, and record that the user cancelled it:
    the run ends `cancelled` (it is not requeued); `hpctf resubmit` starts it again."""
    run = Run.read(run_dir)
    if not run.slurm:
        raise UserError(f"{run.run.path} runs on a local site: stop its launcher (Ctrl-C) instead")
    open_jobs = [
        job["job_id"]
        for job in job_history(run.events)
        if "ended" not in job and not _cancelled(run.events, job["job_id"])
    ]
    if not open_jobs:
        click.echo(
            f"nothing to cancel: no job of {run.run.path} is open (the run is {run.state.state})"
        )
        return
    slurm.cancel(open_jobs)  # scancel of a job that has just ended succeeds too
    run.run.record("cancelled", jobs=open_jobs)
    click.echo(f"cancelled: {' '.join(open_jobs)}")


# --- plot --------------------------------------------------------------------------------------

RESTART_LABELS = {
    "preempted": "preempted",
    "timeout": "time limit",
    "node_fail": "node failure",
    "failed": "crash",
    "stalled": "stalled",
    "cancelled": "cancelled",
    "done": "done",
}


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The PNG to write (default: RUN_DIR/loss.png).",
)
def plot(run_dir: Path, output: Path | None) -> None:
    """Draw RUN_DIR's loss and eval metrics against step, each restart marked with why the
    start before it ended. Needs matplotlib: pip install 'hpctf[plot]'."""
    run = Run.read(run_dir)
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise UserError(
            "hpctf plot needs matplotlib, which is not installed: pip install 'hpctf[plot]'"
        ) from None
    records = metric_records(run.run.metrics)
    losses = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))]
    if not losses:
        raise UserError(f"{run.run.metrics}: no loss logged yet; nothing to plot")
    output = output or run.run.path / "loss.png"
    figure, axes = pyplot.subplots(figsize=(9, 5), dpi=100)
    axes.plot([s for s, _ in losses], [v for _, v in losses], label="training loss", color="C0")
    if all(v > 0 for _, v in losses):
        axes.set_yscale("log")
    evals: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for name, value in (record.get("eval") or {}).items():
            if isinstance(value, (int, float)):
                evals.setdefault(name, []).append((record["step"], value))
    other = axes.twinx() if any(name != "loss" for name in evals) else axes
    for i, (name, points) in enumerate(sorted(evals.items()), 1):
        (axes if name == "loss" else other).plot(
            [s for s, _ in points],
            [v for _, v in points],
            marker="o",
            linestyle="--",
            color=f"C{i}",
            label=f"eval {name}",
        )
    previous = None
    for number, start in enumerate(run.state.starts, 1):
        if number > 1 and previous is not None:
            why = RESTART_LABELS.get(previous.reason or "", previous.reason or "killed")
            axes.axvline(start.step, color="grey", linestyle=":", linewidth=1)
            axes.annotate(
                f"restart {number} (after {why})",
                (start.step, 0.98),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color="dimgrey",
            )
        previous = start
    axes.set_xlabel("step (optimizer updates)")
    axes.set_ylabel("training loss" + (" (log scale)" if axes.get_yscale() == "log" else ""))
    if other is not axes:
        other.set_ylabel("eval metric")
    handles, labels = axes.get_legend_handles_labels()
    if other is not axes:
        more_handles, more_labels = other.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axes.legend(handles, labels, loc="upper right")
    axes.set_title(f"{run.name}: {run.state.state}, {len(run.state.starts)} start(s)")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(output)
    pyplot.close(figure)
    click.echo(f"wrote {output}")


COMMANDS = (status, runs, logs, cancel, plot)
