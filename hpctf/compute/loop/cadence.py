"""What a finished step calls for: a progress line, a checkpoint, the ranks' agreement on a
preemption warning. Pure (:meth:`Cadence.due`), so the rules are table-tested, and shared by
:class:`hpctf.compute.loop.session.Session` and ``model.fit``'s callback
(:class:`hpctf.compute.users_code.fit.FitCallback`); imports no TensorFlow."""

from __future__ import annotations

import dataclasses
import time

from hpctf.compute.loop.preemption import check_interval


@dataclasses.dataclass(frozen=True)
class Due:
    """What step ``step`` calls for."""

    log: bool
    save: bool
    agree: bool
    restart: bool = False  # end the job after this step's save, for a requeue


@dataclasses.dataclass(frozen=True)
class Cadence:
    """``train.log_every_steps``, ``checkpoint.every_steps``, the run's last step (None
    while unknown: then no step is taken for the last) and ``train.restart_every_steps``."""

    log_every: int
    save_every: int
    total: int | None
    restart_every: int | None = None

    def due(self, step: int, next_agreement: int) -> Due:
        """The last step is logged, saved and agreed on whatever the intervals say; the
        agreement also comes at ``next_agreement`` (:class:`AgreementClock`) and after. A
        multiple of ``restart_every`` before the last step is saved and restarts the job."""
        last = step == self.total
        restart = bool(self.restart_every) and step % (self.restart_every or 1) == 0 and not last
        return Due(
            log=last or step % self.log_every == 0,
            save=last or restart or step % self.save_every == 0,
            agree=last or step >= next_agreement,
            restart=restart,
        )


class AgreementClock:
    """When the ranks next agree on a warning, and the step time each brings to it.

    Every rank computes the same next step from the agreed (slowest) step time, so every rank
    calls the collective at the same step.
    """

    def __init__(self, check_every: int, warning_seconds: int | None) -> None:
        self._check_every = check_every
        self.warning_seconds = warning_seconds
        self.restart(0)

    def restart(self, step: int) -> None:
        """From ``step`` (the restored one) on, the first agreement after the configured
        interval."""
        self._last = (time.perf_counter(), step)
        self.next = step + self._check_every

    def step_seconds(self, step: int) -> float:
        """This rank's seconds per step since the last agreement."""
        then, then_step = self._last
        return (time.perf_counter() - then) / max(step - then_step, 1)

    def agreed(self, step: int, slowest_step: float) -> None:
        """The ranks agreed at ``step`` on ``slowest_step`` seconds per step."""
        self._last = (time.perf_counter(), step)
        self.next = step + check_interval(self._check_every, slowest_step, self.warning_seconds)
