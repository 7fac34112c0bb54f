"""Whose fault it was, and how a process says so with its exit status.

Three causes, each caught in one place (the CLI edge, :mod:`hpctf.cli`):

- :class:`UserError`: the user's input is wrong (files, flags, run directories, what was asked
  of Slurm). One line per problem saying what was wrong and what is allowed; exit 2.
- :class:`EnvironmentProblem`: the machine or the cluster failed (Slurm down or slow, a full
  or read-only filesystem). One line, the cause kept (``raise ... from``); exit 3.
- anything else is a bug in hpctf: the traceback, and a line asking to report it; exit 70.

The worker's own statuses (preempted after a checkpoint, stopped by its watchdog) are here too:
the batch script and the local launcher read them.
"""

from __future__ import annotations

USER_ERROR_EXIT = 2
ENVIRONMENT_EXIT = 3
BUG_EXIT = 70  # sysexits.h EX_SOFTWARE
# sysexits.h EX_TEMPFAIL, "try again later": ranks saved an agreed checkpoint; requeue.
PREEMPTED_EXIT = 75
# timeout(1)'s "timed out": a rank's watchdog saw no progress (a stuck peer or collective).
STALLED_EXIT = 124
# sysexits.h EX_UNAVAILABLE: a rank's node failed a check of train.preflight: quick (the rank
# log and the journal's node_check_failed record say which node and check).
NODE_CHECK_EXIT = 69
# ``hpctf job-start``: this job has nothing to do (another job owns the run, or the run is
# complete). The batch script then ends the job with 0: it is no failure, of the job or the run.
NOT_STARTING_EXIT = 99


class UserError(Exception):
    """A mistake the user can fix. The message says what was wrong and what is allowed."""

    exit_code = USER_ERROR_EXIT


class EnvironmentProblem(Exception):
    """The environment failed, not the user: Slurm unreachable or timing out, a disk full.

    The message says what hpctf was doing and what failed; the underlying exception stays
    attached as ``__cause__``.
    """

    exit_code = ENVIRONMENT_EXIT
