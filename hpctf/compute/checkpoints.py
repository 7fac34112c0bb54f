"""Chief-only checkpoints on the shared filesystem, verified, and restored at one agreed step.

Saving under MultiWorkerMirroredStrategy runs collectives, so every worker must save; the
non-chief workers save into a node-local throwaway directory that is removed at once (the
pattern of tensorflow.org/tutorials/distribute/multi_worker_with_ctl). A checkpoint becomes the
latest only once complete: TF writes the data and index files first and then replaces the
``checkpoint`` state file.

At start the ranks agree on one checkpoint (:func:`agree_on_step`): the newest that every rank
lists and reads back whole (each tensor's CRC is checked on read). Each rank deciding alone is
not enough: a rank with a stale view of a parallel filesystem (client-side metadata caching on
Lustre or GPFS) would restore an older step than the others, and the replicas would train on
diverged weights, or call different collectives.
"""

from __future__ import annotations

import errno
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import tensorflow as tf

from hpctf.compute.cluster import ClusterSpec
from hpctf.core.errors import EnvironmentProblem, UserError

log = logging.getLogger("hpctf.worker")

_STEP_RE = re.compile(r"-(\d+)$")
NONE = -1  # "no checkpoint" in the gathered step lists


def verify(path: str) -> None:
    """Read every tensor of checkpoint ``path``; raises if any file is missing or damaged."""
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_dtype_map():
        reader.get_tensor(name)


def agree_on_step(
    listed: Mapping[int, str],
    readable: Callable[[str], bool],
    gather: Callable[[int], Sequence[int]],
    directory: str,
) -> int | None:
    """The newest checkpoint step that every rank lists and can read, or None for none.

    ``listed`` maps step to path as this rank sees the directory; ``readable`` checks one path
    (called at most once per path); ``gather`` is a collective returning every rank's value.
    Every rank must call this with its own view; all get the same answer. Each round proposes
    the smallest of the ranks' newest readable steps below the last failed proposal, then
    checks that every rank can read it, so the rounds end after at most ``len(listed) + 1``
    proposals. If some rank could read a checkpoint but no step is common to all, the ranks
    see different directories: a UserError, never a silent restart from step 0.
    """
    verdicts: dict[int, bool] = {}

    def ok(step: int) -> bool:
        if step not in verdicts:
            verdicts[step] = step in listed and readable(listed[step])
        return verdicts[step]

    def newest_readable(bound: float) -> int:
        return next((s for s in sorted(listed, reverse=True) if s <= bound and ok(s)), NONE)

    bound: float = float("inf")
    first: Sequence[int] | None = None
    while True:
        proposals = gather(newest_readable(bound))
        first = proposals if first is None else first
        proposal = min(proposals)
        if proposal == NONE:
            break
        if min(gather(1 if ok(proposal) else 0)) == 1:
            return proposal
        bound = proposal - 1
    if max(first) != NONE:
        raise UserError(
            f"the ranks see different checkpoints in {directory} (newest readable per rank: "
            f"{', '.join(str(s) if s != NONE else 'none' for s in first)}) and none is "
            "readable by all: is the run directory on a filesystem every node shares? "
            "(the site's runs_root)"
        )
    return None


def step_of(path: str) -> int:
    match = _STEP_RE.search(path)
    if not match:
        raise ValueError(f"not a numbered checkpoint: {path}")
    return int(match.group(1))


class Checkpointer:
    """Saves every ``every_steps`` and restores the checkpoint all ranks agree on."""

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

    def listed(self) -> dict[int, str]:
        """Checkpoints listed in the chief's directory as this rank sees it, by step."""
        state = tf.train.get_checkpoint_state(str(self._directory))
        if state is None:
            return {}
        return {step_of(path): path for path in state.all_model_checkpoint_paths}

    def restore_agreed(self, gather: Callable[[int], Sequence[int]]) -> str | None:
        """Restore the checkpoint every rank agrees on; return its path, or None to start at 0.

        A collective: every rank calls it once, at the same point.
        """
        listed = self.listed()
        step = agree_on_step(listed, _readable, gather, str(self._directory))
        if step is None:
            return None
        path = listed[step]
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        except AssertionError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
            raise UserError(
                f"checkpoint {path} does not match the model and optimizer ({first}); "
                "resume with the code that wrote it, or start a new run"
            ) from None
        return path

    def save(self, step: int) -> str | None:
        """Save ``step``; returns the path on the chief, None on the other ranks.

        A filesystem that refuses the chief's save (full, over quota, read-only) is an
        EnvironmentProblem, in one line; the newest complete checkpoint stays the latest.
        """
        if self._manager is not None:
            try:
                return str(self._manager.save(checkpoint_number=step))
            except (tf.errors.ResourceExhaustedError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in _REFUSED:
                    raise  # not the filesystem's word: ours to report
                raise self._save_failed(step, exc) from exc
        throwaway = tempfile.mkdtemp(prefix=f"hpctf-worker{self._task_index}-ckpt-")
        try:
            tf.train.CheckpointManager(self._checkpoint, throwaway, max_to_keep=1).save(
                checkpoint_number=step
            )
        finally:
            shutil.rmtree(throwaway, ignore_errors=True)
        return None

    def _save_failed(self, step: int, exc: BaseException) -> EnvironmentProblem:
        """The error for a save the filesystem refused, after removing what it left.

        TensorFlow writes ``ckpt-N_temp/`` first and lists ``ckpt-N`` in the ``checkpoint``
        state file only after the rename, so a failed save is never taken as the latest; on
        ENOSPC it removes its partial data file but leaves the empty temporary directory
        (measured, TF 2.21: ``ResourceExhaustedError ... No space left on device [Op:SaveV2]``).
        """
        for leftover in self._directory.glob(f"ckpt-{step}_temp*"):
            shutil.rmtree(leftover, ignore_errors=True)
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        cause = said.rsplit("; ", 1)[-1].removesuffix(" [Op:SaveV2]")  # TF's: "<path>; <errno>"
        if isinstance(exc, OSError) and exc.strerror:
            cause = exc.strerror
        kept = max(self.listed(), default=None)
        return EnvironmentProblem(
            f"cannot save the checkpoint of step {step} in {self._directory}: {cause}; "
            + (f"the checkpoint of step {kept} is kept" if kept is not None else "none is kept")
            + f": free space there, then hpctf resubmit {self._directory.parent}"
        )


# What a filesystem says when it takes no more: full, over quota, read-only.
_REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _readable(path: str) -> bool:
    """Whether ``path`` reads back whole; logs why not."""
    try:
        verify(path)
    # TF's reader raises IndexError or RuntimeError on truncated data, OpError on bad CRCs or
    # missing files.
    except (tf.errors.OpError, ValueError, IndexError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("checkpoint %s is unusable (%s); trying the one before", path, reason)
        return False
    return True
