"""What the batch script runs around srun, never importing TensorFlow.

``job-start`` records the start (and the checkpoint step it resumes from) and refuses to go on
once the run has given up or Slurm restarted it past its failure budget; ``job-signal`` is the
batch shell's SIGTERM trap; ``job-end`` records why the start ended (done, preempted, timeout,
stalled, failed, node_fail, cancelled) and requeues the job when the run's budgets allow
(:mod:`hpctf.core.run.history` decides, from the journal alone, read once per command).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from hpctf.batch.relaunch import (
    RELAUNCH_REASONS,
    note_lost_nodes,
    now,
    record_started,
    relaunch_here,
    relaunch_refusal,
)
from hpctf.core.errors import GAVE_UP_EXIT, NOT_STARTING_EXIT, RELAUNCH_EXIT, EnvironmentProblem
from hpctf.core.run import journal, ownership, run_index
from hpctf.core.run.history import (
    PLANNED_RESTART,
    PRUNED,
    Budgets,
    EndReason,
    RunHistory,
    Start,
    after_end,
    before_start,
    lost_in_allocation,
    read_history,
    reason_from_slurm,
    record_end,
    spare_refusal,
)
from hpctf.core.run.notifications import notify_end
from hpctf.core.run.run_identity import check_not_a_copy
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm, slurm_queries
from hpctf.core.settings.config import ResolvedConfig

_run_dir_argument = click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))


def budgets(config: ResolvedConfig) -> Budgets:
    preemption = config.site.preemption
    return Budgets(preemption=preemption.max_requeues, failure=preemption.max_failure_requeues)


def _job_id(command: str) -> str:
    """This job's id as the journal and Slurm commands take it (:func:`journal.job_handle`)."""
    job_id = journal.job_handle(os.environ)
    if not job_id:
        raise EnvironmentProblem(
            f"SLURM_JOB_ID is not set: {command} runs inside a Slurm batch job"
        )
    return job_id


class _GaveUp(click.ClickException):
    exit_code = GAVE_UP_EXIT


@click.command("job-start", hidden=True)
@_run_dir_argument
def job_start(run_dir: Path) -> None:
    """Record the start of a batch job in RUN_DIR; exit 1 if the run must not go on, and
    NOT_STARTING_EXIT (the batch script then ends the job with 0) when this job has nothing to
    do: another job owns the run (:mod:`hpctf.core.run.ownership`), or the run is complete."""
    run = RunDir.open(run_dir)
    check_not_a_copy(run)
    job_id = _job_id("job-start")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    # The job's own output is appended across its starts (--open-mode=append): mark each one.
    click.echo(f"===== hpctf: job {job_id} start (restart {restart}) on {nodes} at {now()} =====")
    try:
        owner = ownership.take(run.path, ownership.claim_of("job", job_id), ownership.alive)
    except slurm.SlurmFailure as exc:
        raise EnvironmentProblem(f"cannot tell who owns {run.path}: {exc}") from exc
    if owner is not None:
        journal.record_not_started(run, job_id, owner.describe())
        # A job's claim ends with the job; a process elsewhere nobody here can see.
        claims = ownership.claims_dir(run.path)
        hint = "" if owner.kind == "job" else f"; if it is gone: rm {claims}/*"
        click.echo(f"hpctf: job {job_id} ends at once: {owner.describe()} owns {run.path}{hint}")
        sys.exit(NOT_STARTING_EXIT)
    config = run.load_config()
    history = close_unended(run, read_history(run), job_id, config.site.preemption.signal)
    decision = before_start(history.state, budgets(config))
    if not decision.go and not decision.gave_up:
        click.echo(f"hpctf: job {job_id} ends at once: {decision.why}")
        sys.exit(NOT_STARTING_EXIT)
    history = history.plus(record_started(run, job_id, nodes, config, restart))
    if decision.gave_up:
        history = history.plus(journal.record_gave_up(run, job_id, decision.why))
        notify_end(run, config, job_id)
    run_index.note(run, config, history)  # the runs root's listing: this run's new row
    if decision.gave_up:
        raise _GaveUp(f"hpctf: not starting job {job_id}: {decision.why}")


