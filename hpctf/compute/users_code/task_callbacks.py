"""Keras callbacks in hpctf's own loop: ``Task(callbacks=[...])`` with Keras's protocol.

What ``model.fit`` would call, and when, in the built-in loop:

- ``on_train_begin`` once per start (a resumed run starts again: a callback's own state, such
  as EarlyStopping's patience, begins afresh; the model and optimizer come from the
  checkpoint); ``on_train_end`` once training is complete or stopped;
- ``on_epoch_begin(epoch)`` / ``on_epoch_end(epoch, logs)``: an epoch is one pass over the
  training data with ``train.epochs``; with ``train.steps``, the steps between evaluations
  (``train.eval_every_steps``), else the whole run. ``logs`` hold ``loss`` (the epoch's mean
  training loss) and, when the Task has eval_data, ``val_loss`` and ``val_<metric>`` from an
  evaluation at the epoch's end, reduced across workers;
- ``on_train_batch_begin/end(batch, logs)``, only when a callback overrides them (the loss is
  then read on the host at every step, as Keras does); ``logs["loss"]`` is the step's loss.

``model.stop_training`` (EarlyStopping, TerminateOnNaN, a callback of the user's) ends the run
at that step: it is saved and marked done. The logs every callback sees are the same on every
rank (reduced across workers), so Keras's callbacks decide the same everywhere; a callback of
the user's that stops training must decide from them too, or the ranks part ways.

Callbacks run on every rank, but for those whose effect is a file (CSVLogger, ModelCheckpoint):
those run on the chief only, as the chief alone writes the run's files. Each call runs with the
run directory as the chief's working directory (a scratch directory of the rank's own on the
others), so ``ModelCheckpoint("best.keras")`` lands in the run, never where ``hpctf submit``
ran; the worker's own working directory is back as it was between the calls.

A callback that compares a metric (ModelCheckpoint, EarlyStopping, ReduceLROnPlateau with
``monitor="val_accuracy"`` and ``mode="auto"``) learns whether it is maximised as under
``fit``: from the Task's metric (:func:`hpctf.compute.users_code.compile_style.
metric_directions`), since hpctf never compiles the model that Keras would ask.

Callbacks that do what hpctf does already are refused in one line: BackupAndRestore (hpctf
resumes from its own checkpoints), TensorBoard (hpctf writes the run's events) and
ProgbarLogger (the rank log).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras

from hpctf.compute.users_code import attribution as user_code
from hpctf.core.errors import UserError

log = logging.getLogger("hpctf.worker")

_CHIEF_ONLY = (keras.callbacks.CSVLogger, keras.callbacks.ModelCheckpoint)
_REFUSED = {
    keras.callbacks.BackupAndRestore: "hpctf resumes from the run's own checkpoints",
    keras.callbacks.TensorBoard: "hpctf writes TensorBoard events to the run's tensorboard/",
    keras.callbacks.ProgbarLogger: "hpctf logs progress to each rank's log",
}
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


class ModelView:
    """What a callback sees as ``self.model``: the Task's model, with the Task's optimizer as
    ``model.optimizer`` (ReduceLROnPlateau sets its learning rate) and ``stop_training``; the
    model itself is not changed (its checkpoint stays as it was)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "stop_training", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_model"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("optimizer", "stop_training"):
            object.__setattr__(self, name, value)
        else:
            setattr(object.__getattribute__(self, "_model"), name, value)


def _overrides(callback: Any, method: str) -> bool:
    return getattr(type(callback), method, None) is not getattr(keras.callbacks.Callback, method)


