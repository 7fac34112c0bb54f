"""The only place hpctf runs Slurm commands.

Every call goes through :func:`run_command`: an argv list (never ``shell=True``), a timeout, and
on failure a :class:`SlurmError` carrying the command, exit code, stdout and stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from hpctf.core.errors import DamagedRecord, EnvironmentProblem, UserError

# Job states after which a job will not run again (squeue(1), JOB STATE CODES).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


class SlurmFailure(Exception):
    """A Slurm command that failed: its argv, exit status and output, Slurm's words kept. Each
    cause is a subclass (:func:`failure` picks it); catch the one you handle."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        said = " ".join((stderr.strip() or stdout.strip() or "no output").split())
        super().__init__(f"{argv[0]} failed (exit {returncode}): {said}")


class SlurmError(SlurmFailure, EnvironmentProblem):
    """Slurm failed, not the user's request (exit 3): the base of every cause below but a
    refusal, and what an unrecognised failure is."""


class SlurmMissing(SlurmError):
    """The Slurm command is not on PATH (this is no Slurm login node)."""

    def __init__(self, command: str) -> None:
        super().__init__([command], -1, "", "not found on PATH")
        self.args = (
            f"{command} not found on PATH: run this on a Slurm login node, or use --site local",
        )


class SlurmTransient(SlurmError):
    """No answer this time (timed out, the controller busy or unreachable, its RPC limit):
    worth another try (:func:`hpctf.core.scheduler.slurm_queries.query` retries these)."""


class SlurmGone(SlurmError):
    """Slurm knows no such job (ESLURM_INVALID_JOB_ID): it ended longer than MinJobAge ago."""


class SlurmNotPending(SlurmError):
    """The job is no longer pending (ESLURM_JOB_NOT_PENDING): what only a pending job allows
    (a new begin time, ExcNodeList) was not done."""


class SlurmAlreadyPending(SlurmError):
    """The job is pending already (ESLURM_JOB_PENDING): a requeue found it requeued."""


class SlurmNoAccounting(SlurmError):
    """The cluster keeps no accounting (sacct: "accounting storage is disabled")."""


class SlurmRefused(SlurmFailure, UserError):
    """Slurm refused what was asked: a partition, account or QOS that does not exist, more than
    a node has, a time limit over the partition's (exit 2)."""


# Slurm's clients exit 1 for every error and print the error's text, not its number
# (slurm_strerror() of the ESLURM_* code, src/common/slurm_errno.c:
# https://github.com/SchedMD/slurm/blob/master/src/common/slurm_errno.c); none of sbatch,
# scontrol, scancel or sacct has structured error output in the versions hpctf supports (22.05
# on), so the cause is read from these texts, here and nowhere else. First match wins.
_CAUSES: tuple[tuple[type[SlurmFailure], tuple[str, ...]], ...] = (
    (SlurmGone, ("Invalid job id specified",)),  # ESLURM_INVALID_JOB_ID
    # ESLURM_JOB_NOT_PENDING; older clients said "... is not pending"
    (SlurmNotPending, ("Job is no longer pending execution", "is not pending")),
    (SlurmAlreadyPending, ("Job is pending execution",)),  # ESLURM_JOB_PENDING
    (SlurmNoAccounting, ("accounting storage is disabled",)),  # sacct without slurmdbd
    (
        SlurmTransient,
        (
            "Socket timed out",  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
            "Unable to contact slurm controller",  # SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
            "Connection refused",
            "Connection timed out",
            "Resource temporarily unavailable",  # EAGAIN
            "Zero Bytes were transmitted",  # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT
            "Too many RPCs",  # ESLURMD_TOO_MANY_RPCS, the controller's rate limit
            "slurmdbd: Connection",
        ),
    ),
    (
        # The user's request is wrong, not the cluster.
        SlurmRefused,
        (
            "Invalid partition",  # ESLURM_INVALID_PARTITION_NAME
            "Invalid account",  # ESLURM_INVALID_ACCOUNT
            "Invalid qos",  # ESLURM_INVALID_QOS
            "Invalid feature specification",  # ESLURM_INVALID_FEATURE
            "Invalid generic resource",  # ESLURM_INVALID_GRES
            "Invalid node name specified",  # ESLURM_INVALID_NODE_NAME
            "Invalid job array specification",  # ESLURM_INVALID_ARRAY
            # ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE, ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE
            "Requested node configuration is not available",
            "Requested partition configuration not available",
            "Requested reservation is invalid",  # ESLURM_RESERVATION_INVALID
            "Requested time limit is invalid",  # ESLURM_INVALID_TIME_LIMIT
            "Node count specification invalid",  # ESLURM_INVALID_NODE_COUNT
            "Job violates accounting/QOS policy",  # ESLURM_ACCOUNTING_POLICY
            "Job dependency problem",  # ESLURM_DEPENDENCY
            "More processors requested than permitted",  # ESLURM_TOO_MANY_REQUESTED_CPUS
            "Memory specification can not be satisfied",  # ESLURM_INVALID_TASK_MEMORY
            "Access/permission denied",  # ESLURM_ACCESS_DENIED
        ),
    ),
)