def close_unended(
    run: RunDir, history: RunHistory, job_id: str, walltime_signal: str
) -> RunHistory:
    """The run's last start recorded no end (its batch shell died with its node, or was
    killed hard): record one now from what Slurm's accounting says of that start, its job's
    earlier run when this is the same job started again. Without an answer the journal's own
    reading stands (:func:`hpctf.core.run.history.runstate.starts_of`). Returns ``history``
    with the record written, if any."""
    last = history.last_start
    if last is None or last.reason is not None:
        return history
    try:
        runs = slurm_queries.sacct_runs(last.job_id)
    except slurm.SlurmFailure as exc:  # slurmdbd down; no sacct on the node
        click.echo(f"hpctf: how job {last.job_id}'s start ended is not known: {exc}", err=True)
        return history
    if last.job_id == job_id:
        runs = runs[:-1]  # the newest run is this very start
    if not runs or (not runs[-1].final and runs[-1].state != "REQUEUED"):
        return history
    ended = runs[-1]
    saved = history.saved_on_warning
    signal_saved = None if saved is None else saved.signal or "TERM"
    reason = reason_from_slurm(ended.state, signal_saved, run.done.exists(), walltime_signal)
    if reason != EndReason.CANCELLED and history.saved_for_restart is not None:
        reason = PLANNED_RESTART  # the ranks saved for a planned restart: no failure
    if reason != EndReason.CANCELLED and history.since_last_start_pruned:
        reason = PRUNED  # the search pruned the trial and every rank saved: finished
    code = ended.exit_code.partition(":")[0]
    exit_code = int(code) if code.isdigit() else None
    entry = journal.record_ended_by_slurm(run, last.job_id, exit_code, reason, ended.state)
    click.echo(f"hpctf: job {last.job_id}'s start ended {reason} (Slurm: {ended.state})")
    return history.plus(entry)


@click.command("job-signal", hidden=True)
@_run_dir_argument
@click.argument("name")
def job_signal(run_dir: Path, name: str) -> None:
    """Record that the batch shell got signal NAME (its trap calls this); record the job's
    nodes that Slurm says are down or drained, and keep the job off them when Slurm requeued
    it (:func:`exclude_failed_nodes`)."""
    run = RunDir.open(run_dir)
    job_id = _job_id("job-signal")
    journal.record_signalled(run, job_id, name)
    note_failed_nodes(run, job_id, name)
    # Slurm may have requeued the job (a preemption, a lost node, scontrol requeue): let it
    # start again once its processes are gone, KillWait at the latest, not ~2 minutes later.
    # Measured: Slurm completed a preempted job's requeue 7 s after its trap ran, KillWait 5 s,
    # on a loaded 2-core machine; a start time already past by then is replaced by the hold.
    try:
        after = slurm.kill_wait() + 6
    except slurm.SlurmFailure:
        after = 30 + 6
    release(run, job_id, after)


def note_failed_nodes(
    run: RunDir, job_id: str, name: str, history: RunHistory | None = None
) -> None:
    """Record the job's nodes that Slurm says are down or drained, and keep the job off them
    when Slurm requeued it (:func:`exclude_failed_nodes`). ``history``: the run's, when this
    command has read it (else it is read once, if a node failed)."""
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        return
    try:
        failed = slurm.unusable_nodes(nodes)
    except slurm.SlurmFailure as exc:
        click.echo(f"hpctf: cannot tell whether a node of job {job_id} failed: {exc}", err=True)
        return
    if failed:
        entry = journal.record_nodes_down(run, job_id, failed, name)
        known = read_history(run) if history is None else history.plus(entry)
        exclude_failed_nodes(run, known, job_id)


def release(run: RunDir, job_id: str, after_s: int) -> None:
    """Let job ``job_id``, if Slurm holds it after a requeue, start ``after_s`` seconds from
    now (:func:`slurm.release_requeued`); record it. A job that is not pending (cancelled,
    still running) is left as it is, silently: Slurm requeued nothing."""
    try:
        slurm.release_requeued(job_id, after_s)
    except slurm.SlurmNotPending:
        return
    except slurm.SlurmFailure as exc:
        click.echo(f"hpctf: job {job_id} waits for Slurm's requeue hold: {exc}", err=True)
        return
    journal.record_released(run, job_id, after_s)


def exclude_failed_nodes(run: RunDir, history: RunHistory, job_id: str) -> None:
    """Keep job ``job_id``, pending again after a requeue, off every node that failed under the
    run (its ExcNodeList, from ``history``, the run's); record it. A job that is not pending
    (it ended for good) is left as it is, with a line on stderr: ``hpctf resubmit`` leaves
    those nodes out as well."""
    nodes = history.failed_nodes
    if not nodes:
        return
    try:
        slurm.exclude_nodes(job_id, nodes)
    except slurm.SlurmFailure as exc:
        click.echo(f"hpctf: job {job_id} keeps its nodes: {exc}", err=True)
        return
    journal.record_excluded(run, job_id, nodes)
    click.echo(f"hpctf: job {job_id} will not start on failed node(s) {','.join(nodes)}")


