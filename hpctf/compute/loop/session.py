"""What hpctf gives every training loop on a compute node, its own and a user's.

A :class:`Session` owns the strategy, the checkpoints (chief-only, verified, with fallback),
the data position, the chief's records and the preemption hook. hpctf's built-in loop
(:mod:`hpctf.compute.loop.training`) is one client; a user with a loop of their own
(``train.loop: custom``) gets the same session, so their script has the same guarantees::

    def main(session: hpctf.Session, **args) -> None:
        with session.strategy.scope():
            model, optimizer = build(...)
        start = session.track(model=model, optimizer=optimizer)   # restores, returns the step
        iterator = session.distribute(train_data)  # positioned at `start`
        total = session.total_steps  # train.steps, or train.epochs over train_data
        for step in range(start + 1, total + 1):
            loss = my_step(iterator)
            session.step_done(step, loss=loss)  # logs, checkpoints, handles preemption
        session.finish(total)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import keras
import tensorflow as tf

from hpctf.api import DataSource
from hpctf.compute.cluster.joining import Connection, connect
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat.keras_fit import random_state_variables
from hpctf.compute.doctor.procstat import process_usage
from hpctf.compute.loop.cadence import (
    AgreementClock,
    Cadence,
    format_eta,
    save_outlasts_warning,
    steps_for_epochs,
)
from hpctf.compute.loop.data import cardinality, evaluation_dataset, plan_shards, training_input
from hpctf.compute.loop.preemption import Preempted, PreemptionWatch, make_gather
from hpctf.compute.loop.step_flags import StepFlags
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.process import startup_clock
from hpctf.compute.process.launcher_watch import LAUNCHER_PID_ENV
from hpctf.compute.process.leaving import exit_later
from hpctf.compute.records.checkpoints import Checkpointer, checkpoint_of
from hpctf.compute.records.chief_records import ChiefRecords
from hpctf.core.errors import PREEMPTED_EXIT, UserError
from hpctf.core.run import journal
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir, write_atomic
from hpctf.core.settings.config import Checkpoint, ResolvedConfig, Train

log = logging.getLogger("hpctf.worker")


@contextlib.contextmanager
def open_session(
    settings: Train,
    checkpoint: Checkpoint,
    run: RunDir,
    spec: ClusterSpec,
    warning_seconds: int | None = None,
    config: ResolvedConfig | None = None,
) -> Iterator[Session]:
    """Join the cluster (:func:`hpctf.compute.cluster.joining.connect`), then a
    :class:`Session` with its watchdog and preemption watch for as long as the block runs; on
    leaving, the watchdog is stopped and the signal handlers the watch replaced are back.

    ``warning_seconds``: how long before the time limit Slurm warns (None off Slurm); it
    bounds how long a warning may wait for the ranks' agreement, in seconds. ``config``: the
    run's, for its ``tracking:`` trackers (without it: metrics.jsonl and TensorBoard only).
    """
    if settings.global_batch_size is None:  # the config allows that for train.script only
        raise UserError("train.global_batch_size is required with train.entry")
    connection = connect(settings, spec)
    startup_clock.mark("join")
    gather = make_gather(connection.strategy)
    timeout = settings.stall_timeout_seconds
    where = f"rank {spec.task_index} on {spec.node}"
    watchdog = ProgressWatchdog(timeout, where=where).start() if timeout else None
    try:
        # After the strategy exists: TF's C++ handler would swallow SIGTERM otherwise.
        with PreemptionWatch(gather) as preemption:
            yield Session(
                settings,
                checkpoint,
                run,
                spec,
                connection=connection,
                gather=gather,
                preemption=preemption,
                watchdog=watchdog,
                clock=AgreementClock(
                    settings.preemption_check_every_steps, warning_seconds, checkpoint.every_seconds
                ),
                # After the strategy too: TensorBoard's writer starts TensorFlow's context.
                records=ChiefRecords(run, spec.is_chief, config),
            )
    finally:
        if watchdog is not None:
            watchdog.stop()


class Session:
    """One rank's share of a run: strategy, checkpoints, data position, records, signals.

    Made by :func:`open_session`, which owns the parts' lifetimes; what each step calls for is
    :class:`hpctf.compute.loop.cadence.Cadence`'s to say.
    """

    def __init__(
        self,
        settings: Train,
        checkpoint: Checkpoint,
        run: RunDir,
        spec: ClusterSpec,
        *,
        connection: Connection,
        gather: Callable[[int], list[int]],
        preemption: PreemptionWatch,
        watchdog: ProgressWatchdog | None,
        clock: AgreementClock,
        records: ChiefRecords,
    ) -> None:
        self.settings = settings
        self.global_batch_size: int = settings.global_batch_size or 0
        self._checkpoint_settings = checkpoint
        self.run = run
        self.spec = spec
        self.strategy = connection.strategy
        self.precision_policy = connection.precision_policy
        self._gather = gather
        self._preemption = preemption
        self._watchdog = watchdog
        self._clock = clock
        self._warning_seconds = clock.warning_seconds
        # The last step is known from train.steps; with train.epochs once distribute() has
        # counted the data.
        self._cadence = Cadence(
            settings.log_every_steps,
            checkpoint.every_steps,
            settings.steps,
            settings.restart_every_steps,
        )
        self._save_seconds: float | None = None  # the last save, until warned about
        self._last_save_seconds: float | None = None  # the last save, for the records
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._checkpointer: Checkpointer | None = None
        self._saved_step: int | None = None
        self._records = records
        self._window = (time.perf_counter(), 0)
        startup_clock.mark("session")  # the watchdog, the preemption watch, the records

    @property
    def total_steps(self) -> int:
        """The run's last step: ``train.steps``, or with ``train.epochs`` the epochs times the
        full global batches of the data :meth:`distribute` was given (UserError before)."""
        if self._cadence.total is None:
            raise UserError(
                "train.epochs: the session learns the last step from the data given to "
                "session.distribute(...); call it first, or give train.steps"
            )
        return self._cadence.total

    # --- checkpoints and data --------------------------------------------------------------

    def track(self, **objects: Any) -> int:
        """Checkpoint ``objects`` (model, optimizer, ...) from now on; restore the newest whole
        checkpoint into them; return the step to continue after (0 for a fresh run)."""
        # RandomFlip, Dropout: their seed states, for exact resumes.
        seeds = {"random_state": random_state_variables(objects)}
        checkpoint, required = checkpoint_of({"step": self._step, **objects}, seeds)
        settings = self._checkpoint_settings
        self._checkpointer = Checkpointer(
            checkpoint,
            self.run.checkpoints,
            self.spec,
            settings.keep,
            settings.asynchronous,
            required=required,
        )
        if self.precision_policy == "mixed_float16" and not any(
            isinstance(o, keras.optimizers.LossScaleOptimizer) for o in objects.values()
        ):
            log.warning(
                "mixed_float16 without loss scaling: small gradients underflow to zero; wrap "
                "the optimizer with hpctf.compute.cluster.joining.with_loss_scaling(optimizer, "
                "session.precision_policy)"
            )
        restored = self._checkpointer.restore_agreed(self._gather)
        self.keepalive("restore")
        start = int(self._step.numpy())
        startup_clock.mark("restore")
        self._records.resumed(start)
        if restored:
            log.info("resumed from %s at step %d", restored, start)
        else:
            log.info("no checkpoint in %s: starting at step 0", self.run.checkpoints)
        self._window = (time.perf_counter(), start)
        self._clock.restart(start)
        self._saved_step = start
        return start

    def step_flags(self) -> StepFlags:
        """The flags for a step that carries the warnings in its own reduction (step_flags);
        :meth:`step_done` agrees without a collective from now on. Every rank calls it."""
        flags = StepFlags()
        self._preemption.carry(flags, self.strategy.num_replicas_in_sync)
        return flags

    @property
    def checkpoint_every_steps(self) -> int | None:
        """checkpoint.every_steps: :meth:`step_done` saves the steps it divides (None: by time
        only, checkpoint.every_seconds)."""
        return self._checkpoint_settings.every_steps

    @property
    def last_saved_step(self) -> int | None:
        """The step this rank last saved (or restored), None before :meth:`track`."""
        return self._saved_step

    @property
    def start_step(self) -> int:
        return int(self._step.numpy())

    def save(self, step: int) -> None:
        """Save a checkpoint of ``step``; every rank must call it (collectives inside)."""
        if self._checkpointer is None:
            raise RuntimeError("call Session.track(...) before saving")
        self._step.assign(step)
        self.keepalive(f"step {step}")
        started = time.perf_counter()
        path = self._checkpointer.save(step)
        self._save_seconds = self._last_save_seconds = time.perf_counter() - started
        self._saved_step = step
        self._clock.saved()
        if path is not None:
            log.info("checkpoint %s (%.2f s)", path, self._save_seconds)
        else:
            log.info("checkpoint of step %d: the chief's copy (%.2f s)", step, self._save_seconds)
        self.keepalive(f"checkpoint of step {step}")

    def wait_for_saves(self) -> None:
        """Return once no checkpoint is being written (``checkpoint.asynchronous``)."""
        if self._checkpointer is not None:
            self._checkpointer.close()

    def distribute(self, source: DataSource, shuffle_buffer: int = 10_000) -> Any:
        """An iterator over ``source``, sharded (FILE or DATA, logged), batched to the global
        batch, and positioned after the step that :meth:`track` restored."""
        if self._cadence.total is None:
            total = steps_for_epochs(self.settings, cardinality(source), self.global_batch_size)
            self._cadence = dataclasses.replace(self._cadence, total=total)
        plan = plan_shards(source, len(self.spec.workers), self.spec.task_index)
        (log.warning if plan.policy == "DATA" and len(self.spec.workers) > 1 else log.info)(
            "input: %s sharding, %s", plan.policy, plan.reason
        )
        if plan.policy == "FILE":
            log.info("input files of this rank: %s", ",".join(plan.files))
        dataset_fn = training_input(
            source,
            plan,
            self.global_batch_size,
            self.settings.seed,
            shuffle_buffer,
            self.start_step,
        )
        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def examples_in(self, source: DataSource) -> int | None:
        """How many examples ``source`` holds, or None when that is not known up front."""
        return cardinality(source)

    def evaluation_dataset(self, source: DataSource) -> Any:
        """``source`` in global batches, every example once (the last batch may be smaller);
        build it once, distribute it for each evaluation."""
        return evaluation_dataset(source, self.global_batch_size)

    # --- the loop's hook -------------------------------------------------------------------

    def step_done(self, step: int, loss: float | None = None) -> None:
        """Call after every step (or after the last of several run in one call, up to
        :meth:`next_due`), on every rank: logs progress, checkpoints every
        ``checkpoint.every_steps`` and at the last step, and on a preemption signal to any rank
        saves this step on all ranks and raises :class:`Preempted` (exit status 75), as it does
        after saving a multiple of ``train.restart_every_steps`` (a planned restart). Saves by
        time (``checkpoint.every_seconds``) come at an agreement, at one step on every rank."""
        self.keepalive(f"step {step}")
        startup_clock.first_step(step)  # the first call logs where the start's time went
        self.total_steps  # noqa: B018 -- UserError while the last step is unknown
        if self._checkpointer is not None:
            self._checkpointer.poll()  # a background save that failed ends the run now
        due = self._cadence.due(step, self._clock.next)
        if loss is not None and due.log:
            self._log_progress(step, loss)
        if due.save:
            self.save(step)
        if due.agree:
            self._agree(step, saved=due.save)
        if due.restart:  # every rank knows the step: nothing to agree on
            self._leave_for_requeue(step, "restart", journal.record_saved_for_restart)

    def next_due(self, step: int) -> int:
        """The first step after ``step`` that :meth:`step_done` logs, saves or agrees at: a
        loop may run the steps up to it in one call."""
        return self._cadence.next_due(step, self._clock.next)

    def _agree(self, step: int, saved: bool) -> None:
        """The ranks' agreement at ``step``: a save by time when any rank voted for one; on a
        warning to any rank, save (unless ``saved``), record it and raise :class:`Preempted`;
        at the last step, finish instead."""
        clock = self._clock
        signum, slowest, save = self._preemption.agree(clock.step_seconds(step), clock.save_vote())
        clock.agreed(step, slowest)
        if save and not saved:
            self.save(step)
            saved = True
        late = save_outlasts_warning(self._save_seconds, slowest, self._warning_seconds)
        if late and self.spec.is_chief:
            log.warning("%s", late)
        self._save_seconds = None  # said once per measurement, not at every check
        if not signum:
            return
        name = signal.Signals(signum).name
        if step == self._cadence.total:
            log.warning("got %s at the last step: finishing instead of requeuing", name)
            return
        if not saved:
            self.save(step)
        signal_name = name.removeprefix("SIG")  # as the site names it: USR2, TERM
        self._leave_for_requeue(
            step,
            "preempted",
            lambda run, job, at: journal.record_saved_on_warning(run, job, at, signal_name),
        )

    def _leave_for_requeue(
        self, step: int, why: str, record: Callable[[RunDir, str, int], object]
    ) -> NoReturn:
        """Every rank has saved ``step``: the chief records it (``record``), all exit 75."""
        self.wait_for_saves()  # the step on disk before the record says so
        if self.spec.is_chief:
            # The batch script requeues on this record, not on srun's exit status: srun
            # --kill-on-bad-exit may kill a rank that is still exiting after the save.
            record(self.run, self.spec.journal_job, step)
        # No rank leaves before the chief has written the checkpoint and the record: the
        # caller's close() is the barrier.
        if os.environ.get(LAUNCHER_PID_ENV):  # a local launcher's warning: nothing requeues
            log.warning("%s: saved step %d; exiting %d (hpctf resubmit resumes it)",
                        read_history(self.run).local_stop(), step, PREEMPTED_EXIT)  # fmt: skip
        else:
            log.warning("%s: saved step %d; exiting %d for a requeue", why, step, PREEMPTED_EXIT)
        exit_later(PREEMPTED_EXIT)  # whatever the unwinding tears down (leaving.py)
        raise Preempted()

    def _log_progress(self, step: int, loss: float) -> None:
        now = time.perf_counter()
        started, first = self._window
        rate = (step - first) / max(now - started, 1e-9)
        self._window = (now, step)
        batch = self.global_batch_size
        total = self.total_steps
        eta = format_eta((total - step) / rate) if rate else "?"
        log.info(
            "step %d/%s loss %.4f %.1f steps/s %.0f examples/s eta %s",
            step,
            total,
            loss,
            rate,
            rate * batch,
            eta,
        )
        # Threads and RSS with every logged step: a leak shows in metrics.jsonl long before
        # it kills the process.
        values = {"loss": loss, "steps_per_s": round(rate, 3), **process_usage()}
        values["total_steps"] = total  # with train.epochs only the worker knows it: status reads it
        if self._last_save_seconds is not None:
            values["save_s"] = round(self._last_save_seconds, 3)
        self.record(step, values)

    def record(self, step: int, values: dict[str, float], group: str | None = None) -> None:
        """Chief only: one line of metrics.jsonl and TensorBoard scalars (``group/name``)."""
        self._records.record(step, values, group)

    def keepalive(self, what: str = "progress") -> None:
        """Tell the watchdog that training moves. :meth:`step_done` does it for every step; a
        loop with long phases between steps (evaluation, a slow save) calls it within each
        ``train.stall_timeout_seconds``, or the rank is taken as stuck."""
        if self._watchdog is not None:
            self._watchdog.beat(what)

    def finish(self, step: int, results: dict[str, float] | None = None) -> None:
        """Mark the run complete (the chief writes DONE)."""
        self.wait_for_saves()  # the last checkpoint on disk before DONE says so
        if self._watchdog is not None:
            self._watchdog.stop()
        if self.spec.is_chief:
            write_atomic(self.run.done, json.dumps({"step": step, "eval": results or {}}) + "\n")
            log.info("training complete: %s", self.run.done)
        sys.stdout.flush()

    def await_stall_verdict(self) -> None:
        """When a peer stopped answering while this rank, too, made no progress for half of
        ``train.stall_timeout_seconds`` or more, its own watchdog most likely ended it (every
        rank's sees a stuck rank at about the same moment): let this rank's watchdog end it
        the same way (exit 124, the run's end ``stalled``). Returns at once otherwise."""
        if self._watchdog is not None:
            self._watchdog.await_verdict()

    def close(self) -> None:
        """Leave together, on every rank, after :meth:`finish` or :class:`Preempted`: one last
        collective, entered only after every other one, so no rank leaves while a peer still
        needs it (the chief's checkpoint and records included). A peer that passed it first
        and left makes it fail here: harmless, said in one line. The caller then leaves at
        once (:func:`hpctf.compute.process.leaving.leave`)."""
        if self._watchdog is not None:
            self._watchdog.stop()
        started = time.perf_counter()
        try:
            self._gather(0)
        except tf.errors.OpError as exc:
            log.info("a peer left before the last barrier: %s", str(exc).strip().splitlines()[0])
        log.info("all ranks finished; leaving (barrier %.2f s)", time.perf_counter() - started)