# The job ids hpctf hands to Slurm commands: a job, or a task of a job array
# (hpctf.core.run.journal.job_handle).
_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")


def checked_job_ids(job_ids: Sequence[str]) -> list[str]:
    """``job_ids`` if each has one of Slurm's forms (``123``, ``123_4``), else a DamagedRecord
    (exit 3: the ids come from hpctf's own records, not the user's input).

    Every job id a Slurm command gets passes here first: the ids come from a run's journal,
    which is data anyone who can write the run directory controls. Unchecked, a journal entry
    ``{"event": "submitted", "job_id": "--user=root"}`` made ``hpctf cancel`` run ``scancel
    --user=root`` and cancel every job of the user. The commands that take it also get ``--``
    before their ids (scancel, ``scontrol show job``, ``scontrol requeue``: measured on Slurm
    22.05)."""
    ids = [str(job_id) for job_id in job_ids]
    for job_id in ids:
        if not _JOB_ID.fullmatch(job_id):
            raise DamagedRecord(
                f"{job_id[:60]!r} is not a Slurm job id (digits, or <job>_<task> for an array "
                "task): the run's journal is damaged or was edited; hpctf passes no such value "
                "to Slurm"
            )
    return ids


def failure(argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> SlurmFailure:
    """The error for a failed Slurm command, typed by its cause (:data:`_CAUSES`)."""
    said = f"{stdout}\n{stderr}".lower()
    for kind, texts in _CAUSES:
        if any(text.lower() in said for text in texts):
            return kind(argv, returncode, stdout, stderr)
    return SlurmError(argv, returncode, stdout, stderr)


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> str:
    """Run one Slurm command (an argv list, never a shell); return its stdout, or raise its
    :class:`SlurmFailure` by cause: SlurmRefused (the request was wrong, exit 2), else a
    SlurmError (exit 3): SlurmMissing, SlurmTransient, SlurmGone, SlurmNotPending,
    SlurmAlreadyPending, SlurmNoAccounting."""
    if shutil.which(argv[0], path=(env or {}).get("PATH")) is None:
        raise SlurmMissing(argv[0])
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmTransient(argv, -1, "", f"timed out after {timeout:.0f} s") from exc
    except OSError as exc:  # found on PATH a moment ago, but not executable or gone
        raise SlurmError(argv, -1, "", str(exc)) from exc
    if proc.returncode != 0:
        raise failure(argv, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def without_sbatch_overrides(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``env`` without the ``SBATCH_*`` variables, and their names.

    sbatch reads ``SBATCH_*`` input variables over the script's ``#SBATCH`` lines
    (sbatch(1), INPUT ENVIRONMENT VARIABLES): a stray ``SBATCH_NO_REQUEUE=1`` or
    ``SBATCH_TIMELIMIT`` in a user's shell would silently change the job hpctf rendered. A run's
    options come from its experiment and site only.
    """
    dropped = sorted(name for name in env if name.startswith("SBATCH_"))
    return {k: v for k, v in env.items() if k not in dropped}, dropped


def sbatch(
    script: Path, env: Mapping[str, str], extra: Sequence[str] = ()
) -> tuple[str, list[str]]:
    """Submit ``script`` with ``extra`` sbatch options (e.g. ``--exclude=node7``); return the job
    id (``sbatch --parsable`` prints ``id[;cluster]``) and the ``SBATCH_*`` variables of
    ``env`` that were left out (:func:`without_sbatch_overrides`)."""
    clean, dropped = without_sbatch_overrides(env)
    out = run_command(["sbatch", "--parsable", *extra, str(script)], clean)
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(["sbatch"], 0, out, "sbatch --parsable printed no job id")
    return job_id, dropped


def job_info(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``scontrol show job -o`` as a dict, or None once Slurm has forgotten the job."""
    (checked,) = checked_job_ids([job_id])
    try:
        out = run_command(
            ["scontrol", "show", "job", "-o", "--", checked],
            env,
        )
    except SlurmGone:
        return None
    info: dict[str, str] = {}
    for field in out.split():
        key, sep, value = field.partition("=")
        if sep:
            info.setdefault(key, value)
    return info


def wait_for_job(
    job_id: str,
    timeout: float,
    poll: float = 1.0,
    env: Mapping[str, str] | None = None,
) -> dict[str, str] | None:
    """Poll :func:`job_info` until job ``job_id`` is in a final state; return that info.

    Returns ``{}`` when Slurm has already forgotten the job (it ended longer than MinJobAge
    ago), and None when ``timeout`` seconds pass first (the job is left as it is). Polling
    ``scontrol`` rather than ``sbatch --wait``, which checks every 30 s or so.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job_id, env=env)
        if info is None:
            return {}
        if info.get("JobState") in FINAL_STATES:
            return info
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def seconds_left(info: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds until the time limit of a running job (:func:`job_info`'s EndTime, in the
    local time scontrol writes), or None when it has none or it cannot be read."""
    try:
        end = datetime.fromisoformat(info.get("EndTime", ""))
    except ValueError:
        return None
    return (end - (now or datetime.now())).total_seconds()


def requeue(job_id: str, env: Mapping[str, str] | None = None) -> None:
    """Put a running job back into the queue (it starts again with SLURM_RESTART_COUNT + 1)."""
    run_command(["scontrol", "requeue", "--", *checked_job_ids([job_id])], env=env)


# Seconds from a requeue to the start time hpctf gives the requeued job (release_requeued):
# its batch shell must be gone by then. Measured on the test cluster at load average 8-13:
# Slurm completed the requeue 0.1-0.7 s after job-end's release; scontrol reads "now" on the
# client, in whole seconds, so 3 left as little as 1.3 s.
RELEASE_AFTER_S = 5


def release_requeued(
    job_id: str, after_s: int = RELEASE_AFTER_S, env: Mapping[str, str] | None = None
) -> None:
    """Let requeued job ``job_id`` start ``after_s`` seconds from now, not ~2 minutes.

    Slurm holds a requeued batch job: when its requeue completes (all its processes gone) it
    sets the job's begin time to now + the credential lifetime + 1 s (AuthInfo=cred_expire,
    120 s by default; slurm.conf(5): "This also controls how long a requeued job must wait
    before starting again"; SchedulerParameters=requeue_delay from Slurm 26.05), but only when
    the begin time is not already in the future (batch_requeue_fini in
    src/slurmctld/job_mgr.c, the same from 17.11 to 25.05). The owner may set the begin time of
    a pending job, and a requeued job is PENDING (and COMPLETING) as soon as the requeue is
    accepted (scontrol(1), ``update StartTime``). So this is called right after the requeue, by
    the job itself, with ``after_s`` past the moment its last process will be gone. Not
    ``now``: slurmd refuses a new start in the second of the requeue ("Job credential
    revoked"), and a begin time already past when the requeue completes is replaced by the
    hold. Once eligible, the job starts at Slurm's next scheduling pass (any job's submission
    or end; on an idle cluster the backfill pass, every bf_interval, 30 s by default)."""
    run_command(
        ["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{after_s}"],
        env=env,
        timeout=5.0,
    )


def kill_wait(env: Mapping[str, str] | None = None) -> int:
    """The cluster's KillWait (slurm.conf(5)): seconds from the SIGTERM Slurm sends a job's
    processes to its SIGKILL (30 by default)."""
    out = run_command(["scontrol", "show", "config"], env=env, timeout=5.0)
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "KillWait":
            words = value.split()
            if words and words[0].isdigit():
                return int(words[0])
    return 30


# Node states (sinfo %T, lower case) in which a node is no place to run on: it failed or an
# administrator took it out. A trailing "*" means not responding (sinfo(1), NODE STATE CODES).
_UNUSABLE_STATES = ("down", "drain", "fail", "maint", "reboot", "power_down", "powered_down")


def unusable_nodes(
    nodes: str, env: Mapping[str, str] | None = None, timeout: float = 5.0
) -> list[str]:
    """The nodes of Slurm node list ``nodes`` that Slurm says are down, drained or draining,
    failing or not responding, in Slurm's order (one ``sinfo`` call). ``timeout`` is short: the
    batch shell's trap asks this while KillWait runs out."""
    out = run_command(
        ["sinfo", "--noheader", "--Node", f"--nodes={nodes}", "--format=%N|%T"],
        env=env,
        timeout=timeout,
    )
    bad: dict[str, None] = {}
    for line in out.splitlines():
        name, _, state = line.strip().partition("|")
        if name and (state.endswith("*") or any(word in state for word in _UNUSABLE_STATES)):
            bad[name] = None  # sinfo --Node lists a node once per partition
    return list(bad)


def exclude_nodes(job_id: str, nodes: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Keep pending job ``job_id`` off ``nodes`` from its next start on (its ExcNodeList).

    Slurm 22.05 changes ExcNodeList of a pending job only ("Job is no longer pending
    execution" otherwise); a job Slurm requeued itself is pending by the time its batch shell's
    SIGTERM trap runs (measured on the test cluster), and a requeue keeps the job's spec, so
    this is the one way a requeued job leaves a node out.
    """
    (checked,) = checked_job_ids([job_id])
    run_command(
        ["scontrol", "update", f"JobId={checked}", f"ExcNodeList={','.join(nodes)}"],
        env=env,
        timeout=5.0,
    )


def cancel(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    if job_ids:
        run_command(["scancel", "--", *checked_job_ids(job_ids)], env)


def test_only(script: str, env: Mapping[str, str] | None = None) -> None:
    """Ask ``sbatch --test-only`` whether Slurm would accept ``script``; submits nothing.

    The script goes through a temporary file (removed at once) because run_command takes no
    stdin. Raises SlurmRefused (or SlurmError) with Slurm's reason when it would refuse the job.
    """
    import tempfile

    with tempfile.NamedTemporaryFile("w", prefix="hpctf-test-only-", suffix=".sbatch") as handle:
        handle.write(script)
        handle.flush()
        clean, _ = without_sbatch_overrides(os.environ if env is None else env)
        run_command(["sbatch", "--test-only", handle.name], env=clean)
