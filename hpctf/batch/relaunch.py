"""Starting the workers again in the job's own allocation (job-end's RELAUNCH_EXIT: the batch
script runs srun again), instead of a requeue: after a crash or a stall on nodes Slurm calls
well, and after a lost node while a spare is left (``resources.spare_nodes``).

A lost node is found once srun has ended (:func:`note_lost_nodes`), first from Slurm's word:
a node of the allocation that Slurm says is down, drained or not responding. Mostly that is
enough: while a node's slurmd is gone, srun waits for Slurm to declare the node DOWN
(SlurmdTimeout) before it ends, even once every other rank has left (measured on the test
cluster: the survivors left within 1 s of the loss; srun ended 78 s later with
SlurmdTimeout=60, in the same second Slurm set the node DOWN and dropped it from the
``--no-kill`` job). But not always: when the lost node's slurmstepd reported its tasks' deaths
before it died, srun ends at once and Slurm still calls the node well (seen on Slurm 24.11).
Then a probe step on the allocation's nodes (:mod:`hpctf.core.scheduler.node_probe`, about
0.05 s when they are all there) finds it: a node where no step starts is lost. Not the
survivors' ``peer_lost`` records: a rank that srun ended first records none, and a lost peer
is as often a crashed process on a node that is well.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import click

from hpctf.core.run import journal
from hpctf.core.run.history import RunHistory, lost_in_allocation
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import write_atomic
from hpctf.core.scheduler import node_probe, slurm
from hpctf.core.scheduler.hostnames import expand_nodelist
from hpctf.core.settings.config import ResolvedConfig

# A crash or a stall leaves the job's nodes free and well (Slurm says so): its workers start
# again in the same allocation, seconds after the crash, where a requeue waits for Slurm's
# requeue to complete, the start time hpctf gives it (RELEASE_AFTER_S) and then Slurm's next
# scheduling pass, which on an idle cluster is its periodic one (sched_interval, 60 s by
# default; the backfill pass runs only after a change): measured on the test cluster, a
# requeued job started 28 s after its start time. Anything else is requeued by Slurm.
RELAUNCH_REASONS = frozenset({"failed", "stalled"})
# A relaunch keeps the job's time limit: with less than this left, a requeue (a new time
# limit) serves the run better.
RELAUNCH_MIN_LEFT_S = 300
# The nodes_down record's "signal" when job-end, not the SIGTERM trap, found the nodes: from
# Slurm's word, or from a probe step.
FOUND_AT_END = "srun ended"
FOUND_BY_PROBE = "probe"


def now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def note_lost_nodes(
    run: RunDir, history: RunHistory, job_id: str, nodes: str | None
) -> RunHistory:
    """Record the nodes of this allocation (``nodes``: SLURM_JOB_NODELIST) that are lost and
    that no earlier start of the allocation lost (``nodes_down``, found when srun ended): those
    Slurm says are down, drained or not responding, else those where a probe step does not
    start. Returns ``history`` with the record, if any."""
    if not nodes:
        return history
    known = set(lost_in_allocation(history.state.starts))
    left = [node for node in expand_nodelist(nodes) if node not in known]
    try:
        lost = [node for node in slurm.unusable_nodes(nodes) if node not in known]
        found, how = FOUND_AT_END, "Slurm: down or drained"
        if not lost:
            own_id = os.environ.get("SLURM_JOB_ID", job_id)  # an array task's own job
            lost = node_probe.unreachable_nodes(own_id, left)
            found, how = FOUND_BY_PROBE, "no step starts there; Slurm has not said so yet"
    except slurm.SlurmFailure as exc:
        click.echo(f"hpctf: cannot tell whether a node of job {job_id} was lost: {exc}", err=True)
        return history
    if not lost:
        return history
    click.echo(f"hpctf: job {job_id} lost node(s) {','.join(lost)} ({how})")
    return history.plus(journal.record_nodes_down(run, job_id, lost, found))


def relaunch_refusal(
    history: RunHistory,
    reason: str,
    job_id: str,
    nodes: str | None,
    left_out: Sequence[str] = (),
) -> str | None:
    """Why the workers of a start that ended for ``reason`` must not start again in this
    allocation (``nodes``: SLURM_JOB_NODELIST, less the nodes ``left_out`` of it), or None when
    they may: a crash or a stall, on nodes none of which failed under the run (the journal) nor
    is down or drained (Slurm), in a job that Slurm is not ending (still RUNNING, a time limit
    not about to end it)."""
    if reason not in RELAUNCH_REASONS:
        return f"{reason} is not a crash or a stall"
    if not nodes:
        return "no SLURM_JOB_NODELIST"
    mine = [node for node in expand_nodelist(nodes) if node not in left_out]
    failed = set(history.failed_nodes) & set(mine)
    if failed:
        return f"node(s) {','.join(sorted(failed))} failed under the run"
    try:
        unusable = [node for node in slurm.unusable_nodes(nodes) if node not in left_out]
        if unusable:
            return f"Slurm says node(s) {','.join(unusable)} cannot run jobs"
        info = slurm.job_info(job_id) or {}
    except slurm.SlurmFailure as exc:
        return f"Slurm did not answer: {exc}"
    if info.get("JobState") != "RUNNING":
        return f"the job is {info.get('JobState', 'unknown to Slurm')}"
    left = slurm.seconds_left(info)
    if left is not None and left < RELAUNCH_MIN_LEFT_S:
        return f"{left:.0f} s left of its time limit"
    return None


def relaunch_here(
    run: RunDir,
    config: ResolvedConfig,
    history: RunHistory,
    job_id: str,
    why: str,
    left_out: Sequence[str] = (),
) -> RunHistory:
    """Record the requeue of the start that ended (``in_place``: the same allocation, no
    Slurm requeue) and the new start, as job-start would, and write the nodes the next srun
    leaves out (``left_out``, :attr:`RunDir.step_exclude`): the batch script then runs srun
    again at once (job-end's RELAUNCH_EXIT). Returns ``history`` with both records."""
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    if nodes and left_out:  # the nodes the workers may run on, the lost ones left out
        nodes = ",".join(node for node in expand_nodelist(nodes) if node not in left_out)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    write_atomic(run.step_exclude, ",".join(left_out), mode=None)
    history = history.plus(journal.record_requeued(run, job_id, why, in_place=True))
    click.echo(f"hpctf: job {job_id} starts its workers again in this allocation: {why}")
    # Milliseconds: the seconds from a crash to the next start are measured from this line.
    click.echo(f"===== hpctf: job {job_id} start (restart {restart}, again in this allocation) "
               f"on {nodes} at {now('milliseconds')} =====")  # fmt: skip
    return history.plus(record_started(run, job_id, nodes, config, restart))


def record_started(
    run: RunDir, job_id: str, nodes: str | None, config: ResolvedConfig, restart: int
) -> dict[str, Any]:
    """The ``started`` record of this job's start (a new job, or again in this allocation);
    an array task's record also names its own Slurm job id."""
    return journal.record_started(
        run,
        job_id,
        nodes=nodes,
        walltime_signal=config.site.preemption.signal,
        slurm_job_id=os.environ["SLURM_JOB_ID"] if "_" in job_id else None,
        restart_count=restart,
    )
