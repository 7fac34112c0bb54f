"""What hpctf gives a ``model.fit`` script (``train.script``) through one Keras callback:
:func:`hpctf.keras.callbacks` returns :class:`FitCallback`.

The same pieces as hpctf's own loop (:class:`hpctf.compute.loop.session.Session`): checkpoints
(:class:`~hpctf.compute.records.checkpoints.Checkpointer`: every worker takes part, only the
chief's copy lands, restored at the step all ranks agree on), the preemption agreement
(:class:`~hpctf.compute.loop.preemption.PreemptionWatch`: a warning to any rank is saved by every
rank
at one agreed step, then exit 75), the chief's records (metrics.jsonl, TensorBoard) and the stall
watchdog, fed by every batch.

Resuming at the exact step relies on tf_keras (``train.keras: 2``): after ``on_train_begin``
its ``fit`` asks ``model._training_state.maybe_load_initial_counters_from_ckpt`` for the epoch
and the step inside it to continue at, the hook its own ``BackupAndRestore`` uses
(tf_keras/src/engine/training.py). As with ``BackupAndRestore`` the dataset starts again from
its beginning: the step count is exact, the order of the examples is not that of an
uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from typing import Any

import tensorflow as tf

from hpctf.compute.doctor.procstat import process_usage
from hpctf.compute.loop.cadence import AgreementClock, Cadence
from hpctf.compute.loop.preemption import Preempted, PreemptionWatch, make_gather
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.records.checkpoints import Checkpointer
from hpctf.compute.records.chief_records import ChiefRecords
from hpctf.compute.start.cluster import ClusterSpec
from hpctf.core.errors import PREEMPTED_EXIT, UserError
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import ResolvedConfig

log = logging.getLogger("hpctf.worker")


def resume_position(step: int, steps_per_epoch: int, initial_epoch: int) -> tuple[int, int]:
    """The (epoch, step inside it) at which ``fit`` continues after ``step`` optimizer steps
    counted from ``initial_epoch``."""
    if steps_per_epoch <= 0:
        return initial_epoch, 0
    epochs, inside = divmod(step, steps_per_epoch)
    return initial_epoch + epochs, inside


class _TrainingState:
    """What tf_keras's ``fit`` asks for the position to continue at (duck-typed like its
    ``WorkerTrainingState``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int, initial_epoch: int, mode: Any = None
    ) -> tuple[int, int]:
        return resume_position(self.step, int(steps_per_epoch or 0), initial_epoch)


class FitCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Checkpoints, preemption saves, progress and a fed watchdog for ``model.fit``."""

    def __init__(self, config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> None:
        super().__init__()
        # Keras's progress bar rewrites its line with \r and no newline, which runs into the
        # rank log's next lines; without interactive logging fit's verbose="auto" is one line
        # per epoch, through absl logging. hpctf's own progress lines say the rest.
        tf.keras.utils.disable_interactive_logging()
        self._settings = config.experiment.train
        self._checkpoint_settings = config.experiment.checkpoint
        self._warning_seconds = launcher_for(config.site).warning_seconds
        self._run = run
        self._spec = spec
        self._records = ChiefRecords(run, spec.is_chief, config)
        self._epoch = 0
        self._initial_epoch = 0
        self._step = 0
        self._total: int | None = None
        self._steps_per_epoch = 0
        self._watchdog: ProgressWatchdog | None = None
        self._preemption: PreemptionWatch | None = None
        self._checkpointer: Checkpointer | None = None
        self._step_variable: Any = None
        self._window = (time.perf_counter(), 0)
        self._clock = AgreementClock(
            self._settings.preemption_check_every_steps, self._warning_seconds
        )
        self._cadence = Cadence(
            self._settings.log_every_steps, self._checkpoint_settings.every_steps, None
        )

    # --- fit's hooks ---------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        self._steps_per_epoch = int(self.params.get("steps") or 0)
        if not self._steps_per_epoch:
            raise UserError(
                "hpctf.keras.callbacks() needs the steps of an epoch: give fit steps_per_epoch=N, "
                "or a dataset whose size TensorFlow knows"
            )
        model = self.model
        strategy = model.distribute_strategy
        gather = make_gather(strategy)
        # After the strategy exists: TF's C++ handler would swallow SIGTERM otherwise.
        self._preemption = PreemptionWatch(gather).__enter__()  # left in _stop()
        timeout = self._settings.stall_timeout_seconds
        where = f"rank {self._spec.task_index} on {self._spec.node}"
        self._watchdog = ProgressWatchdog(timeout, where=where).start() if timeout else None
        epochs = int(self.params.get("epochs") or 0)
        self._total = self._steps_per_epoch * epochs or None
        self._cadence = dataclasses.replace(self._cadence, total=self._total)
        self._step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        objects: dict[str, Any] = {"model": model}
        if model.optimizer is not None:
            with strategy.scope():  # slots now, so the restore fills them instead of deferring
                model.optimizer.build(model.trainable_variables)
            objects["optimizer"] = model.optimizer
        checkpoint = tf.train.Checkpoint(step=self._step_variable, **objects)
        self._checkpointer = Checkpointer(
            checkpoint, self._run.checkpoints, self._spec, self._checkpoint_settings.keep
        )
        restored = self._checkpointer.restore_agreed(gather)
        self._beat("restore")
        self._step = int(self._step_variable.numpy())
        if restored:
            log.info("resumed from %s at step %d", restored, self._step)
        else:
            log.info("no checkpoint in %s: starting at step 0", self._run.checkpoints)
        model._training_state = _TrainingState(self._step)
        self._window = (time.perf_counter(), self._step)
        self._clock.restart(self._step)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # The step as fit counts it (epochs from 0, batches inside each), so a resumed fit
        # and an uninterrupted one number their steps alike.
        step = self._epoch * self._steps_per_epoch + batch + 1
        self._step = step
        self._beat(f"step {step}")
        due = self._cadence.due(step, self._clock.next)
        if due.log:
            self._log_progress(step, logs or {})
        if due.save:
            self._save(step)
        if due.agree:
            self._check_preemption(step, due.save)

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self._beat("evaluation batch")  # fit's validation between epochs

    def on_train_end(self, logs: Any = None) -> None:
        self._stop()
        self.model._training_state = None
        log.info("fit ended at step %d", self._step)

    # --- the pieces --------------------------------------------------------------------------

    def _stop(self) -> None:
        """The watchdog stopped, the signal handlers fit found put back."""
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._preemption is not None:
            self._preemption.__exit__()
            self._preemption = None

    def _beat(self, what: str) -> None:
        if self._watchdog is not None:
            self._watchdog.beat(what)

    def _save(self, step: int) -> None:
        if self._checkpointer is None:
            raise RuntimeError("FitCallback saves only inside fit")
        self._step_variable.assign(step)
        self._beat(f"step {step}")
        started = time.perf_counter()
        path = self._checkpointer.save(step)
        if path is not None:
            log.info("checkpoint %s (%.2f s)", path, time.perf_counter() - started)
        self._beat(f"checkpoint of step {step}")

    def _check_preemption(self, step: int, saved: bool) -> None:
        if self._preemption is None:
            return
        signum, slowest = self._preemption.agree(self._clock.step_seconds(step))
        self._clock.agreed(step, slowest)
        if not signum:
            return
        name = signal.Signals(signum).name
        if step == self._total:
            log.warning("got %s at the last step: finishing instead of requeuing", name)
            return
        if not saved:
            self._save(step)
        if self._spec.is_chief:
            # The batch script requeues on this record (as after Session.step_done's save).
            journal.record_saved_on_warning(
                self._run, self._spec.journal_job, step, name.removeprefix("SIG")
            )
        self._preemption.agree(0.0)  # a barrier: no rank leaves before the chief's record
        log.warning("preempted: saved step %d; exiting %d for a requeue", step, PREEMPTED_EXIT)
        self._stop()
        raise Preempted()

    def _log_progress(self, step: int, logs: dict[str, Any]) -> None:
        now = time.perf_counter()
        started, first = self._window
        rate = (step - first) / max(now - started, 1e-9)
        self._window = (now, step)
        values: dict[str, float] = {}
        for name, value in logs.items():
            try:
                values[name] = float(value)
            except (TypeError, ValueError):
                continue
        total = self._total
        eta = f" eta {round((total - step) / rate)} s" if total and rate else ""
        shown = " ".join(f"{k} {v:.4f}" for k, v in values.items())
        log.info("step %d/%s %s %.1f steps/s%s", step, total or "?", shown, rate, eta)
        record: dict[str, float] = {**values, "steps_per_s": round(rate, 3), **process_usage()}
        if total:
            record["total_steps"] = total
        self._records.record(step, record)
