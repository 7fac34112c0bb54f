"""hpctf's built-in training loop, a client of :class:`hpctf.compute.loop.session.Session`.

Not ``model.fit``: Keras 3's fit is broken under MultiWorkerMirroredStrategy
(keras-team/keras#20585, ``strategy.reduce`` on a tuple of PerReplica). A custom loop --
``strategy.run`` inside a ``tf.function``, ``tf.nn.compute_average_loss`` -- works with Keras 3
models and optimizers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hpctf.api import Task
from hpctf.compute.cluster.joining import with_loss_scaling
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.loop.control import Pruned, peer_lost
from hpctf.compute.loop.evaluation import Evaluator
from hpctf.compute.loop.learning_rate import learning_rate_scaler
from hpctf.compute.loop.preemption import Preempted
from hpctf.compute.loop.session import Session, open_session
from hpctf.compute.loop.step_flags import StepFlags, flagged_train_step
from hpctf.compute.process import startup_clock
from hpctf.compute.process.leaving import exit_later, hold_until_exit
from hpctf.compute.records.final_model import save_final_model
from hpctf.compute.users_code import attribution as user_code
from hpctf.compute.users_code.compile_style import (
    metric_directions,
    resolve_loss,
    resolve_metrics,
    resolve_optimizer,
)
from hpctf.compute.users_code.task_callbacks import TaskCallbacks
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.train import Train

log = logging.getLogger("hpctf.worker")


def load_entry(entry: str | None) -> Callable[..., Any]:
    """Import ``module:function``."""
    if entry is None:
        raise UserError("train.entry is not set")
    module_name, _, function_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"train.entry {entry!r}: cannot import {module_name}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UserError(f"train.entry {entry!r}: {module_name} has no function {function_name}")
    return function  # type: ignore[no-any-return]


def train(config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> int:
    """Run (or resume) training; 0 when complete, 75 when preempted after a checkpoint.
    A peer that stops answering is :class:`hpctf.compute.cluster.peers.PeerLost` (exit 3)."""
    settings = config.experiment.train
    warning = launcher_for(config.site).warning_seconds
    with open_session(
        settings, config.experiment.checkpoint, run, spec, warning, config
    ) as session:
        try:
            return _train(config, run, spec, session)
        except tf.errors.OpError as exc:
            lost = peer_lost(exc, spec, session.control)
            if lost is None:
                raise
            raise lost from exc


def _train(config: ResolvedConfig, run: RunDir, spec: ClusterSpec, session: Session) -> int:
    settings = config.experiment.train
    status = 0
    try:
        with user_code.region():
            entry = load_entry(settings.entry)
            if settings.loop == "custom":
                user_code.call(f"train.entry {settings.entry}", entry, session, **settings.args)
            else:
                builtin_loop(session, entry)
    except (Preempted, Pruned) as stop:
        status = int(stop.code or 0)
    except user_code.UserCodeError as exc:
        # A custom loop's collective that failed because a peer left raises from the user's
        # frame: the peer's fault, not the user's code.
        if lost := peer_lost(exc.__cause__, spec, session.control):
            raise lost from exc.__cause__
        return user_code.report(exc, run, spec)
    except EnvironmentProblem as exc:
        if spec.is_chief:  # the batch script does not requeue a run the environment stopped
            with contextlib.suppress(EnvironmentProblem):  # the journal's disk may be full too
                journal.record_environment_failed(run, spec.journal_job, str(exc))
        raise
    # The built-in loop and the preemption save set the bound where training ends, before the
    # input pipeline is torn down; this one bounds what a custom loop leaves after it returns.
    exit_later(status)
    session.close()
    return status


def build_task(
    entry: Callable[..., Any], settings: Train, strategy: Any, policy: str | None = None
) -> tuple[Task, dict[str, str]]:
    """Call the user's entry inside the strategy's scope; check and finish what it returns
    (loss scaling for float16, optimizer slots built); its metrics' directions (for Keras
    callbacks' ``mode="auto"``)."""
    with strategy.scope():
        task = user_code.call(f"train.entry {settings.entry}", entry, **settings.args)
        if not isinstance(task, Task):
            raise UserError(
                f"train.entry {settings.entry!r} returned {type(task).__name__}, not hpctf.Task"
            )
        given = task
        # What model.compile takes (names, Keras losses of any reduction, metric lists), once.
        task = dataclasses.replace(
            task,
            optimizer=resolve_optimizer(task.optimizer),
            loss=resolve_loss(task.loss),
            metrics=resolve_metrics(task.metrics, task.loss),
        )
        task.optimizer = with_loss_scaling(task.optimizer, policy)
        # Build optimizer slots now so a restore fills them instead of deferring.
        task.optimizer.build(task.model.trainable_variables)
    # Outside the scope: a metric named here is a Keras metric, with plain variables.
    return task, metric_directions(given.metrics, given.loss)


