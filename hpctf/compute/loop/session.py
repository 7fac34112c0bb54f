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
            if step % 100 == 0:
                session.evaluated(step, my_evaluation())  # records; a search may prune here
        session.finish(total)

The protocol itself (saves, the preemption vote, pruning, the watchdog, the records) is
:class:`hpctf.compute.loop.control.TrainingControl`'s; a Session is its adapter for loops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import keras

from hpctf.api import DataSource
from hpctf.compute.cluster.joining import Connection, connect
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.loop.cadence import Cadence, steps_for_epochs
from hpctf.compute.loop.control import Parts, Pruned, TrainingControl
from hpctf.compute.loop.data import cardinality, evaluation_dataset, plan_shards, training_input
from hpctf.compute.loop.preemption import PreemptionWatch, make_gather
from hpctf.compute.loop.step_flags import StepFlags
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.process import startup_clock
from hpctf.compute.records.chief_records import ChiefRecords
from hpctf.core.errors import UserError
from hpctf.core.run.rundir import RunDir, write_atomic
from hpctf.core.settings.config import Checkpoint, ResolvedConfig
from hpctf.core.settings.train import Train

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
            parts = Parts(
                connection.strategy,
                gather,
                preemption,
                watchdog,
                # After the strategy too: TensorBoard's writer starts TensorFlow's context.
                ChiefRecords(run, spec.is_chief, config),
            )
            control = _control(settings, checkpoint, run, spec, parts, warning_seconds)
            yield Session(control, connection)
    finally:
        if watchdog is not None:
            watchdog.stop()


def _control(
    settings: Train,
    checkpoint: Checkpoint,
    run: RunDir,
    spec: ClusterSpec,
    parts: Parts,
    warning_seconds: int | None,
) -> TrainingControl:
    """The step protocol of this rank over ``parts``, at the cadence the settings ask for."""
    # The last step is known from train.steps; with train.epochs once distribute() has counted
    # the data.
    cadence = Cadence(
        settings.log_every_steps,
        checkpoint.every_steps,
        settings.steps,
        settings.restart_every_steps,
    )
    return TrainingControl(
        settings,
        checkpoint,
        run,
        spec,
        parts,
        cadence=cadence,
        warning_seconds=warning_seconds,
        examples_per_step=settings.global_batch_size,
    )


