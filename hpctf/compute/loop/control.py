"""The step protocol, once, for every way a researcher trains.

hpctf's built-in loop (:mod:`hpctf.compute.loop.training`), a user's own loop given a
:class:`hpctf.compute.loop.session.Session`, and ``model.fit`` with ``hpctf.keras.callbacks()``
(:class:`hpctf.compute.script.fit.FitCallback`) are thin adapters on one
:class:`TrainingControl` per rank, which owns what a step calls for:

- checkpoints: the agreed restore, saves by step and by time (``checkpoint.every_seconds``,
  decided at an agreement so every rank saves one step), asynchronous writes, the slow-save
  warning, and the replica-local state made equal before each save
  (:class:`hpctf.compute.loop.replica_state.ReplicaState`);
- the preemption vote (:class:`hpctf.compute.loop.preemption.PreemptionWatch`): a warning to
  any rank is saved by every rank at one agreed step, recorded by the chief, then exit 75;
  a planned restart (``train.restart_every_steps``) the same way;
- a search trial's evaluations told to its study and the pruning vote
  (:mod:`hpctf.compute.loop.pruning`): every rank prunes at one step;
- the stall watchdog, fed by every step; a lost peer as the environment's fault
  (:func:`peer_lost`: exit 3, the rank and host named);
- the progress line and the chief's records (metrics.jsonl, TensorBoard).

The adapters only translate their hooks (a step of hpctf's loop, ``session.step_done``, a
Keras batch's end) into :meth:`TrainingControl.step_done` and the rest.
``tests/test_training_control.py`` fails if another module defines a part of this protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import tensorflow as tf

from hpctf.compute.cluster.peers import PeerLost, lost_peer
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat.keras_variables import model_weights, random_state_variables
from hpctf.compute.doctor.procstat import process_usage
from hpctf.compute.loop.cadence import AgreementClock, Cadence, format_eta, save_outlasts_warning
from hpctf.compute.loop.preemption import Preempted, PreemptionWatch, leaving_words
from hpctf.compute.loop.pruning import TrialPruning, evaluation_index, trial_pruning
from hpctf.compute.loop.replica_state import ReplicaState
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.compute.process import startup_clock
from hpctf.compute.process.leaving import exit_later
from hpctf.compute.records.checkpoints import Checkpointer, checkpoint_of
from hpctf.compute.records.chief_records import ChiefRecords
from hpctf.core.errors import PREEMPTED_EXIT
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.config import Checkpoint
from hpctf.core.settings.train import Train

log = logging.getLogger("hpctf.worker")


class Pruned(SystemExit):
    """Raised on every rank after a search pruned the trial at one agreed step, saved: the run
    ends ``pruned`` (exit 0), finished, never requeued."""

    def __init__(self) -> None:
        super().__init__(0)


@dataclasses.dataclass
class Parts:
    """What a :class:`TrainingControl` runs on, made by whoever joined the cluster."""

    strategy: Any
    gather: Callable[[int], list[int]]  # every replica's integer, on every rank (a collective)
    preemption: PreemptionWatch
    watchdog: ProgressWatchdog | None
    records: ChiefRecords


class TrainingControl:
    """One rank's step protocol (the module's docstring); every rank calls the same methods
    at the same steps."""

    def __init__(
        self,
        settings: Train,
        checkpoint: Checkpoint,
        run: RunDir,
        spec: ClusterSpec,
        parts: Parts,
        *,
        cadence: Cadence,
        warning_seconds: int | None,
        examples_per_step: int | None = None,
    ) -> None:
        self.settings = settings
        self.run = run
        self.spec = spec
        self.cadence = cadence
        self.strategy = parts.strategy
        self.gather = parts.gather
        self.preemption = parts.preemption
        self.records = parts.records
        self._watchdog = parts.watchdog
        self._checkpoint_settings = checkpoint
        self._warning_seconds = warning_seconds
        self._examples_per_step = examples_per_step
        self.clock = AgreementClock(
            settings.preemption_check_every_steps, warning_seconds, checkpoint.every_seconds
        )
        self.pruning: TrialPruning | None = trial_pruning(run.path, spec.is_chief)
        self._checkpointer: Checkpointer | None = None
        self._replica_state: ReplicaState | None = None
        self._step_variable: Any = None
        self.saved_step: int | None = None  # the step this rank last saved or restored
        self._save_seconds: float | None = None  # the last save, until warned about
        self._last_save_seconds: float | None = None  # the last save, for the records
        self._window = (time.perf_counter(), 0)

    # --- checkpoints -----------------------------------------------------------------------

    def track(self, objects: dict[str, Any], optional: dict[str, Any] | None = None) -> int:
        """Checkpoint ``objects`` (model, optimizer, ...) from now on, with ``optional`` ones,
        the random layers' seed states and every Keras 3 model weight as a list (whatever the
        model's structure: :func:`~hpctf.compute.compat.keras_variables.model_weights`), those
        restored where a checkpoint has them; restore the
        checkpoint every rank agrees on; return its step (0: none)."""
        self._step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        extra = {
            "random_state": random_state_variables(objects),
            "model_weights": model_weights(objects),
            **(optional or {}),
        }
        checkpoint, required = checkpoint_of({"step": self._step_variable, **objects}, extra)
        settings = self._checkpoint_settings
        self._checkpointer = Checkpointer(
            checkpoint,
            self.run.checkpoints,
            self.spec,
            settings.keep,
            settings.asynchronous,
            required=required,
        )
        self._replica_state = ReplicaState(self.strategy, objects)
        restored = self._checkpointer.restore_agreed(self.gather)
        self.keepalive("restore")
        start = int(self._step_variable.numpy())
        startup_clock.mark("restore")
        self.records.resumed(start)  # records of an earlier start past it: superseded
        if restored:
            log.info("resumed from %s at step %d", restored, start)
        else:
            log.info("no checkpoint in %s: starting at step 0", self.run.checkpoints)
        self._window = (time.perf_counter(), start)
        self.clock.restart(start)
        self.saved_step = start
        return start

    @property
    def restored_step(self) -> int:
        """The step the last restore or save set (0 before :meth:`track`)."""
        return 0 if self._step_variable is None else int(self._step_variable.numpy())

    def equalize(self) -> None:
        """Make the replica-local state (BatchNormalization's statistics) equal on every rank:
        before each save and evaluation. Every rank calls it (a collective)."""
        if self._replica_state is not None:
            self._replica_state.equalize()

    def save(self, step: int) -> None:
        """Save a checkpoint of ``step``; every rank must call it (collectives inside)."""
        if self._checkpointer is None:
            raise RuntimeError("call track(...) before saving")
        self._step_variable.assign(step)
        self.keepalive(f"step {step}")
        self.equalize()  # the chief's copy, the one saved, is every rank's
        started = time.perf_counter()
        path = self._checkpointer.save(step)
        self._save_seconds = self._last_save_seconds = time.perf_counter() - started
        self.saved_step = step
        self.clock.saved()
        if path is not None:
            log.info("checkpoint %s (%.2f s)", path, self._save_seconds)
        else:
            log.info("checkpoint of step %d: the chief's copy (%.2f s)", step, self._save_seconds)
        self.keepalive(f"checkpoint of step {step}")

    def wait_for_saves(self) -> None:
        """Return once no checkpoint is being written (``checkpoint.asynchronous``)."""
        if self._checkpointer is not None:
            self._checkpointer.close()

    # --- the step --------------------------------------------------------------------------

    def step_done(self, step: int, values: Mapping[str, float] | None) -> None:
        """After every step (or the last of several run in one call, up to :meth:`next_due`),
        on every rank: the progress line with ``values`` (None: not read this step), a
        checkpoint every ``checkpoint.every_steps`` and at the last step, the agreement
        (:meth:`agree`), a planned restart."""
        self.keepalive(f"step {step}")
        if self._checkpointer is not None:
            self._checkpointer.poll()  # a background save that failed ends the run now
        due = self.cadence.due(step, self.clock.next)
        if values is not None and due.log:
            self.log_progress(step, values)
        if due.save:
            self.save(step)
        if due.agree:
            self.agree(step, saved=due.save)
        if due.restart:  # every rank knows the step: nothing to agree on
            self.leave_for_requeue(step, "restart", journal.record_saved_for_restart)

    def next_due(self, step: int) -> int:
        """The first step after ``step`` that :meth:`step_done` logs, saves or agrees at."""
        return self.cadence.next_due(step, self.clock.next)

    def agree(self, step: int, saved: bool) -> None:
        """The ranks' agreement at ``step``: a save by time when any rank voted for one; on a
        warning to any rank, save (unless ``saved``), record it and raise :class:`Preempted`;
        at the last step, finish instead."""
        clock = self.clock
        signum, slowest, save = self.preemption.agree(clock.step_seconds(step), clock.save_vote())
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
        if step == self.cadence.total:
            log.warning("got %s at the last step: finishing instead of requeuing", name)
            return
        if not saved:
            self.save(step)
        signal_name = name.removeprefix("SIG")  # as the site names it: USR2, TERM
        self.leave_for_requeue(
            step,
            "preempted",
            lambda run, job, at: journal.record_saved_on_warning(run, job, at, signal_name),
        )

    def leave_for_requeue(
        self, step: int, why: str, record: Callable[[RunDir, str, int], object]
    ) -> NoReturn:
        """Every rank has saved ``step``: the chief records it (``record``), then every rank
        raises :class:`Preempted` (exit 75) with its exit bounded. No rank leaves before the
        chief's checkpoint and record: the adapter's last barrier (:meth:`barrier`)."""
        self.wait_for_saves()  # the step on disk before the record says so
        if self.spec.is_chief:
            # The batch script requeues on this record, not on srun's exit status: srun
            # --kill-on-bad-exit may kill a rank that is still exiting after the save.
            record(self.run, self.spec.journal_job, step)
        log.warning("%s", leaving_words(self.run, step, why))
        exit_later(PREEMPTED_EXIT)  # whatever the unwinding tears down (leaving.py)
        raise Preempted()

    def barrier(self) -> None:
        """One collective every rank enters after every other one, so no rank leaves while a
        peer still needs it. A peer that passed it first and left makes it fail: said in one
        line."""
        started = time.perf_counter()
        try:
            self.gather(0)
        except tf.errors.OpError as exc:
            log.info("a peer left before the last barrier: %s", str(exc).strip().splitlines()[0])
        log.info("all ranks finished; leaving (barrier %.2f s)", time.perf_counter() - started)

    # --- evaluations and a search's pruning ------------------------------------------------

    def evaluation(self, step: int) -> int:
        """The index a search counts the evaluation at ``step`` by: the step over
        ``train.eval_every_steps`` (the same after a resume), or the step itself without it."""
        every = self.settings.eval_every_steps
        return evaluation_index(step + every - 1, every) if every else step

    def report(
        self, step: int, results: Mapping[str, float], ask: bool, evaluation: int | None = None
    ) -> bool:
        """A search trial's evaluation at ``step`` (its index ``evaluation``, by default
        :meth:`evaluation`'s) to its study, the chief's part; with ``ask``, the chief's vote to
        prune here (False on the other ranks and off a search)."""
        if self.pruning is None or not results:
            return False
        index = self.evaluation(step) if evaluation is None else evaluation
        return self.pruning.report(step, index, dict(results), ask)

    def agree_to_prune(self, vote: bool) -> bool:
        """Every rank: whether any rank (the chief) voted to prune (one gather, trials only)."""
        return self.pruning is not None and any(self.gather(1 if vote else 0))

    def prune(self, step: int) -> None:
        """Every rank agreed to prune after ``step``: save it on every rank; the chief records
        where the pruner stopped the trial."""
        if self.saved_step != step:
            self.save(step)
        self.wait_for_saves()  # the step on disk before the record says so
        if self.pruning is not None and self.spec.is_chief:
            self.pruning.record(self.run, self.spec.journal_job, step)
        log.info("the search pruned this trial: saved step %d; the run ends pruned", step)

    # --- progress ----------------------------------------------------------------------------

    def log_progress(self, step: int, values: Mapping[str, float]) -> None:
        """The progress line on every rank and, on the chief, its record in metrics.jsonl."""
        now = time.perf_counter()
        started, first = self._window
        rate = (step - first) / max(now - started, 1e-9)
        self._window = (now, step)
        total = self.cadence.total
        shown = " ".join(f"{name} {value:.4f}" for name, value in values.items())
        per_step = self._examples_per_step
        examples = f" {rate * per_step:.0f} examples/s" if per_step else ""
        eta = format_eta((total - step) / rate) if total and rate else "?"
        log.info(
            "step %d/%s %s %.1f steps/s%s eta %s", step, total or "?", shown, rate, examples, eta
        )
        # Threads and RSS with every logged step: a leak shows in metrics.jsonl long before
        # it kills the process.
        record = {**values, "steps_per_s": round(rate, 3), **process_usage()}
        if total:
            record["total_steps"] = total  # with epochs only the worker knows it: status reads it
        if self._last_save_seconds is not None:
            record["save_s"] = round(self._last_save_seconds, 3)
        self.records.record(step, record)

    def keepalive(self, what: str = "progress") -> None:
        """Tell the watchdog that training moves."""
        if self._watchdog is not None:
            self._watchdog.beat(what)

    def stop_watching(self) -> None:
        """The watchdog stopped (training over on this rank)."""
        if self._watchdog is not None:
            self._watchdog.stop()

    def await_stall_verdict(self) -> None:
        """When this rank, too, made no progress for a while, let its own watchdog end it
        (:meth:`ProgressWatchdog.await_verdict`). Returns at once otherwise."""
        if self._watchdog is not None:
            self._watchdog.await_verdict()


# The gRPC statuses of TF's errors when a peer goes away, by the names hpctf.compute.cluster.peers
# uses.
_PEER_LOSS_STATUSES = {
    tf.errors.UNAVAILABLE: "UNAVAILABLE",
    tf.errors.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    tf.errors.ABORTED: "ABORTED",
    tf.errors.CANCELLED: "CANCELLED",
}


def peer_lost(
    exc: BaseException | None, spec: ClusterSpec, control: TrainingControl | None = None
) -> PeerLost | None:
    """The peer that ``exc`` (or the TensorFlow error it was raised from) says stopped
    answering, or None when it is about something else. With ``control``, a rank that stalled
    too lets its own watchdog end it first (every rank's sees a stuck rank at about the same
    moment: the run's end is ``stalled``, not a lost peer)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, tf.errors.OpError):
            code = _PEER_LOSS_STATUSES.get(exc.error_code, type(exc).__name__)
            lost = lost_peer(code, exc.message, spec)
            if lost is not None and control is not None:
                control.await_stall_verdict()
            return lost
        exc = exc.__cause__ or exc.__context__
    return None
