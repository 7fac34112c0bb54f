"""What ``hpctf status`` says of runs, pure: one run as a JSON-ready document (state and why,
budgets, Slurm's word, progress, code, each job and start), many as a table, one in full as
lines. The commands that read runs and ask Slurm are in :mod:`hpctf.login.watching.status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctf.core.errors import exit_text as exit_words
from hpctf.core.errors import one_line
from hpctf.core.run import ownership, snapshot
from hpctf.core.run.history import (
    PLANNED_RESTART,
    Job,
    RestartCause,
    RunState,
    RunStatus,
    Start,
    as_seen,
)
from hpctf.core.run.listing import DONE_BYTES, RunFacts
from hpctf.core.safe_files import NotARegularFile, read_bounded
from hpctf.core.scheduler import slurm
from hpctf.login.reading.progress import code_text, duration, progress, sparkline
from hpctf.login.reading.runs import RunRecord, metric_records
from hpctf.login.reading.slurm_view import REQUEUED_STATES, SlurmView, slurm_state, slurm_text


def with_slurm_queue(run: RunFacts, current: Mapping[str, str] | None) -> RunState:
    """The run's state as every command shows it (status, plot): the journal's
    (:attr:`hpctf.core.run.history.RunHistory.state`) with what this host and Slurm's queue
    know that the journal cannot, decided by :func:`hpctf.core.run.history.as_seen`.
    ``current`` is :func:`slurm_state` of the run's job."""
    gone = local_launcher_gone(Path(run.path), run.slurm, run.state.state)
    launcher = None if gone is None else f"the local launcher (pid {gone.pid} on {gone.host})"
    return as_seen(
        run.state,
        local=not run.slurm,
        launcher_gone=launcher,
        path=run.path,
        slurm_requeued=bool(current and current["state"] in REQUEUED_STATES),
        closed_reason=run.closed_last_reason,
    )


def local_launcher_gone(path: Path, slurm: bool, state: RunStatus) -> ownership.Claim | None:
    """The claim of the launcher of the local run at ``path`` that the journal says is
    running (``state``) but that is gone from this host (its pid runs no more), or None. A
    launcher that could not write its ``ended`` record (a full disk, SIGKILL) must not read as
    running for ever; on another host nobody here can tell, and the journal's word stands."""
    if slurm or state != RunStatus.RUNNING:
        return None
    owner = ownership.current(path)[1]
    if owner is None or owner.kind in ("job", "submit") or ownership.process_alive(owner):
        return None
    return owner


def has_ended(document: Mapping[str, Any]) -> bool:
    """Whether the run of a ``status --json`` document will not start again by itself: a
    final state, or preempted (saved and stopped) with no job of Slurm's left that may
    requeue it. What :meth:`hpctf.Run.wait` and a sweep's end wait for."""
    state = RunStatus(document["state"])
    if state.final:
        return True
    if state != RunStatus.PREEMPTED:
        return False
    current = document.get("slurm")
    return not current or current.get("state") in slurm.FINAL_STATES


def run_document(run: RunFacts, view: SlurmView, now: float) -> dict[str, Any]:
    """Everything `hpctf status` says of one run in a listing, as one JSON-ready mapping: its
    facts (:mod:`hpctf.core.run.listing`), with what Slurm says and the time now."""
    current = slurm_state(run, run.job, view)
    shown = with_slurm_queue(run, current)
    # An older journal's line may be a whole tensor: one line here, all of it in the rank log.
    state, why = shown.state, one_line(shown.why)
    return {
        "run": run.name,
        "path": run.path,
        "site": run.site,
        "scheduler": run.scheduler,
        "job": run.job,
        "slurm": current,
        "state": state,
        "why": why,
        "requeues": {
            "preemption": [shown.preemption_requeues, run.max_requeues],
            "failure": [shown.failure_requeues, run.max_failure_requeues],
        },
        # train.restart_every_steps: ended on purpose and requeued, within no budget.
        "planned_restarts": sum(1 for s in shown.starts if s.reason == PLANNED_RESTART),
        **progress(run, now, running=state == RunStatus.RUNNING),
        "code": [dict(c) for c in run.code],
        "starts": [_start_document(s) for s in run.state.starts],
        "jobs": [_job_document(run, job, view) for job in run.jobs],
        # `resubmit --set train.steps=N` (hpctf.login.submitting.extend): when, and what.
        "extended": [dict(e) for e in run.extensions],
    }


