"""Preemption warnings: the signals, the handler before TensorFlow starts, and the agreement of
every rank on one step to save at (:class:`PreemptionWatch`).

Slurm warns a job before preempting it or ending it at its time limit (``--signal=USR2@300``
sends SIGUSR2 to every task 300 s before; a preemption sends SIGTERM). A warned worker saves an
agreed step with all the others and exits
:data:`hpctf.core.errors.PREEMPTED_EXIT`; the batch script then
requeues the job and the next start resumes from that checkpoint. Not SIGUSR1: NCCL uses it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from hpctf.core.errors import PREEMPTED_EXIT

log = logging.getLogger("hpctf.worker")

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


def make_gather(strategy: Any) -> Callable[[int], list[int]]:
    """A collective over ``strategy`` that returns every replica's integer, on every rank, as a
    list (what :class:`PreemptionWatch` and the checkpoint agreement run on)."""
    import tensorflow as tf  # only the worker gets here; this module is imported before TF

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
    def gather(value: Any) -> Any:
        per_replica = strategy.run(lambda: tf.reshape(value, [1]))
        return strategy.gather(per_replica, axis=0)

    return lambda value: [int(v) for v in gather(tf.constant(value, tf.int64)).numpy()]


class Preempted(SystemExit):
    """Raised by :meth:`Session.step_done` after the agreed preemption checkpoint."""

    def __init__(self) -> None:
        super().__init__(PREEMPTED_EXIT)


class PreemptionWatch:
    """Turns a preemption warning to any rank into the same decision on every rank.

    Install it after the strategy exists: TF's own C++ handler takes SIGTERM once the strategy
    is created, so a Python handler installed before never runs. The handlers are installed
    before the early handler's record is read, so a signal between the two is not lost.
    """

    def __init__(self, gather: Callable[[int], list[int]]) -> None:
        self._signalled = 0
        for signum in PREEMPTION_SIGNALS:
            signal.signal(signum, self._on_signal)
        early = early_signal()
        if early and not self._signalled:
            self._signalled = early
            log.warning(
                "got %s while starting: saving at the first agreed step",
                signal.Signals(early).name,
            )
        self._gather = gather

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._signalled:
            log.warning("got %s: saving at the next agreed step", signal.Signals(signum).name)
        self._signalled = signum

    def agree(self, step_seconds: float) -> tuple[int, float]:
        """A collective: every rank calls it at the same step. Returns the signal any rank got
        (SIGTERM, a preemption, wins over the walltime warning; 0 for none) and the slowest
        rank's seconds per step, the same on every rank."""
        micros = min(max(round(step_seconds * 1e6), 0), _MICROS_MASK)
        values = self._gather(self._signalled << _SIGNAL_SHIFT | micros)
        signum = max(value >> _SIGNAL_SHIFT for value in values)
        slowest = max(value & _MICROS_MASK for value in values) / 1e6
        return signum, slowest


# One int64 per rank carries both answers of PreemptionWatch.agree: the signal number above bit
# 40, the step time in microseconds (up to 12 days) below.
_SIGNAL_SHIFT = 40
_MICROS_MASK = (1 << _SIGNAL_SHIFT) - 1


def check_interval(configured: int, slowest_step: float, warning_seconds: int | None) -> int:
    """Steps until the ranks next agree on a warning: ``train.preemption_check_every_steps``,
    fewer when steps are slow, so that a warning waits at most a quarter of the site's
    ``preemption.warning_seconds`` for the agreement (the rest is for the save and the exit).
    Pure, and fed the same values on every rank, so every rank picks the same step."""
    if not warning_seconds or slowest_step <= 0:
        return configured
    return max(1, min(configured, int(warning_seconds / 4 / slowest_step)))