class Session:
    """One rank's share of a run: strategy, checkpoints, data position, records, signals.

    Made by :func:`open_session`, which owns the parts' lifetimes; the step protocol is its
    :class:`~hpctf.compute.loop.control.TrainingControl`'s.
    """

    def __init__(self, control: TrainingControl, connection: Connection) -> None:
        self._control = control
        self.settings = control.settings
        self.global_batch_size: int = control.settings.global_batch_size or 0
        self.run = control.run
        self.spec = control.spec
        self.strategy = connection.strategy
        self.precision_policy = connection.precision_policy
        startup_clock.mark("session")  # the watchdog, the preemption watch, the records

    @property
    def control(self) -> TrainingControl:
        """The step protocol this session adapts (hpctf's own loops use it directly)."""
        return self._control

    @property
    def total_steps(self) -> int:
        """The run's last step: ``train.steps``, or with ``train.epochs`` the epochs times the
        full global batches of the data :meth:`distribute` was given (UserError before)."""
        total = self._control.cadence.total
        if total is None:
            raise UserError(
                "train.epochs: the session learns the last step from the data given to "
                "session.distribute(...); call it first, or give train.steps"
            )
        return total

    # --- checkpoints and data --------------------------------------------------------------

    def track(self, **objects: Any) -> int:
        """Checkpoint ``objects`` (model, optimizer, ...) from now on; restore the newest whole
        checkpoint into them; return the step to continue after (0 for a fresh run)."""
        if self.precision_policy == "mixed_float16" and not any(
            isinstance(o, keras.optimizers.LossScaleOptimizer) for o in objects.values()
        ):
            log.warning(
                "mixed_float16 without loss scaling: small gradients underflow to zero; wrap "
                "the optimizer with hpctf.compute.cluster.joining.with_loss_scaling(optimizer, "
                "session.precision_policy)"
            )
        return self._control.track(objects)

    def step_flags(self) -> StepFlags:
        """The flags for a step that carries the warnings in its own reduction (step_flags);
        :meth:`step_done` agrees without a collective from now on. Every rank calls it."""
        flags = StepFlags()
        self._control.preemption.carry(flags, self.strategy.num_replicas_in_sync)
        return flags

    @property
    def checkpoint_every_steps(self) -> int | None:
        """checkpoint.every_steps: :meth:`step_done` saves the steps it divides (None: by time
        only, checkpoint.every_seconds)."""
        return self._control.cadence.save_every

    @property
    def last_saved_step(self) -> int | None:
        """The step this rank last saved (or restored), None before :meth:`track`."""
        return self._control.saved_step

    @property
    def start_step(self) -> int:
        return self._control.restored_step

    def save(self, step: int) -> None:
        """Save a checkpoint of ``step``; every rank must call it (collectives inside)."""
        self._control.save(step)

    def equalize(self) -> None:
        """Make BatchNormalization's statistics, which each replica updates from its own shard,
        the mean over every replica, on every rank (a collective: every rank calls it). Each
        save does it; call it before an evaluation of your own, so that every rank evaluates
        the model the checkpoint holds."""
        self._control.equalize()

    def wait_for_saves(self) -> None:
        """Return once no checkpoint is being written (``checkpoint.asynchronous``)."""
        self._control.wait_for_saves()

    def distribute(self, source: DataSource, shuffle_buffer: int = 10_000) -> Any:
        """An iterator over ``source``, sharded (FILE or DATA, logged), batched to the global
        batch, and positioned after the step that :meth:`track` restored."""
        control = self._control
        if control.cadence.total is None:
            total = steps_for_epochs(self.settings, cardinality(source), self.global_batch_size)
            control.cadence = dataclasses.replace(control.cadence, total=total)
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

    # --- the loop's hooks ------------------------------------------------------------------

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
        self._control.step_done(step, None if loss is None else {"loss": loss})

    def next_due(self, step: int) -> int:
        """The first step after ``step`` that :meth:`step_done` logs, saves or agrees at: a
        loop may run the steps up to it in one call."""
        return self._control.next_due(step)

    def evaluated(self, step: int, results: Mapping[str, float]) -> None:
        """Call on every rank after an evaluation of your own at ``step``: the results are
        recorded (group ``eval``, what ``hpctf status`` shows and a search reads); in a search's
        trial they are told to its study, and when its pruner stops the trial every rank saves
        ``step`` and raises :class:`~hpctf.compute.loop.control.Pruned` (the run ends
        ``pruned``, exit 0), at the same step. Before the last step only: the last evaluation is
        told, never pruned."""
        control = self._control
        values = {name: float(value) for name, value in results.items()}
        control.records.record(step, values, "eval")
        ask = step != control.cadence.total
        vote = control.report(step, values, ask)
        if ask and control.agree_to_prune(vote):
            control.prune(step)
            raise Pruned()

    def record(self, step: int, values: dict[str, float], group: str | None = None) -> None:
        """Chief only: one line of metrics.jsonl and TensorBoard scalars (``group/name``)."""
        self._control.records.record(step, values, group)

    def keepalive(self, what: str = "progress") -> None:
        """Tell the watchdog that training moves. :meth:`step_done` does it for every step; a
        loop with long phases between steps (evaluation, a slow save) calls it within each
        ``train.stall_timeout_seconds``, or the rank is taken as stuck."""
        self._control.keepalive(what)

    def finish(self, step: int, results: dict[str, float] | None = None) -> None:
        """Mark the run complete (the chief writes DONE)."""
        self.wait_for_saves()  # the last checkpoint on disk before DONE says so
        self._control.stop_watching()
        if self.spec.is_chief:
            write_atomic(self.run.done, json.dumps({"step": step, "eval": results or {}}) + "\n")
            log.info("training complete: %s", self.run.done)
        sys.stdout.flush()

    def await_stall_verdict(self) -> None:
        """When a peer stopped answering while this rank, too, made no progress for half of
        ``train.stall_timeout_seconds`` or more, its own watchdog most likely ended it (every
        rank's sees a stuck rank at about the same moment): let this rank's watchdog end it
        the same way (exit 124, the run's end ``stalled``). Returns at once otherwise."""
        self._control.await_stall_verdict()

    def close(self) -> None:
        """Leave together, on every rank, after :meth:`finish` or :class:`Preempted`: one last
        collective, entered only after every other one, so no rank leaves while a peer still
        needs it (the chief's checkpoint and records included). A peer that passed it first
        and left makes it fail here: harmless, said in one line. The caller then leaves at
        once (:func:`hpctf.compute.process.leaving.leave`)."""
        self._control.stop_watching()
        self._control.barrier()
