"""What every rank agreed on at a check of the preemption agreement (pure data).

A module of its own, below both ways to reach it: the agreement is reached either in the
preemption watch's own collective (:mod:`hpctf.compute.loop.preemption`) or carried in the
step's reduction (:mod:`hpctf.compute.loop.step_flags`), and both give this answer and watch
the same signals (:data:`WATCHED_SIGNALS`).
"""

from __future__ import annotations

import signal
from typing import NamedTuple

# The signals every rank watches for: Slurm's warning (``--signal=USR2@T``; not USR1, NCCL's),
# and SIGTERM (a preemption, the time limit, scancel). Their order is the step flags' order.
WATCHED_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


class Agreement(NamedTuple):
    """What every rank agreed on at a check: the signal any rank got (0: none), the slowest
    (or, carried in the steps, the mean) seconds per step, and whether to save this step
    (``checkpoint.every_seconds``)."""

    signal: int
    slowest: float
    save: bool = False
