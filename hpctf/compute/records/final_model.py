"""The trained model at the end of a Task run: ``RUN/model.keras`` (``train.save_model``), and
with ``train.export_savedmodel`` a TensorFlow SavedModel in ``RUN/saved_model``.

Every rank saves, as with checkpoints (a save under MultiWorkerMirroredStrategy may read
variables through collectives, which every rank must enter): the chief into the run directory,
the others into a throwaway directory removed at once. The chief writes each one beside its
place and moves it there (``os.replace``), so a reader never finds half a model; DONE is
written after it (:meth:`hpctf.compute.loop.session.Session.finish`).

Load it with ``keras.models.load_model("RUN/model.keras")`` (with ``custom_objects`` for your
own layers); it is not compiled (hpctf never compiles the Task's model): compile it with the
Task's loss and metrics to ``evaluate``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.train import Train

log = logging.getLogger("hpctf.worker")

MODEL_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


def save_final_model(model: Any, run: RunDir, settings: Train, is_chief: bool) -> list[Path]:
    """Save ``model`` as the settings ask; the paths the chief wrote (none elsewhere)."""
    if not settings.save_model:
        return []
    where = run.path if is_chief else Path(tempfile.mkdtemp(prefix="hpctf-final-model-"))
    written: list[Path] = []
    try:
        written.append(_save_keras(model, where))
        if settings.export_savedmodel:
            written.append(_export(model, where))
    except Exception as exc:
        # A model Keras cannot serialize (a custom layer without get_config, ...): the run's
        # checkpoints still hold it (README: "The trained model"). Said, with the traceback.
        text = " ".join(str(exc).split())[:300]
        log.warning("the trained model was not saved (%s: %s); the run's checkpoints hold it",
                    type(exc).__name__, text, exc_info=True)  # fmt: skip
    finally:
        if not is_chief:
            shutil.rmtree(where, ignore_errors=True)
    if not is_chief:
        return []
    log.info("trained model saved: %s", ", ".join(str(p) for p in written))
    return written


def _save_keras(model: Any, where: Path) -> Path:
    target = where / MODEL_FILE
    partial = where / f".partial-{os.getpid()}.{MODEL_FILE}"  # Keras wants the .keras suffix
    model.save(partial)
    os.replace(partial, target)
    return target


def _export(model: Any, where: Path) -> Path:
    target = where / SAVED_MODEL_DIR
    partial = where / f".partial-{os.getpid()}.{SAVED_MODEL_DIR}"
    shutil.rmtree(partial, ignore_errors=True)
    model.export(str(partial), verbose=False)
    if target.exists():  # an earlier end of this run (extended since): replaced whole
        shutil.rmtree(target)
    os.replace(partial, target)
    return target
