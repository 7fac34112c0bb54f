"""Chief-only checkpoints on the shared filesystem, verified before they are trusted.

Saving under MultiWorkerMirroredStrategy runs collectives, so every worker must save; the
non-chief workers save into a node-local throwaway directory that is removed at once (the
pattern of tensorflow.org/tutorials/distribute/multi_worker_with_ctl). A checkpoint becomes the
latest only once complete: TF writes the data and index files first and then replaces the
``checkpoint`` state file. At start every worker takes the newest checkpoint that reads back
whole (each tensor's CRC is checked on read) and falls back to older ones, saying why.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import tensorflow as tf

from hpctf.cluster import ClusterSpec

log = logging.getLogger("hpctf.worker")


def verify(path: str) -> None:
    """Read every tensor of checkpoint ``path``; raises if any file is missing or damaged."""
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_dtype_map():
        reader.get_tensor(name)


class Checkpointer:
    """Saves every ``every_steps`` and restores the newest checkpoint that is whole."""

    def __init__(
        self, checkpoint: tf.train.Checkpoint, directory: Path, spec: ClusterSpec, keep: int
    ) -> None:
        self._checkpoint = checkpoint
        self._directory = directory
        self._task_index = spec.task_index
        self._manager = (
            tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=keep)
            if spec.is_chief
            else None
        )

    def candidates(self) -> list[str]:
        """Checkpoints listed in the chief's directory, newest first."""
        state = tf.train.get_checkpoint_state(str(self._directory))
        if state is None:
            return []
        return list(reversed(state.all_model_checkpoint_paths))

    def restore_latest(self) -> str | None:
        """Restore from the newest whole checkpoint; return its path, or None to start at 0."""
        for path in self.candidates():
            try:
                verify(path)
                self._checkpoint.restore(path).assert_existing_objects_matched()
            # TF's reader raises IndexError or RuntimeError on truncated data, OpError on bad
            # CRCs or missing files, AssertionError when the objects do not match.
            except (tf.errors.OpError, ValueError, AssertionError, IndexError, RuntimeError) as exc:
                reason = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
                log.warning("checkpoint %s is unusable (%s); trying the one before", path, reason)
                continue
            return path
        return None

    def save(self, step: int) -> None:
        if self._manager is not None:
            log.info("checkpoint %s", self._manager.save(checkpoint_number=step))
            return
        throwaway = tempfile.mkdtemp(prefix=f"hpctf-worker{self._task_index}-ckpt-")
        try:
            tf.train.CheckpointManager(self._checkpoint, throwaway, max_to_keep=1).save(
                checkpoint_number=step
            )
        finally:
            shutil.rmtree(throwaway, ignore_errors=True)