def _restored_task(session: Session, entry: Callable[..., Any]) -> tuple[Task, int, dict[str, str]]:
    """The entry's task, restored from the newest checkpoint (its learning rate scaled after
    the restore when asked), the step to continue after, and its metrics' directions."""
    settings, strategy = session.settings, session.strategy
    task, directions = build_task(entry, settings, strategy, session.precision_policy)
    startup_clock.mark("model")
    rescale = (
        learning_rate_scaler(task.optimizer, strategy.num_replicas_in_sync)
        if settings.scale_learning_rate
        else None
    )
    start = session.track(model=task.model, optimizer=task.optimizer)
    if rescale is not None:
        log.info("%s", rescale())
    return task, start, directions


def builtin_loop(session: Session, entry: Callable[..., Any]) -> None:
    """hpctf's loop over the entry's task: steps, evaluations, Keras callbacks, the session's
    hook after every step."""
    settings, strategy = session.settings, session.strategy
    task, start, directions = _restored_task(session, entry)
    iterator = session.distribute(task.train_data, task.shuffle_buffer)
    hold_until_exit(iterator)  # not torn down when this returns or raises Preempted
    total = session.total_steps
    flags = session.step_flags()
    train_step = make_train_step(
        strategy, task, session.global_batch_size, settings.jit_compile, flags
    )
    evaluator = Evaluator(session, task.eval_data, task) if task.eval_data is not None else None
    hooks = TaskCallbacks(
        task.callbacks,
        task.model,
        task.optimizer,
        session.spec.is_chief,
        total,
        steps_per_epoch(settings, total),
        run_dir=session.run.path,
        directions=directions,
    )
    if hooks:
        hooks.train_begin(start)
    startup_clock.mark("input and step function")
    steps = _Steps(session, lambda ahead: train_step(iterator, ahead), flags, hooks, evaluator)
    final, results, evaluated = steps.run(start)
    if steps.pruned:  # saved on every rank, recorded: the run ends pruned, exit 0
        if hooks:
            hooks.train_end({f"val_{name}": value for name, value in results.items()})
        exit_later(0)
        return
    if evaluated != final:
        results = steps.evaluate(final)
    steps.report(final, results, ask=False)  # a trial's last evaluation, to its study
    if hooks:
        hooks.train_end({f"val_{name}": value for name, value in results.items()})
    session.keepalive("saving the trained model")
    save_final_model(task.model, session.run, settings, session.spec.is_chief)
    session.finish(final, results)
    exit_later(0)  # bounded from here on every rank


