"""What hpctf gives a ``model.fit`` script (``train.script``) through one Keras callback:
:func:`hpctf.keras.callbacks` returns :class:`FitCallback`.

The same pieces as hpctf's own loop (:class:`hpctf.compute.loop.session.Session`): checkpoints
(:class:`~hpctf.compute.records.checkpoints.Checkpointer`: every worker takes part, only the
chief's copy lands, restored at the step all ranks agree on; written in the background with
``checkpoint.asynchronous``, a failed write taken at the next batch), the preemption agreement
(:class:`~hpctf.compute.loop.preemption.PreemptionWatch`: a warning to any rank is saved by every
rank at one agreed step, then exit 75), the chief's records (metrics.jsonl, TensorBoard) and the
stall watchdog, fed by every batch.

Resuming at the exact step: after ``on_train_begin`` tf_keras's ``fit`` (``train.keras: 2``)
asks ``model._training_state.maybe_load_initial_counters_from_ckpt`` for the epoch and the step
inside it to continue at, the hook its own ``BackupAndRestore`` uses
(tf_keras/src/engine/training.py); Keras 3's ``fit`` reads ``model._initial_epoch`` after
``on_train_begin`` (what its ``BackupAndRestore`` sets, keras/src/callbacks/backup_and_restore.py)
and has no step inside an epoch, so the first ``k`` calls of its train function in the resumed
epoch take their batch and train nothing (:func:`skipping`). The input pipeline starts its epoch
again (``dataset.repeat()`` from its beginning) and the batches the interrupted start trained on
are passed over, so with a seeded shuffle the resumed run sees the batches an uninterrupted one
does. Keras's logs are running means over the epoch: in the epoch it resumed in they cover the
steps since the resume.

The training logs hpctf records are those ``fit`` computed, averaged across replicas (tf_keras
summed them: :mod:`hpctf.compute.compat.keras_fit`); each epoch's ``val_*`` logs are recorded as
the run's eval metrics at the epoch's last step.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from typing import Any

import tensorflow as tf

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat.keras_fit import FitInput, fit_input, random_state_variables
from hpctf.compute.doctor.procstat import process_usage
from hpctf.compute.loop.cadence import AgreementClock, Cadence
from hpctf.compute.loop.preemption import (
    Preempted,
    PreemptionWatch,
    leaving_words,
    make_gather,
)
from hpctf.compute.loop.pruning import TrialPruning, trial_pruning
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.process.leaving import exit_later
from hpctf.compute.records.checkpoints import Checkpointer, checkpoint_of
from hpctf.compute.records.chief_records import ChiefRecords
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


def skipping(train_function: Any, calls: int, extra: int, restore: Any) -> Any:
    """``fit``'s train function for a resume: its first call first takes ``extra`` batches from
    the iterator; then its first ``calls`` calls each take one more batch and train nothing
    (returning no logs); then ``restore(train_function)`` puts the real one back."""
    left, pending = calls, extra

    def skip_then_train(iterator: Any) -> Any:
        nonlocal left, pending
        for _ in range(pending):
            next(iterator)  # batches the interrupted start trained on before its save
        pending = 0
        if left > 0:
            left -= 1
            next(iterator)
            return {}
        restore(train_function)
        return train_function(iterator)

    return skip_then_train


def passed_over(step: int, per_epoch: int, given: FitInput, legacy: bool) -> tuple[int, int]:
    """How a resumed ``fit`` at ``step`` passes over the batches trained before: ``(calls,
    extra)`` for :func:`skipping`. Keras 3 calls its train function for every batch of the
    epoch it resumes in (``calls``: one per batch trained in it); tf_keras starts at the step
    itself. An input that continues across epochs is also passed over by the epochs before."""
    _, inside = resume_position(step, per_epoch, given.initial_epoch)
    before = step - given.initial_epoch * per_epoch if given.continues else inside
    calls = 0 if legacy else inside
    return calls, max(before - calls, 0)


def legacy_keras(model: Any) -> bool:
    """Whether ``model`` is tf_keras's (Keras 2) rather than Keras 3's."""
    return type(model).__module__.startswith("tf_keras") or any(
        klass.__module__.startswith("tf_keras") for klass in type(model).__mro__
    )


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
        self._gather: Any = None
        self._pruning: TrialPruning | None = None  # a search's trial (RUN/trial.json)
        self._saved_step: int | None = None
        self._resumed_inside = (0, 0)
        self._running_metrics: list[tuple[Any, Any]] = []
        self._window = (time.perf_counter(), 0)
        self._clock = AgreementClock(
            self._settings.preemption_check_every_steps,
            self._warning_seconds,
            self._checkpoint_settings.every_seconds,
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
        gather = self._gather = make_gather(strategy)
        self._pruning = trial_pruning(self._run.path, self._spec.is_chief)
        # After the strategy exists: TF's C++ handler would swallow SIGTERM otherwise.
        self._preemption = PreemptionWatch(gather).__enter__()  # left in _stop()
        timeout = self._settings.stall_timeout_seconds
        where = f"rank {self._spec.task_index} on {self._spec.node}"
        self._watchdog = ProgressWatchdog(timeout, where=where).start() if timeout else None
        epochs = int(self.params.get("epochs") or 0)
        self._total = self._steps_per_epoch * epochs or None
        self._cadence = dataclasses.replace(self._cadence, total=self._total)
        self._step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        objects: dict[str, Any] = {"step": self._step_variable, "model": model}
        running = [] if legacy_keras(model) else list(model.metrics_variables)
        optional = {"random_state": random_state_variables(objects), "running_metrics": running}
        if model.optimizer is not None:
            with strategy.scope():
                # Slots now, so the restore fills them instead of deferring. Keras 3's fit built
                # its optimizer already (_symbolic_build), tf_keras's not yet.
                if legacy_keras(model) or not model.optimizer.built:
                    model.optimizer.build(model.trainable_variables)
            objects["optimizer"] = model.optimizer
        checkpoint, required = checkpoint_of(objects, optional)
        self._checkpointer = Checkpointer(
            checkpoint,
            self._run.checkpoints,
            self._spec,
            self._checkpoint_settings.keep,
            self._checkpoint_settings.asynchronous,
            required=required,
        )
        restored = self._checkpointer.restore_agreed(gather)
        self._beat("restore")
        self._step = int(self._step_variable.numpy())
        self._records.resumed(self._step)  # records of an earlier start past it: superseded
        if restored:
            log.info("resumed from %s at step %d", restored, self._step)
        else:
            log.info("no checkpoint in %s: starting at step 0", self._run.checkpoints)
        self._resume_fit_at(model, self._step)
        if self._resumed_inside[1] and running:
            # fit resets the metrics as each epoch begins: what the epoch had summed before the
            # save is put back then (a collective read on every rank, in the same order).
            self._running_metrics = [(v, v.numpy()) for v in running]
        self._window = (time.perf_counter(), self._step)
        self._clock.restart(self._step)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        if self._running_metrics and epoch == self._resumed_inside[0]:
            for variable, value in self._running_metrics:
                variable.assign(value)
            self._running_metrics = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        step = (epoch + 1) * self._steps_per_epoch
        values = _floats(logs or {})
        shown = " ".join(f"{k} {v:.4f}" for k, v in values.items())
        epochs = self.params.get("epochs", "?")
        log.info("epoch %d/%s at step %d: %s", epoch + 1, epochs, step, shown)
        validation = {k: v for k, v in values.items() if k.startswith("val_")}
        if validation:
            self._records.record(step, validation, group="eval")
            if self._pruning is not None:
                self._report(epoch + 1, step, validation)

    def _report(self, evaluation: int, step: int, validation: dict[str, float]) -> None:
        """A search's trial (:mod:`hpctf.compute.loop.pruning`): the chief reports the epoch's
        validation (``val_loss`` is the objective's ``eval.loss``) and votes; every rank takes
        the votes at this same epoch's end (one gather, trials only) and, on a prune, saves this
        step and stops ``fit`` (``model.stop_training``); the script goes on after ``fit`` and
        the run ends ``pruned``."""
        pruning, ask = self._pruning, step != self._total  # the last epoch: nothing to stop
        if pruning is None:
            return
        named = {k.removeprefix("val_"): v for k, v in validation.items()}
        vote = pruning.report(step, evaluation, {**validation, **named}, ask=ask)
        if not ask or not any(self._gather(1 if vote else 0)):
            return
        if self._saved_step != step:
            self._save(step)
        if self._checkpointer is not None:
            self._checkpointer.wait()  # the step on disk before the record says so
        if self._spec.is_chief:
            pruning.record(self._run, self._spec.journal_job, step)
        log.info("the search pruned this trial: saved step %d; fit stops here", step)
        self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not logs and self._skipping(batch):
            return  # a batch passed over on a resume inside an epoch (skipping)
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
        if self._checkpointer is not None:
            self._checkpointer.poll()  # a background save that failed ends the run now

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self._beat("evaluation batch")  # fit's validation between epochs

    def on_train_end(self, logs: Any = None) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()  # the last save on disk before the script goes on
        self._stop()
        if legacy_keras(self.model):
            self.model._training_state = None
        log.info("fit ended at step %d", self._step)

    # --- the pieces --------------------------------------------------------------------------

    def _resume_fit_at(self, model: Any, step: int) -> None:
        """Make ``fit`` continue at ``step``: tf_keras through its training state, Keras 3 at the
        epoch (``_initial_epoch``); both pass over the batches trained before (:func:`skipping`)."""
        legacy = legacy_keras(model)
        given = fit_input(model)
        epoch, inside = resume_position(step, self._steps_per_epoch, given.initial_epoch)
        if legacy:
            model._training_state = _TrainingState(step)
        elif step:
            model._initial_epoch = epoch
            self._resumed_inside = (epoch, inside)
        calls, extra = passed_over(step, self._steps_per_epoch, given, legacy)
        if calls or extra:

            def restore(function: Any) -> None:
                model.train_function = function

            model.train_function = skipping(model.train_function, calls, extra, restore)
            log.info(
                "resuming fit at epoch %d, batch %d: passing over %d batches",
                epoch + 1,
                inside,
                calls + extra,
            )

    def _skipping(self, batch: int) -> bool:
        epoch, inside = self._resumed_inside
        return self._epoch == epoch and batch < inside

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
        self._saved_step = step
        self._clock.saved()
        if path is not None:
            log.info("checkpoint %s (%.2f s)", path, time.perf_counter() - started)
        self._beat(f"checkpoint of step {step}")

    def _check_preemption(self, step: int, saved: bool) -> None:
        if self._preemption is None:
            return
        clock = self._clock
        signum, slowest, save = self._preemption.agree(clock.step_seconds(step), clock.save_vote())
        clock.agreed(step, slowest)
        if save and not saved:  # checkpoint.every_seconds: the same step on every rank
            self._save(step)
            saved = True
        if not signum:
            return
        name = signal.Signals(signum).name
        if step == self._total:
            log.warning("got %s at the last step: finishing instead of requeuing", name)
            return
        if not saved:
            self._save(step)
        if self._checkpointer is not None:
            self._checkpointer.wait()  # the agreed step on disk before the requeue is recorded
        if self._spec.is_chief:
            # The batch script requeues on this record (as after Session.step_done's save).
            journal.record_saved_on_warning(
                self._run, self._spec.journal_job, step, name.removeprefix("SIG")
            )
        self._preemption.agree(0.0)  # a barrier: no rank leaves before the chief's record
        log.warning(leaving_words(self._run, step))
        self._stop()
        # The script's own code after fit (a model.save, an evaluate with collectives) may wait
        # on ranks that are leaving: bounded as the built-in loop's exit is (leaving.py).
        exit_later(PREEMPTED_EXIT)
        raise Preempted()

    def _log_progress(self, step: int, logs: dict[str, Any]) -> None:
        now = time.perf_counter()
        started, first = self._window
        rate = (step - first) / max(now - started, 1e-9)
        self._window = (now, step)
        values = _floats(logs)
        total = self._total
        eta = f" eta {round((total - step) / rate)} s" if total and rate else ""
        shown = " ".join(f"{k} {v:.4f}" for k, v in values.items())
        log.info("step %d/%s %s %.1f steps/s%s", step, total or "?", shown, rate, eta)
        record: dict[str, float] = {**values, "steps_per_s": round(rate, 3), **process_usage()}
        if total:
            record["total_steps"] = total
        self._records.record(step, record)


def _floats(logs: dict[str, Any]) -> dict[str, float]:
    """The logs that are numbers, as floats (Keras 3 gives tensors or numpy values)."""
    values: dict[str, float] = {}
    for name, value in logs.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            continue
    return values