class TaskCallbacks:
    """The Task's callbacks, called as ``model.fit`` would call them (see the module)."""

    def __init__(
        self,
        callbacks: Sequence[Any],
        model: Any,
        optimizer: Any,
        is_chief: bool,
        total: int,
        steps_per_epoch: int,
        run_dir: Path | None = None,
        directions: Mapping[str, str] | None = None,
    ) -> None:
        """``run_dir``: the chief's working directory during each call (None: the worker's
        own); ``directions``: the Task's metrics' (``mode="auto"`` callbacks)."""
        if isinstance(callbacks, keras.callbacks.Callback) or not isinstance(
            callbacks, list | tuple
        ):
            raise UserError(
                "Task callbacks: give a list of keras.callbacks.Callback objects, e.g. "
                "[keras.callbacks.EarlyStopping(patience=3)]"
            )
        chosen = []
        for callback in callbacks:
            if not isinstance(callback, keras.callbacks.Callback):
                raise UserError(
                    f"Task callbacks: {type(callback).__name__} is not a "
                    "keras.callbacks.Callback; subclass it, or use keras.callbacks.LambdaCallback"
                )
            for kind, why in _REFUSED.items():
                if isinstance(callback, kind):
                    raise UserError(f"Task callbacks: leave out {kind.__name__}: {why}")
            if is_chief or not isinstance(callback, _CHIEF_ONLY):
                chosen.append(callback)
        self.callbacks = chosen
        self.model = ModelView(model, optimizer)
        self.steps_per_epoch = max(1, steps_per_epoch)
        epochs = math.ceil(total / self.steps_per_epoch)
        for callback in chosen:
            callback.set_model(self.model)
            callback.set_params({"epochs": epochs, "steps": self.steps_per_epoch, "verbose": 0})
            monitor_mode(callback, directions or {})
        self.directory = run_dir
        if run_dir is not None and not is_chief and chosen:
            self.directory = Path(tempfile.mkdtemp(prefix="hpctf-callbacks-"))  # the rank's tmp
        self.batch_hooks = any(_overrides(c, m) for c in chosen for m in _BATCH_HOOKS)
        self._epoch_loss: Any = 0.0
        self._epoch_steps = 0

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def _call(self, method: str, *args: Any) -> None:
        with working_directory(self.directory):
            for callback in self.callbacks:
                what = f"callback {type(callback).__name__}.{method}"
                user_code.call(what, getattr(callback, method), *args)

    @property
    def stop(self) -> bool:
        return bool(self.model.stop_training)

    def epoch_of(self, step: int) -> int:
        """The 0-based epoch that ``step`` (1-based) belongs to."""
        return (step - 1) // self.steps_per_epoch

    def epoch_ends(self, step: int) -> bool:
        return step % self.steps_per_epoch == 0

    def train_begin(self, start: int) -> None:
        self._call("on_train_begin", {})
        if start % self.steps_per_epoch:  # resumed inside an epoch: it goes on
            self._call("on_epoch_begin", self.epoch_of(start + 1), {})

    def step_begin(self, step: int) -> None:
        if (step - 1) % self.steps_per_epoch == 0:
            self._epoch_loss, self._epoch_steps = 0.0, 0
            self._call("on_epoch_begin", self.epoch_of(step), {})
        if self.batch_hooks:
            self._call("on_train_batch_begin", (step - 1) % self.steps_per_epoch, {})

    def step_end(self, step: int, loss: Any) -> None:
        """After the step: the epoch's loss summed on the device (no wait for the step), and
        the batch hooks when a callback has them."""
        self._epoch_loss = self._epoch_loss + loss
        self._epoch_steps += 1
        if self.batch_hooks:
            logs = {"loss": float(loss)}
            self._call("on_train_batch_end", (step - 1) % self.steps_per_epoch, logs)

    def epoch_end(self, step: int, results: dict[str, float] | None) -> None:
        """End the epoch of ``step`` (at its last step, or earlier when training stops)."""
        logs: dict[str, float] = {}
        if self._epoch_steps:
            logs["loss"] = float(self._epoch_loss) / self._epoch_steps
        logs.update({f"val_{name}": value for name, value in (results or {}).items()})
        self._call("on_epoch_end", self.epoch_of(step), logs)
        self._epoch_loss, self._epoch_steps = 0.0, 0

    def train_end(self, logs: dict[str, float]) -> None:
        self._call("on_train_end", logs)


@contextlib.contextmanager
def working_directory(path: Path | None) -> Iterator[None]:
    """``path`` as the process's working directory inside the block (None: unchanged)."""
    if path is None:
        yield
        return
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def monitor_mode(callback: Any, directions: Mapping[str, str]) -> None:
    """A Keras 3 monitoring callback left at ``mode="auto"`` gets ``"max"`` or ``"min"`` from
    the Task's metric it monitors, where Keras would read the compiled model's metrics
    (``MonitorCallback._set_monitor_op``, keras/src/callbacks/monitor_callback.py, run at the
    first use); ``loss`` and unknown metrics are left to Keras."""
    monitor = getattr(callback, "monitor", None)
    if getattr(callback, "mode", None) != "auto" or not isinstance(monitor, str):
        return
    if getattr(callback, "monitor_op", None) is not None:  # decided already (older Keras)
        return
    direction = directions.get(monitor.removeprefix("val_"))
    if direction is not None:
        callback.mode = "max" if direction == "up" else "min"
