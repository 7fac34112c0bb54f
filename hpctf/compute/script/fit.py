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

import logging
from typing import Any

import tensorflow as tf

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat.fit_input import RESHUFFLED_INPUT, FitInput, fit_input
from hpctf.compute.loop.cadence import Cadence
from hpctf.compute.loop.control import Parts, TrainingControl
from hpctf.compute.loop.preemption import Preempted, PreemptionWatch, make_gather
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.records.chief_records import ChiefRecords
from hpctf.core.errors import UserError
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
    """``model.fit``'s adapter on :class:`~hpctf.compute.loop.control.TrainingControl`:
    checkpoints, preemption saves, pruning, progress and a fed watchdog."""

    def __init__(self, config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> None:
        super().__init__()
        # Keras's progress bar rewrites its line with \r and no newline, which runs into the
        # rank log's next lines; without interactive logging fit's verbose="auto" is one line
        # per epoch, through absl logging. hpctf's own progress lines say the rest.
        tf.keras.utils.disable_interactive_logging()
        self._config = config
        self._run = run
        self._spec = spec
        self._records = ChiefRecords(run, spec.is_chief, config)
        self._control: TrainingControl | None = None
        self._epoch = 0
        self._step = 0
        self._steps_per_epoch = 0
        self._resumed_inside = (0, 0)
        self._running_metrics: list[tuple[Any, Any]] = []

    # --- fit's hooks ---------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        self._steps_per_epoch = int(self.params.get("steps") or 0)
        if not self._steps_per_epoch:
            raise UserError(
                "hpctf.keras.callbacks() needs the steps of an epoch: give fit steps_per_epoch=N, "
                "or a dataset whose size TensorFlow knows"
            )
        model = self.model
        control = self._control = self._start(model.distribute_strategy)
        objects: dict[str, Any] = {"model": model}
        running = [] if legacy_keras(model) else list(model.metrics_variables)
        if model.optimizer is not None:
            with model.distribute_strategy.scope():
                # Slots now, so the restore fills them instead of deferring. Keras 3's fit built
                # its optimizer already (_symbolic_build), tf_keras's not yet.
                if legacy_keras(model) or not model.optimizer.built:
                    model.optimizer.build(model.trainable_variables)
            objects["optimizer"] = model.optimizer
        self._step = control.track(objects, {"running_metrics": running})
        if fit_input(model).reshuffled:
            log.warning("%s", RESHUFFLED_INPUT)
        self._resume_fit_at(model, self._step)
        if self._resumed_inside[1] and running:
            # fit resets the metrics as each epoch begins: what the epoch had summed before the
            # save is put back then (a collective read on every rank, in the same order).
            self._running_metrics = [(v, v.numpy()) for v in running]

    def _start(self, strategy: Any) -> TrainingControl:
        """The control for this fit: its preemption watch entered (left in :meth:`_stop`) and
        its watchdog started."""
        settings, config = self._config.experiment.train, self._config
        gather = make_gather(strategy)
        # After the strategy exists: TF's C++ handler would swallow SIGTERM otherwise.
        preemption = PreemptionWatch(gather).__enter__()
        timeout = settings.stall_timeout_seconds
        where = f"rank {self._spec.task_index} on {self._spec.node}"
        watchdog = ProgressWatchdog(timeout, where=where).start() if timeout else None
        epochs = int(self.params.get("epochs") or 0)
        total = self._steps_per_epoch * epochs or None
        cadence = Cadence(settings.log_every_steps, config.experiment.checkpoint.every_steps, total)
        return TrainingControl(
            settings,
            config.experiment.checkpoint,
            self._run,
            self._spec,
            Parts(strategy, gather, preemption, watchdog, self._records),
            cadence=cadence,
            warning_seconds=launcher_for(config.site).warning_seconds,
        )

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
            self._report(epoch + 1, step, validation)

    def _report(self, evaluation: int, step: int, validation: dict[str, float]) -> None:
        """A search's trial (:mod:`hpctf.compute.loop.pruning`): the chief reports the epoch's
        validation (``val_loss`` is the objective's ``eval.loss``) and votes; every rank takes
        the votes at this same epoch's end (one gather, trials only) and, on a prune, saves this
        step and stops ``fit`` (``model.stop_training``); the script goes on after ``fit`` and
        the run ends ``pruned``."""
        control = self._control
        if control is None or control.pruning is None:
            return
        ask = step != control.cadence.total  # the last epoch: nothing to stop
        named = {k.removeprefix("val_"): v for k, v in validation.items()}
        vote = control.report(step, {**validation, **named}, ask, evaluation)
        if not ask or not control.agree_to_prune(vote):
            return
        control.prune(step)
        self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not logs and self._skipping(batch):
            return  # a batch passed over on a resume inside an epoch (skipping)
        # The step as fit counts it (epochs from 0, batches inside each), so a resumed fit
        # and an uninterrupted one number their steps alike.
        step = self._epoch * self._steps_per_epoch + batch + 1
        self._step = step
        if self._control is None:
            return
        try:
            self._control.step_done(step, _floats(logs or {}))
        except Preempted:
            # No rank leaves before the chief's record; the script's own code after fit (a
            # model.save, an evaluate with collectives) may wait on ranks that are leaving:
            # bounded as the built-in loop's exit is (leaving.py, set by the control).
            self._control.barrier()
            self._stop()
            raise

    def on_test_begin(self, logs: Any = None) -> None:
        if self._control is not None:
            self._control.equalize()  # fit's validation scores the model every rank holds

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._control is not None:
            self._control.keepalive("evaluation batch")  # fit's validation between epochs

    def on_train_end(self, logs: Any = None) -> None:
        if self._control is not None:
            self._control.equalize()  # what the script evaluates and saves after fit: one model
            self._control.wait_for_saves()  # the last save on disk before the script goes on
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
        control = self._control
        if control is None:
            return
        control.stop_watching()
        control.preemption.__exit__()


def _floats(logs: dict[str, Any]) -> dict[str, float]:
    """The logs that are numbers, as floats (Keras 3 gives tensors or numpy values)."""
    values: dict[str, float] = {}
    for name, value in logs.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            continue
    return values
