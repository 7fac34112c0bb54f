"""Preemption warnings: the signals, the handler before TensorFlow starts, and the agreement of
every rank on one step to save at (:class:`PreemptionWatch`).

Slurm warns a job before preempting it or ending it at its time limit (``--signal=USR2@300``
sends SIGUSR2 to every task 300 s before; a preemption sends SIGTERM). A warned worker saves an
agreed step with all the others and exits
:data:`hpctf.core.errors.PREEMPTED_EXIT`; the batch script then
requeues the job and the next start resumes from that checkpoint. Not SIGUSR1: NCCL uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from hpctf.compute.loop.agreement import WATCHED_SIGNALS, Agreement
from hpctf.compute.process import peer_watch
from hpctf.compute.process.launcher_watch import LAUNCHER_PID_ENV
from hpctf.core.errors import PREEMPTED_EXIT
from hpctf.core.run.history import RunHistory, read_history
from hpctf.core.run.rundir import RunDir

if TYPE_CHECKING:  # imports TensorFlow; this module is imported before it
    from hpctf.compute.loop.step_flags import StepFlags

log = logging.getLogger("hpctf.worker")


Handler = Callable[[int, Any], Any] | int | None  # what signal.signal takes and returns


class SignalRecorder:
    """A handler that remembers the last preemption signal, for a warning that arrives while
    the worker starts, before the training's own handlers exist (SIGUSR2's default action
    would kill the process). The record lives in the installed handler itself, so whoever
    installs handlers later reads it from the one it replaced (:func:`early_signal`)."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.received = signum


@contextlib.contextmanager
def handling(
    handler: Handler, signals: tuple[int, ...] = WATCHED_SIGNALS
) -> Iterator[dict[int, Handler]]:
    """Install ``handler`` for ``signals`` (main thread only); yield the handlers it replaced;
    put them back on leaving, whatever ends the block."""
    originals = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield originals
    finally:
        for signum, original in originals.items():
            # None: a handler not installed from Python; the default is the closest we can do.
            signal.signal(signum, signal.SIG_DFL if original is None else original)


def install_early_handlers() -> SignalRecorder:
    """Catch a warning that arrives while the worker starts; returns the recorder.

    Installed for the rest of the worker's life, not restored: the worker ends with
    ``os._exit`` (:mod:`hpctf.compute.process.leaving`), and a local launcher repeats its warning
    until the workers have exited, so a default SIGTERM action while leaving would turn an exit 75
    into a death by signal. :class:`PreemptionWatch` replaces it during training and puts it back.
    """
    recorder = SignalRecorder()
    for signum in WATCHED_SIGNALS:
        signal.signal(signum, recorder)
    return recorder


def early_signal(handlers: Iterable[Handler] | None = None) -> int:
    """The warning a :class:`SignalRecorder` among ``handlers`` (default: the installed ones)
    received, or 0."""
    if handlers is None:
        handlers = [signal.getsignal(signum) for signum in WATCHED_SIGNALS]
    return max((h.received for h in handlers if isinstance(h, SignalRecorder)), default=0)


def make_gather(strategy: Any) -> Callable[[int], list[int]]:
    """A collective over ``strategy`` that returns every replica's integer, on every rank, as a
    list (what :class:`PreemptionWatch` and the checkpoint agreement run on)."""
    import tensorflow as tf  # only the worker gets here; this module is imported before TF

    from hpctf.compute.compat.tensorflow_internals import fixed_instance_keys

    # A fixed signature: traced once, so its keys can be fixed (RSS flat: fixed_instance_keys).
    # No control flow to convert: autograph would only cost the restore its time.
    @tf.function(input_signature=[tf.TensorSpec([], tf.int64)], autograph=False)
    def gather(value: Any) -> Any:
        with fixed_instance_keys():
            per_replica = strategy.run(lambda: tf.reshape(value, [1]))
            return strategy.gather(per_replica, axis=0)

    return lambda value: [int(v) for v in gather(tf.constant(value, tf.int64)).numpy()]


class Preempted(SystemExit):
    """Raised by :meth:`Session.step_done` after the agreed preemption checkpoint."""

    def __init__(self) -> None:
        super().__init__(PREEMPTED_EXIT)


