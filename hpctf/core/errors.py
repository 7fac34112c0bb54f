"""Whose fault it was, and how a process says so with its exit status.

Four causes, each caught in one place (the CLI edge, :mod:`hpctf.cli`; the worker for user code):

- :class:`UserError`: the user's input is wrong (files, flags, run directories, what was asked
  of Slurm). One line per problem saying what was wrong and what is allowed; exit 2.
- :class:`EnvironmentProblem`: the machine or the cluster failed (Slurm down, slow or missing
  and each of its failures typed, :mod:`hpctf.core.scheduler.slurm`; a full or read-only
  filesystem; a damaged journal, :class:`DamagedRecord`; a run directory another submit took;
  a rank that could not join the cluster or another rank that stopped answering:
  :class:`hpctf.compute.cluster.peers.PeerLost`). One line, the cause kept (``raise ...
  from``); exit 3.
- user code: an exception raised in the user's own code (entry, data functions, loss,
  metrics, callbacks, script) is theirs: the traceback and one line naming file:line
  (:mod:`hpctf.compute.users_code.attribution`); exit :data:`USER_CODE_EXIT`.
- anything else is a bug in hpctf: the traceback, and a line asking to report it; exit 70.

The worker's own statuses (preempted after a checkpoint, stopped by its watchdog) are here too:
the batch script and the local launcher read them.
"""

from __future__ import annotations

import signal

USER_ERROR_EXIT = 2
ENVIRONMENT_EXIT = 3
BUG_EXIT = 70  # sysexits.h EX_SOFTWARE
# sysexits.h EX_TEMPFAIL, "try again later": ranks saved an agreed checkpoint; requeue.
PREEMPTED_EXIT = 75
# timeout(1)'s "timed out": a rank's watchdog saw no progress (a stuck peer or collective).
STALLED_EXIT = 124
# job-start or job-end: the run gave up (its budgets, a full disk, the user's code); the batch
# script exits with it before srun, or after job-end, so Slurm ends the job FAILED.
GAVE_UP_EXIT = 1
# sysexits.h EX_UNAVAILABLE: a rank's node failed a check of train.preflight: quick (the rank
# log and the journal's node_check_failed record say which node and check).
NODE_CHECK_EXIT = 69
# sysexits.h EX_DATAERR, "the input was wrong": here the input is the user's code (it raised).
# Below 128, so it never reads as a signal (srun and bash show a signal N as 128+N: 143, 137),
# and apart from Python's own 1 and 2 and hpctf's 2, 3, 69, 70, 75 and 124. It reaches the
# batch script only when the raising rank is the last to end: srun reports a signal over any
# exit code (src/srun/launch.c, _task_finish), and --kill-on-bad-exit signals the other ranks,
# so job-end reads the journal's user_code_failed record instead, as for NODE_CHECK_EXIT.
USER_CODE_EXIT = 65
# ``hpctf job-start``: this job has nothing to do (another job owns the run, or the run is
# complete). The batch script then ends the job with 0: it is no failure, of the job or the run.
NOT_STARTING_EXIT = 99
# ``hpctf job-end``: the crashed start's workers start again at once in this same allocation
# (recorded as requeued and started): the batch script runs srun again, not Slurm's requeue.
RELAUNCH_EXIT = 98


class UserError(Exception):
    """A mistake the user can fix. The message says what was wrong and what is allowed."""

    exit_code = USER_ERROR_EXIT


class EnvironmentProblem(Exception):
    """The environment failed, not the user: Slurm unreachable or timing out, a disk full.

    The message says what hpctf was doing and what failed; the underlying exception stays
    attached as ``__cause__``. ``cause_said``: the message already gives the cause in its own
    words (a filesystem's "No space left on device"), so the CLI does not repeat it.
    """

    exit_code = ENVIRONMENT_EXIT

    def __init__(self, *args: object, cause_said: bool = False) -> None:
        super().__init__(*args)
        self.cause_said = cause_said


class SlurmEnvironmentProblem(EnvironmentProblem):
    """Slurm's variables for this task are malformed or disagree with each other (a nodelist
    that does not expand, task counts that do not add up, a rank outside the step): Slurm's or
    the launcher's doing, not the user's, so exit 3 with the variables named. Running a
    compute-node command outside a job step at all stays the user's (a :class:`UserError`)."""


class DamagedRecord(EnvironmentProblem):
    """A file hpctf wrote and reads back (a run's journal entry, a job id in it) is damaged
    or was edited: no input of the user's, so exit 3, the file named."""


# The longest one-line reason hpctf writes (status, the launcher, a rank log's error line): an
# exception's text can be a whole tensor (8,007 characters seen); the full text stays in the
# rank log's traceback.
ONE_LINE_MAX = 300


def one_line(text: str, limit: int = ONE_LINE_MAX, rest: str = "the rank log has it all") -> str:
    """``text`` on one line (whitespace runs made one space), at most about ``limit``
    characters: a longer one is cut and says how much was left out and where it is."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit].rstrip()}... ({len(flat) - limit} more characters; {rest})"


def shell_status(returncode: int) -> int:
    """A child's status as a shell shows it: Python's ``-N`` for "killed by signal N" becomes
    128+N (as srun and bash say it; ``exit(-9)`` would be 247)."""
    return 128 - returncode if returncode < 0 else returncode


def exit_text(code: object) -> str:
    """``exit 1``, or for a death by signal (128+N, or Python's -N) ``exit 137, SIGKILL``."""
    if not isinstance(code, int) or isinstance(code, bool):
        return f"exit {'?' if code is None else code}"
    code = shell_status(code)
    if 128 < code < 128 + 65:
        try:
            return f"exit {code}, {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit {code}"


def environment_line(exc: EnvironmentProblem) -> str:
    """An environment fault in one line, its cause kept: the exception it was raised from
    (``raise ... from``) is named unless the message already carries its words or says it
    in its own (``cause_said``)."""
    said = " ".join(str(exc).split())
    cause = exc.__cause__
    if cause is not None and not getattr(exc, "cause_said", False):
        because = " ".join(str(cause).split())
        if because and because not in said:
            said = f"{said} (cause: {type(cause).__name__}: {because})"
    return said