def _start_document(start: Start) -> dict[str, Any]:
    return {
        "job": start.job_id,
        "from_step": start.step,
        "reason": start.reason,
        "cause": start.cause,
        "exit_code": start.exit_code,
        "end_step": start.end_step,
        "nodes": start.nodes,
        "lost_nodes": list(start.lost_nodes),
        "user_code": start.user_code,
    }


def _job_document(run: RunFacts, job: Job, view: SlurmView) -> dict[str, Any]:
    return {
        "job": job.job_id,
        "slurm": slurm_state(run, job.job_id, view),
        "ended": job.ended,
        "exit_code": job.exit_code,
        "starts": job.starts,
        "nodes": job.nodes,
    }


def full_document(run: RunRecord, view: SlurmView, now: float) -> dict[str, Any]:
    """:func:`run_document` of one run, with every logged loss and its last evaluation."""
    document = run_document(run.facts, view, now)
    records = metric_records(run.run.metrics, None)
    document["losses"] = [[r["step"], r["loss"]] for r in records if "loss" in r]
    evaluations = [r for r in records if isinstance(r.get("eval"), dict)]
    document["eval"] = evaluations[-1] if evaluations else None
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
                slurm_text(d["slurm"]),
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


def sweep_rows(sweeps: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """A sweep as one row: its array job, and its points' states counted in STATE."""
    rows = []
    for d in sweeps:
        counts = ", ".join(f"{n} {state}" for state, n in d["states"].items()) or "no points read"
        row = [d["sweep"], d["job"] or "-", "-", f"sweep of {d['points']}: {counts}"]
        rows.append(tuple(row + ["-"] * (len(TABLE_COLUMNS) - len(row))))
    return rows


def status_table(
    documents: Sequence[Mapping[str, Any]], sweeps: Sequence[Mapping[str, Any]] = ()
) -> str:
    """The runs and sweeps as one table, then a line for each run whose state has a why,
    and a legend when a state comes from the journal alone."""
    # Joined once: a runs root of 10,000 runs has thousands of these lines.
    lines = [format_table(TABLE_COLUMNS, table_rows(documents) + sweep_rows(sweeps))]
    lines += [f"{d['run']}: {d['state']}: {d['why']}\n" for d in documents if d["why"]]
    if any((d["slurm"] or {}).get("state") == "ENDED" for d in documents):
        lines.append(
            "ENDED (reason): Slurm no longer knows the job; its end as the run directory "
            "recorded it\n"
        )
    return "".join(lines)


def _planned(every: int | None, document: Mapping[str, Any]) -> str:
    if not every:
        return ""
    return f"; planned restarts {document.get('planned_restarts', 0)} (every {every:,} steps)"


def describe_run(run: RunRecord, document: Mapping[str, Any]) -> str:
    """The single-run view: state and why, budgets, code, Slurm, progress, each job, each
    start."""
    lines = []
    pre, fail = document["requeues"]["preemption"], document["requeues"]["failure"]
    why = f" ({document['why']})" if document["why"] else ""
    lines.append(
        f"run: {document['state']}{why}; requeues after preemption {pre[0]}/{pre[1]}, "
        f"after failures {fail[0]}/{fail[1]}"
        + _planned(run.config.experiment.train.restart_every_steps, document)
    )
    lines.extend(f"code: {source.describe()}" for source in snapshot.read(run.run.path))
    script = run.config.experiment.train.script
    if script is not None:
        lines.append(f"script: {script_text(script, document, run.run.checkpoint_step())}")
    for extension in document["extended"]:
        changed = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in extension["changes"].items())
        lines.append(f"extended: {extension['time']}: {changed or 'no change'}")
    if run.slurm and document["job"]:
        current = document["slurm"] or {}
        when = f"; may start {current['start']}" if current.get("start") else ""
        lines.append(f"slurm: job {document['job']} {slurm_text(current)}{when}")
    lines.extend(_progress_lines(document))
    lines.extend(_job_line(job) for job in document["jobs"])
    jobs = {job["job"]: job["slurm"] for job in document["jobs"]}
    starts = run.state.starts
    for number, start in enumerate(starts, 1):
        # The last start logged steps past its end record's (its checkpoint's) step: the step
        # it failed at is the last one it logged.
        logged = document["step"] if number == len(starts) else None
        lines.append(
            f"start {number}: job {start.job_id} from step {start.step}: "
            f"{_end(start, jobs.get(start.job_id), logged)}"
        )
    lines.append(f"last logged step: {document['step'] if document['step'] is not None else '-'}")
    done = done_text(run.run.done)
    lines.append(f"done: {done}")
    return "\n".join(lines) + "\n"


