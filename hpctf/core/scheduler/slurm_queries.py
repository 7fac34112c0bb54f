"""Queries for many jobs at once, through the one wrapper
(:func:`hpctf.core.scheduler.slurm.run_command`):
one ``squeue`` and one ``sacct`` call however many runs a command shows, each parsed into
:class:`JobRecord`, transient failures retried a couple of times with backoff within a time
budget, so a user with fifty runs never floods slurmctld (submitit#1759,
Snakemake-Profiles/slurm#74).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctf.core.safe_files import write_atomic
from hpctf.core.scheduler.slurm import (
    FINAL_STATES,
    SlurmError,
    SlurmGone,
    SlurmNoAccounting,
    SlurmTransient,
    checked_job_ids,
    run_command,
)


@dataclass(frozen=True)
class JobRecord:
    """What Slurm says of one job: its state in Slurm's words (PENDING, RUNNING, REQUEUED,
    PREEMPTED, TIMEOUT, NODE_FAIL, CANCELLED, FAILED, COMPLETED, ...), why it is pending
    (``reason``, "" for none), and which command said so (``source``: squeue or sacct)."""

    job_id: str
    state: str
    reason: str = ""
    source: str = "squeue"
    exit_code: str = ""
    start: str = ""
    end: str = ""
    elapsed: str = ""
    nodes: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# squeue has no --parsable: a format with "|" between fields (none of them holds one).
SQUEUE_FIELDS = ("%i", "%T", "%r", "%S", "%M", "%N")
SACCT_FIELDS = ("JobIDRaw", "State", "Reason", "ExitCode", "Start", "End", "Elapsed", "NodeList")

# Pauses between tries after a transient failure (a couple of retries, then give up).
RETRY_PAUSES_S = (1.0, 3.0)
# A failure that took this long is not tried again (measured: squeue against a slurmctld that
# is down fails after 18 s with "Unable to contact slurm controller", MessageTimeout 10 s).
SLOW_FAILURE_S = 5.0


def _none_word(value: str) -> str:
    return "" if value in ("None", "(null)", "n/a", "Unknown") else value


def parse_squeue(out: str) -> dict[str, JobRecord]:
    """``squeue --noheader --format=<SQUEUE_FIELDS joined by |>`` output, by job id."""
    jobs: dict[str, JobRecord] = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) != len(SQUEUE_FIELDS) or not fields[0]:
            continue
        job_id, state, reason, start, elapsed, nodes = fields
        jobs[job_id] = JobRecord(
            job_id,
            state,
            reason=_none_word(reason),
            source="squeue",
            start=_none_word(start),
            elapsed=elapsed,
            nodes=nodes,
        )
    return jobs


def parse_sacct(out: str) -> dict[str, JobRecord]:
    """``sacct --parsable2 --noheader --format=<SACCT_FIELDS>`` output, by job id.

    A state such as ``CANCELLED by 1000`` keeps its first word. A job listed twice (a requeue,
    with ``--duplicates``) keeps its last line, the newest record.
    """
    jobs: dict[str, JobRecord] = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) != len(SACCT_FIELDS) or not fields[0]:
            continue
        job_id, state, reason, exit_code, start, end, elapsed, nodes = fields
        jobs[job_id] = JobRecord(
            job_id,
            state.split(" ")[0],
            reason=_none_word(reason),
            source="sacct",
            exit_code=exit_code,
            start=_none_word(start),
            end=_none_word(end),
            elapsed=elapsed,
            nodes=_none_word(nodes),
        )
    return jobs


def query(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    budget_s: float = 40.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """:func:`run_command` for a read-only query, tried again after quick
    :class:`~hpctf.core.scheduler.slurm.SlurmTransient` failures (pausing
    :data:`RETRY_PAUSES_S`) while ``budget_s`` seconds last; the last failure is raised. A
    command that ran out of time, or took :data:`SLOW_FAILURE_S` or more to fail (the client
    had already retried: an unreachable slurmctld takes MessageTimeout and more), is not tried
    again: a slow controller gets no more load from us, nor the user a longer wait."""
    deadline = time.monotonic() + budget_s
    pauses = list(RETRY_PAUSES_S)
    while True:
        began = time.monotonic()
        try:
            return run_command(argv, env=env, timeout=max(deadline - began, 1.0))
        except SlurmTransient as exc:
            transient = exc.returncode > 0  # not one that ran out of time
            quick = time.monotonic() - began < SLOW_FAILURE_S
            if not (transient and quick and pauses) or time.monotonic() + pauses[0] >= deadline:
                raise
            sleep(pauses.pop(0))


def squeue_jobs(
    job_ids: Sequence[str], env: Mapping[str, str] | None = None
) -> dict[str, JobRecord]:
    """What slurmctld knows of ``job_ids``, in ONE squeue call, by job id: jobs it has forgotten
    (ended longer than MinJobAge ago) are missing. Raises SlurmError when it cannot answer."""
    ids = sorted(set(checked_job_ids(job_ids)))
    if not ids:
        return {}
    # --array: one line per array task. Without it squeue folds pending tasks into one line
    # (500003_[1-2]) that names none of the ids asked (measured, Slurm 22.05).
    argv = [
        "squeue",
        f"--jobs={','.join(ids)}",
        "--array",
        "--states=all",
        "--noheader",
        f"--format={'|'.join(SQUEUE_FIELDS)}",
    ]
    try:
        out = query(argv, env=env)
    except SlurmGone:  # every id forgotten: squeue exits 1 (Invalid job id specified)
        return {}
    return {job_id: job for job_id, job in parse_squeue(out).items() if job_id in ids}


def commented_jobs(comment: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The ids of the caller's jobs that slurmctld holds, pending or running, whose comment is
    ``comment``, in ONE squeue call (array tasks one by one). Raises SlurmError when it cannot
    answer."""
    argv = ["squeue", "--me", "--array", "--noheader", "--format=%i|%k"]
    try:
        out = query(argv, env=env)
    except SlurmGone:  # "Invalid job id": no job to speak of
        return []
    found = []
    for line in out.splitlines():
        job_id, _, said = line.strip().partition("|")
        if said == comment and job_id:
            found.append(job_id)
    return sorted(found)