@click.command("job-end", hidden=True)
@_run_dir_argument
@click.option("--exit-code", type=int, required=True)
def job_end(run_dir: Path, exit_code: int) -> None:
    """Record why the batch job's training step ended in RUN_DIR; requeue it when the run's
    budgets allow, recording the requeue only once Slurm has accepted it."""
    run = RunDir.open(run_dir)
    config = run.load_config()
    job_id = _job_id("job-end")
    reason, history = record_end(
        run, read_history(run), job_id, exit_code, config.site.preemption.signal
    )
    history, relaunch = _after_end(run, config, history, job_id, reason)
    # The runs root's listing: this run's new row, from the history this command knows.
    run_index.note(run, config, history)
    if relaunch:
        sys.exit(RELAUNCH_EXIT)


def _after_end(
    run: RunDir, config: ResolvedConfig, history: RunHistory, job_id: str, reason: str
) -> tuple[RunHistory, bool]:
    """Requeue the job that ended (``history``: the run's, with its ``ended`` record) when the
    run's budgets allow, in this allocation when :func:`~hpctf.batch.relaunch.relaunch_refusal`
    has nothing against it (with ``resources.spare_nodes``: the nodes Slurm says were lost
    left out, while a spare is left for each), or record that the run gave up; returns
    ``history`` with the ``requeued`` record (and the new start's), and whether the batch
    script starts the workers again itself. A run that gave up has its row noted here, before
    _GaveUp."""
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    left_out: tuple[str, ...] = ()
    if config.spare_nodes and reason in RELAUNCH_REASONS:  # srun ended: a node lost?
        history = note_lost_nodes(run, history, job_id, nodes)
        left_out = lost_in_allocation(history.state.starts)
    state = history.state
    signalled = state.last is not None and state.last.signalled
    decision = after_end(state, budgets(config))
    if decision.go:
        refusal = spare_refusal(left_out, config.spare_nodes) or relaunch_refusal(
            history, reason, job_id, nodes, left_out
        )
        if refusal is None:
            why = _spare_words(state.last, left_out, config.spare_nodes) + decision.why
            return relaunch_here(run, config, history, job_id, why, left_out), True
        if reason in RELAUNCH_REASONS:
            click.echo(f"hpctf: job {job_id} is requeued, not started again here: {refusal}")
        return _requeue(run, history, job_id, decision.why), False
    elif not decision.gave_up:
        click.echo(f"hpctf: job {job_id} ended: {decision.why}")
        if signalled and reason not in (EndReason.CANCELLED, EndReason.DONE, PRUNED):
            # Slurm ends this job itself and may have requeued it: the trap gave it a start
            # time past KillWait; this shell ends now, so sooner will do.
            release(run, job_id, slurm.RELEASE_AFTER_S)
        notify_end(run, config, job_id)  # no requeue follows: done, failed (notify:)
    elif decision.gave_up:
        run_index.note(run, config, history.plus(journal.record_gave_up(run, job_id, decision.why)))
        notify_end(run, config, job_id)
        message = f"hpctf: job {job_id} not requeued: {decision.why}"
        if "hpctf resubmit" not in decision.why:  # a full disk's line already says it
            message += f"; after a fix, resume with hpctf resubmit {run.path}"
        raise _GaveUp(message)
    return history, False


def _spare_words(last: Start | None, left_out: Sequence[str], spare_nodes: int) -> str:
    """What a restart after a lost node says of it: ``node2 lost: spare 1 of 1 used; ``."""
    if last is None or not last.lost_nodes:
        return ""
    return f"{','.join(last.lost_nodes)} lost: spare {len(left_out)} of {spare_nodes} used; "


def _requeue(run: RunDir, history: RunHistory, job_id: str, why: str) -> RunHistory:
    """Requeue the job through Slurm and record it (``why``); returns ``history`` with the
    ``requeued`` record, or as it was when Slurm had requeued the job itself."""
    # scontrol requeue ends this very job: Slurm sends SIGTERM to the batch script's
    # processes, this one included (SIGKILL after KillWait). Hold it off until the requeue
    # Slurm accepted is recorded; a SlurmFailure leaves no "requeued" record behind.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        try:
            slurm.requeue(job_id)
        except slurm.SlurmAlreadyPending:
            # Slurm requeued it itself after srun ended (a lost node, a preemption): its
            # SIGTERM came while this shell ignored it, so do what the trap would have.
            click.echo(f"hpctf: job {job_id} was requeued by Slurm already")
            note_failed_nodes(run, job_id, "TERM", history)
            release(run, job_id, slurm.RELEASE_AFTER_S)
            return history
        history = history.plus(journal.record_requeued(run, job_id, why))
        exclude_failed_nodes(run, history, job_id)  # a requeue adds no failed node
        click.echo(f"hpctf: job {job_id} requeued: {why}")
        # Last: the batch shell ends right after this (it ignores SIGTERM by now).
        release(run, job_id, slurm.RELEASE_AFTER_S)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return history


COMMANDS = (job_start, job_signal, job_end)
