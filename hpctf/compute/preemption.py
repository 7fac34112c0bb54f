"""Preemption warnings: the signals, the exit status, and the handler before TensorFlow starts.

Slurm warns a job before preempting it or ending it at its time limit (``--signal=USR2@300``
sends SIGUSR2 to every task 300 s before; a preemption sends SIGTERM). A warned worker saves an
agreed step with all the others and exits
:data:`hpctf.core.errors.PREEMPTED_EXIT`; the batch script then
requeues the job and the next start resumes from that checkpoint. Not SIGUSR1: NCCL uses it.
"""

from __future__ import annotations

import signal

PREEMPTION_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)

_received = 0


def _remember(signum: int, frame: object) -> None:
    global _received
    _received = signum


def install_early_handlers() -> None:
    """Catch a warning that arrives while the worker starts, before the training session
    installs its own handlers (SIGUSR2's default action would kill the process)."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, _remember)


def early_signal() -> int:
    """The warning received before the session took over, or 0."""
    return _received