def sacct_jobs(
    job_ids: Sequence[str], env: Mapping[str, str] | None = None
) -> dict[str, JobRecord]:
    """What the accounting database knows of ``job_ids``, in ONE sacct call (the job
    allocations, the newest record of a requeued job), by job id. A cluster without
    accounting ("Slurm accounting storage is disabled") knows nothing: ``{}``. Raises
    SlurmError when slurmdbd cannot answer."""
    ids = sorted(set(checked_job_ids(job_ids)))
    if not ids:
        return {}
    argv = [
        "sacct",
        f"--jobs={','.join(ids)}",
        "--allocations",
        "--noheader",
        "--parsable2",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
    try:
        out = query(argv, env=env)
    except SlurmNoAccounting:
        return {}
    return {job_id: job for job_id, job in parse_sacct(out).items() if job_id in ids}


def sacct_runs(job_id: str, env: Mapping[str, str] | None = None) -> list[JobRecord]:
    """Every run of job ``job_id`` that the accounting database knows, oldest first: a job
    Slurm requeued has one record per start (``sacct --duplicates``), the earlier ones REQUEUED,
    PREEMPTED or NODE_FAIL. [] without accounting."""
    argv = [
        "sacct",
        f"--jobs={job_id}",
        "--allocations",
        "--duplicates",
        "--noheader",
        "--parsable2",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
    try:
        out = query(argv, env=env, budget_s=10.0)
    except SlurmNoAccounting:
        return []
    runs = []
    for line in out.splitlines():
        record = parse_sacct(line).get(job_id)
        if record is not None:
            runs.append(record)
    return runs


def max_array_size(env: Mapping[str, str] | None = None) -> int:
    """The cluster's MaxArraySize (``scontrol show config``): every array index must be
    below it (slurm.conf(5))."""
    out = query(["scontrol", "show", "config"], env=env)
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    raise SlurmError(["scontrol", "show", "config"], 0, "", "no MaxArraySize in its output")


# sacct_usage's fields (hpctf.core.run.hours.USAGE_FIELDS reads them, in this order), and how
# many ids one call names: Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN).
USAGE_FIELDS = ("JobID", "State", "ElapsedRaw", "NNodes", "AllocTRES")
USAGE_IDS_PER_CALL = 5000


def sacct_usage(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """What the accounting database says each start of ``job_ids`` held and for how long:
    sacct's own text (``--allocations --duplicates --parsable2``, :data:`USAGE_FIELDS`), for
    :func:`hpctf.core.run.hours.parse_usage`. One call for every job (a call per
    :data:`USAGE_IDS_PER_CALL` ids); the tasks of a job array are asked by the array's id, once.
    None when the cluster keeps no accounting. Raises SlurmError when slurmdbd cannot answer."""
    asked = sorted({job_id.split("_")[0] for job_id in checked_job_ids(job_ids)}, key=int)
    texts = []
    for first in range(0, len(asked), USAGE_IDS_PER_CALL):
        chunk = asked[first : first + USAGE_IDS_PER_CALL]
        argv = [
            "sacct",
            f"--jobs={','.join(chunk)}",
            "--allocations",
            "--duplicates",
            "--noheader",
            "--parsable2",
            f"--format={','.join(USAGE_FIELDS)}",
        ]
        try:
            texts.append(query(argv, env=env))
        except SlurmNoAccounting:
            return None
    return "".join(texts)


# The caller's queue as one squeue --me saw it, shared by every watcher of this user on this
# host: a thousand `hpctf logs -f` or Run.wait loops ask slurmctld once per SHARED_QUEUE_S, not
# once each (measured: a watcher asking for its own job costs 3 RPCs a look).
def shared_queue_file(env: Mapping[str, str] | None = None) -> str:
    """The snapshot's file name for the cluster ``env`` talks to: one per Slurm configuration
    and squeue (a login node may reach two clusters, whose job ids overlap)."""
    env = os.environ if env is None else env
    squeue = shutil.which("squeue", path=env.get("PATH")) or "squeue"
    key = hashlib.sha256(f"{env.get('SLURM_CONF', '')}\0{squeue}".encode()).hexdigest()[:16]
    return f"squeue-me-{key}.json"


def shared_user_queue(
    folder: Path, max_age_s: float, env: Mapping[str, str] | None = None
) -> dict[str, JobRecord]:
    """Every job of the caller's that slurmctld holds, by job id, from ONE ``squeue --me``
    shared through ``folder`` (the user's own cache), one per cluster
    (:func:`shared_queue_file`): a snapshot younger than ``max_age_s`` is read instead of
    asking; of the watchers that find it old, one asks while the others wait for its answer
    (a lock). Raises SlurmError when Slurm cannot answer."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = shared_queue_file(env)
    path = folder / name
    if (fresh := _snapshot(path, max_age_s)) is not None:
        return fresh
    with open(folder / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (fresh := _snapshot(path, max_age_s)) is not None:  # asked while this one waited
            return fresh
        argv = ["squeue", "--me", "--array", "--states=all", "--noheader",
                f"--format={'|'.join(SQUEUE_FIELDS)}"]  # fmt: skip
        out = query(argv, env=env)
        # Not fsync'd: a snapshot lost in a crash is asked again.
        write_atomic(path, json.dumps({"time": time.time(), "out": out}), sync=False)
        return parse_squeue(out)


def _snapshot(path: Path, max_age_s: float) -> dict[str, JobRecord] | None:
    """The jobs of the snapshot at ``path`` when it is younger than ``max_age_s`` (and not
    from the future: a clock stepped back), else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        age = time.time() - float(data["time"])
        out = str(data["out"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return parse_squeue(out) if 0 <= age < max_age_s else None
