"""What a finished step calls for: a progress line, a checkpoint, the ranks' agreement on a
preemption warning. Pure (:meth:`Cadence.due`), so the rules are table-tested, and shared by
:class:`hpctf.compute.loop.session.Session` and ``model.fit``'s callback
(:class:`hpctf.compute.script.fit.FitCallback`); imports no TensorFlow."""

from __future__ import annotations

import dataclasses
import time

from hpctf.compute.loop.preemption import check_interval
from hpctf.core.errors import UserError
from hpctf.core.settings.train import Train


@dataclasses.dataclass(frozen=True)
class Due:
    """What step ``step`` calls for."""

    log: bool
    save: bool
    agree: bool
    restart: bool = False  # end the job after this step's save, for a requeue


@dataclasses.dataclass(frozen=True)
class Cadence:
    """``train.log_every_steps``, ``checkpoint.every_steps`` (None: saves by time only,
    :class:`AgreementClock`), the run's last step (None while unknown: then no step is taken
    for the last) and ``train.restart_every_steps``."""

    log_every: int
    save_every: int | None
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
            save=last or restart or bool(self.save_every and step % self.save_every == 0),
            agree=last or step >= next_agreement,
            restart=restart,
        )

    def next_due(self, step: int, next_agreement: int) -> int:
        """The first step after ``step`` that :meth:`due` gives anything to do: a loop may run
        the steps up to it in one call, and every log, save and agreement is still on its
        exact step."""
        after = [(step // self.log_every + 1) * self.log_every, max(next_agreement, step + 1)]
        if self.save_every:
            after.append((step // self.save_every + 1) * self.save_every)
        if self.restart_every:
            after.append((step // self.restart_every + 1) * self.restart_every)
        if self.total is not None and self.total > step:
            after.append(self.total)
        return min(after)


class AgreementClock:
    """When the ranks next agree on a warning and on a save by time, and what each rank brings
    to it: its step time and its vote for a save (``checkpoint.every_seconds``).

    Every rank computes the same next step from the agreed (slowest) step time, so every rank
    calls the collective at the same step. A save by time is decided there too, from every
    rank's vote, so every rank saves the same step: a rank votes once :data:`SAVE_VOTE_AT` of
    ``save_seconds`` have passed since its last save (or its start), and the agreements come
    at most a tenth of ``save_seconds`` apart (:func:`check_interval`), so that a vote seen
    one agreement late (the built-in loop carries it in the steps after the agreement it was
    cast at: :mod:`hpctf.compute.loop.step_flags`) still saves within ``save_seconds`` of the
    save before, while the step time holds.
    """

    def __init__(
        self, check_every: int, warning_seconds: int | None, save_seconds: int | None = None
    ) -> None:
        self._check_every = check_every
        self.warning_seconds = warning_seconds
        self.save_seconds = save_seconds
        self.restart(0)

    def restart(self, step: int) -> None:
        """From ``step`` (the restored one) on, the first agreement after the configured
        interval; the time to the next save counted from now."""
        self._last = (time.perf_counter(), step)
        self._saved_at = self._last[0]
        self.next = step + self._check_every

    def saved(self) -> None:
        """This rank saved a checkpoint: the time to the next save is counted from now."""
        self._saved_at = time.perf_counter()

    def save_vote(self) -> bool:
        """This rank's vote, at an agreement, for a save by time."""
        if not self.save_seconds:
            return False
        return time.perf_counter() - self._saved_at >= SAVE_VOTE_AT * self.save_seconds

    def step_seconds(self, step: int) -> float:
        """This rank's seconds per step since the last agreement."""
        then, then_step = self._last
        return (time.perf_counter() - then) / max(step - then_step, 1)

    def agreed(self, step: int, slowest_step: float) -> None:
        """The ranks agreed at ``step`` on ``slowest_step`` seconds per step."""
        self._last = (time.perf_counter(), step)
        self.next = step + check_interval(
            self._check_every, slowest_step, self.warning_seconds, self.save_seconds
        )


# A rank votes for a save by time this far into checkpoint.every_seconds: the vote may reach
# the agreement one interval late, and an interval is at most a tenth of it.
SAVE_VOTE_AT = 0.8


def format_eta(seconds: float) -> str:
    """``seconds`` as ``1h02m03s``, or ``2m03s`` under an hour."""
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def steps_for_epochs(settings: Train, examples: int | None, global_batch: int) -> int:
    """``train.epochs`` times the full global batches in one pass over ``examples``."""
    if examples is None:
        raise UserError(
            "train.epochs needs a training set of known size (a finite dataset, or "
            "hpctf.Files(..., examples=N)); or give train.steps"
        )
    per_epoch = examples // global_batch
    if per_epoch == 0:
        raise UserError(
            f"train.global_batch_size {global_batch} exceeds the {examples} training examples"
        )
    return per_epoch * (settings.epochs or 1)


def save_outlasts_warning(save: float | None, slowest_step: float, warning: int | None) -> str:
    """What to say when the site's warning (``warning`` seconds) cannot be acted on in time:
    it is shorter than about three saves (``save`` seconds, the last one measured) and a
    step; "" when it is long enough or nothing is measured yet."""
    if not warning or save is None or 3 * save + slowest_step <= warning:
        return ""
    return (
        f"a checkpoint takes {save:.1f} s and a step {slowest_step:.2f} s: the site's "
        f"preemption.warning_seconds ({warning}) is shorter than three saves and a step; "
        "ask for a longer warning"
    )
