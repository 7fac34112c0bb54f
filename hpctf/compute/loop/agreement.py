"""What every rank agreed on at a check of the preemption agreement (pure data).

A module of its own: the agreement is reached either in the preemption watch's own collective
(:mod:`hpctf.compute.loop.preemption`) or carried in the step's reduction
(:mod:`hpctf.compute.loop.step_flags`), and both give this answer.
"""

from __future__ import annotations

from typing import NamedTuple


class Agreement(NamedTuple):
    """What every rank agreed on at a check: the signal any rank got (0: none), the slowest
    (or, carried in the steps, the mean) seconds per step, and whether to save this step
    (``checkpoint.every_seconds``)."""

    signal: int
    slowest: float
    save: bool = False