@dataclasses.dataclass
class _Steps:
    """The built-in loop's steps, from the restored one to the last (or a callback's stop)."""

    session: Session
    train_step: Callable[[int], Any]  # that many steps in one call; the last one's loss
    flags: StepFlags
    hooks: TaskCallbacks
    evaluator: Evaluator | None
    asked: bool = False  # the pruner was asked after the last call: its vote rides in the next
    pruned: bool = False

    def evaluate(self, step: int) -> dict[str, float]:
        return self.evaluator.at(step) if self.evaluator is not None else {}

    def report(self, step: int, results: dict[str, float], ask: bool) -> None:
        """A trial's evaluation at ``step`` to its study (the control's); with ``ask``, the
        chief's vote to prune goes into the next call's steps, and every rank runs that call
        as one step and reads the agreed vote after it (:meth:`run`): no gather of its own."""
        control = self.session.control
        if not self.session.settings.eval_every_steps or not results:
            return  # the evaluations of train.eval_every_steps are a trial's resource
        if control.report(step, results, ask):
            self.flags.vote_prune()
        self.asked = ask

    def prune(self, step: int) -> None:
        """Every rank agreed to prune after ``step``: saved on every rank, recorded."""
        self.session.control.prune(step)
        self.pruned = True

    def run(self, start: int) -> tuple[int, dict[str, float], int]:
        """Train from ``start``; the step training ended at, the last evaluation's results and
        the step it was at (-1: none)."""
        session, hooks, settings = self.session, self.hooks, self.session.settings
        total, every_eval = session.total_steps, settings.eval_every_steps
        results: dict[str, float] = {}
        evaluated = -1
        step = start
        while step < total:
            # The steps up to the next one that calls for anything run in one call; with Keras
            # callbacks (per-step hooks) one at a time, and the first alone (its time is logged);
            # the one after a trial's evaluation alone, as it carries the vote to prune.
            asked, self.asked = self.asked, False
            ahead = 1 if hooks or step == start or asked else session.next_due(step) - step
            if every_eval:
                ahead = min(ahead, every_eval - step % every_eval)
            if hooks:
                hooks.step_begin(step + 1)
            self.flags.push()  # a warning since the last call rides in this one
            loss = self.train_step(ahead)
            step += ahead
            if hooks:
                hooks.step_end(step, loss)  # TerminateOnNaN sees a NaN before hpctf refuses it
            stopping = bool(hooks) and hooks.stop
            value = self.loss_value(loss, step, stopping)
            if asked and step != total and self.flags.pruned:  # the same on every rank
                self.prune(step)
                return step, results, evaluated
            epoch_end = bool(hooks) and (hooks.epoch_ends(step) or step == total or stopping)
            due = bool(every_eval) and step % (every_eval or 1) == 0
            if (due and step != total) or (epoch_end and self.evaluator is not None):
                results, evaluated = self.evaluate(step), step
                if due and step != total:  # the cadence's evaluations are the trial's resource
                    self.report(step, results, ask=True)
            if epoch_end:
                hooks.epoch_end(step, results if evaluated == step else None)
            session.step_done(step, loss=value)
            if hooks.stop and step != total:  # model.stop_training: EarlyStopping, TerminateOnNaN
                self.stopped_by_callback(step)
                return step, results, evaluated
        return total, results, evaluated

    def loss_value(self, loss: Any, step: int, stopping: bool) -> float | None:
        """The loss of ``step`` read on the host where it is logged (the last step, one a
        callback stops at, every ``train.log_every_steps``), else None: reading it waits for
        the step to finish, and the other steps are dispatched back to back. A loss that is
        not finite is the user's (unless a callback stops there: TerminateOnNaN)."""
        total = self.session.total_steps
        if step % self.session.settings.log_every_steps and step != total and not stopping:
            return None
        value = float(loss)
        if not math.isfinite(value) and not stopping:
            raise UserError(f"loss became {value} at step {step}; lower the learning rate?")
        return value

    def stopped_by_callback(self, step: int) -> None:
        """A callback stopped training at ``step`` (``model.stop_training``): saved, said."""
        session = self.session
        if session.last_saved_step != step:
            session.save(step)
        log.info(
            "training stopped at step %d of %d by a callback (model.stop_training)",
            step,
            session.total_steps,
        )


def steps_per_epoch(settings: Train, total: int) -> int:
    """An epoch for Keras callbacks: one pass over the training data with train.epochs; with
    train.steps, the steps between evaluations, else the whole run."""
    if settings.epochs:
        return max(1, total // settings.epochs)
    return settings.eval_every_steps or total


def make_train_step(
    strategy: Any, task: Task, global_batch: int, jit_compile: bool, flags: StepFlags | None = None
) -> Any:
    """``train_step(iterator, steps=1)``: optimizer steps on the next global batches; returns
    the last one's loss summed over replicas: the call's one reduction besides the gradients',
    which also carries the ranks' preemption warnings (``flags``; the session's, from
    :meth:`Session.step_flags`)."""
    model, optimizer, loss_fn = task.model, task.optimizer, task.loss

    def gradients(features: Any, labels: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            predicted = user_code.model_call(model, features, training=True)
            predictions = tf.cast(predicted, tf.float32)
            per_example = user_code.loss_call(loss_fn, labels, predictions)
            if per_example.shape.rank == 0:  # known while tracing, before the first step
                raise UserError(
                    "Task loss returned one value for the whole batch: return one value per "
                    "example (hpctf averages over the global batch), or give a Keras loss "
                    "name or object (any reduction)"
                )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
        return loss, tape.gradient(scaled, model.trainable_variables)

    # XLA compiles the per-replica forward and backward; the all-reduce in apply_gradients
    # stays outside, where the collective implementation chosen by the session runs it.
    compiled = tf.function(gradients, jit_compile=True) if jit_compile else gradients

    def replica_step(features: Any, labels: Any) -> Any:
        loss, grads = compiled(features, labels)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return flagged_train_step(strategy, replica_step, flags if flags is not None else StepFlags())