class PreemptionWatch:
    """Turns a preemption warning to any rank into the same decision on every rank.

    A context manager: entering installs its signal handlers, leaving puts back the ones it
    replaced. Enter it after the strategy exists: TF's own C++ handler takes SIGTERM once the
    strategy is created, so a Python handler installed before never runs. The handlers are
    installed before the early handler's record is read, so a signal between the two is not
    lost.
    """

    def __init__(self, gather: Callable[[int], list[int]]) -> None:
        self._signalled = 0
        self._gather = gather
        self._handling = handling(self._on_signal)
        self._carried: tuple[StepFlags, int] | None = None

    def carry(self, flags: StepFlags, replicas: int) -> None:
        """From now on every step carries the warnings (:mod:`hpctf.compute.loop.step_flags`):
        :meth:`agree` reads them instead of gathering. Every rank calls it, or none."""
        self._carried = (flags, replicas)
        if self._signalled:
            flags.raise_flag(self._signalled)

    def __enter__(self) -> PreemptionWatch:
        originals = self._handling.__enter__()
        peer_watch.arm()  # a SIGTERM because a peer died: leave at once
        early = early_signal(originals.values())
        if early and not self._signalled:
            self._signalled = early
            log.warning(
                "got %s while starting: saving at the first agreed step",
                signal.Signals(early).name,
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        peer_watch.disarm()
        self._handling.__exit__(None, None, None)

    @property
    def signalled(self) -> int:
        """The signal this rank got (the last one), or 0."""
        return self._signalled

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._signalled:
            log.warning("got %s: saving at the next agreed step", signal.Signals(signum).name)
        self._signalled = signum
        if self._carried is not None:
            self._carried[0].raise_flag(signum)

    def agree(self, step_seconds: float, save_vote: bool = False) -> Agreement:
        """A collective: every rank calls it at the same step. Returns the signal any rank got
        (SIGTERM, a preemption, wins over the walltime warning; 0 for none), the slowest
        rank's seconds per step, and whether any rank voted for a save by time
        (``save_vote``: this rank's), the same on every rank (with :meth:`carry`: the mean
        step time and the votes as of the last step, without a collective)."""
        if self._carried is not None:
            flags, replicas = self._carried
            return flags.agree(step_seconds, replicas, save_vote)
        micros = min(max(round(step_seconds * 1e6), 0), _MICROS_MASK)
        vote = _SAVE_BIT if save_vote else 0
        values = self._gather(vote | self._signalled << _SIGNAL_SHIFT | micros)
        signum = max((value & ~_SAVE_BIT) >> _SIGNAL_SHIFT for value in values)
        slowest = max(value & _MICROS_MASK for value in values) / 1e6
        return Agreement(signum, slowest, any(value & _SAVE_BIT for value in values))


# One int64 per rank carries the answers of PreemptionWatch.agree: the vote for a save at bit
# 56, the signal number above bit 40 (below 64), the step time in microseconds (up to 12 days)
# below.
_SAVE_BIT = 1 << 56
_SIGNAL_SHIFT = 40
_MICROS_MASK = (1 << _SIGNAL_SHIFT) - 1


def check_interval(
    configured: int,
    slowest_step: float,
    warning_seconds: int | None,
    save_seconds: int | None = None,
) -> int:
    """Steps until the ranks next agree on a warning: ``train.preemption_check_every_steps``,
    fewer when steps are slow, so that a warning waits at most a quarter of the site's
    ``preemption.warning_seconds`` for the agreement (the rest is for the save and the exit):
    an eighth per interval, as a warning can wait for two of them (the built-in loop carries
    it in the steps after the call it arrived in: :mod:`hpctf.compute.loop.step_flags`); and
    at most a tenth of ``checkpoint.every_seconds`` (``save_seconds``), where saves by time
    are decided (:class:`hpctf.compute.loop.cadence.AgreementClock`).
    Pure, and fed the same values on every rank, so every rank picks the same step."""
    if slowest_step <= 0:
        return configured
    bounds = [configured]
    if warning_seconds:
        bounds.append(int(warning_seconds / 8 / slowest_step))
    if save_seconds:
        bounds.append(int(save_seconds / 10 / slowest_step))
    return max(1, min(bounds))


def leaving_words(
    run: RunDir, step: int | None, why: str = "preempted", history: RunHistory | None = None
) -> str:
    """What a rank logs as it leaves with exit 75 after saving ``step`` (None: a script's own
    save): a local run's stop (Ctrl-C, ``hpctf cancel``, a signal to its launcher) is no
    preemption and nothing requeues it (:meth:`hpctf.core.run.history.RunHistory.local_stop`;
    ``history``: the run's, when the caller has read it, else it is read here)."""
    saved = f"saved step {step}" if step is not None else "saved"
    if os.environ.get(LAUNCHER_PID_ENV):
        stop = (history or read_history(run)).local_stop()
        return f"{stop}: {saved}; exiting 75 (hpctf resubmit resumes it)"
    return f"{why}: {saved}; exiting 75 for a requeue"