def _progress_lines(document: Mapping[str, Any]) -> list[str]:
    """Progress, the loss's sparkline and the last evaluation, in the single-run view."""
    lines = []
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
    if evaluation := document.get("eval"):
        shown = ", ".join(f"{k} {_number(v)}" for k, v in sorted(evaluation["eval"].items()))
        lines.append(f"eval: step {evaluation['step']}: {shown}")
    return lines


def _job_line(job: Mapping[str, Any]) -> str:
    """One job of the single-run view: Slurm's word (or the journal's), exit, starts, nodes."""
    state = job["slurm"]
    if job["ended"] and (state is None or state["source"] == "journal" or _final(state)):
        text = "ENDED"
    elif state is None:
        text = "PENDING/RUNNING"
    elif state["state"] == "UNKNOWN":
        text = f"UNKNOWN ({state['reason']})"
    else:
        text = slurm_text(state)
    exit_text = f" {exit_words(job['exit_code'])}" if job["exit_code"] is not None else ""
    return f"job {job['job']}: {text}{exit_text} starts {job['starts']} nodes {job['nodes'] or '-'}"


def script_text(script: str, document: Mapping[str, Any], checkpoint_step: int) -> str:
    """A ``train.script`` run's script, and whether hpctf can resume it mid-run: only through
    ``hpctf.keras.callbacks()``, seen by its checkpoints or the total it records."""
    if checkpoint_step or document.get("total_steps"):
        return f"{script} (hpctf.keras.callbacks(): resumes from its newest checkpoint)"
    return (
        f"{script} (no checkpoint or step from hpctf.keras.callbacks() yet: until there is one "
        "hpctf cannot resume it mid-run; a requeue starts it again, from its own checkpoints "
        "if it keeps any)"
    )


def _final(state: Mapping[str, str]) -> bool:
    return state["state"] in slurm.FINAL_STATES


def _end(start: Start, job: Mapping[str, str] | None, logged: int | None = None) -> str:
    if not start.reason:
        # Its batch shell was killed before it could record the end (scancel, KillWait).
        if job is not None and job["source"] != "journal" and _final(job):
            return f"ended without a record of its own (Slurm: {job['state']})"
        if job is not None and job["source"] != "journal" and job["state"] in REQUEUED_STATES:
            return f"ended; Slurm requeued its job ({slurm_text(job)})"
        return "not ended"
    if start.user_code is not None:  # what the user's code raised, not srun's 143 for it
        return f"{start.user_code} (step {start.end_step}, {exit_words(start.exit_code)})"
    end_step = start.end_step
    # The restart's cause where the reason alone does not say it (a crash or a lost peer).
    cause = f", cause {start.cause}" if start.cause in _CAUSES_TO_SAY else ""
    if cause and start.lost_nodes:  # which node was lost
        cause += f" {','.join(start.lost_nodes)}"
    if logged is not None and end_step is not None and logged > end_step and start.exit_code:
        saved = f"its last checkpoint step {end_step}" if end_step else "no checkpoint"
        return f"{start.reason} at step {logged} ({exit_words(start.exit_code)}; {saved}{cause})"
    return f"{start.reason} at step {end_step} ({exit_words(start.exit_code)}{cause})"


_CAUSES_TO_SAY = frozenset(
    {RestartCause.WORKER_CRASHED, RestartCause.PEER_LOST, RestartCause.NODE_LOST}
)


def done_text(path: Path) -> str:
    """DONE's line as the single-run view shows it: ``no`` without one; a DONE that is no
    regular file of a line (a FIFO, a device, a huge file) is said, not read."""
    try:
        return read_bounded(path, DONE_BYTES, "DONE").decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return "no"
    except (OSError, NotARegularFile) as exc:
        return f"unreadable ({exc})"
