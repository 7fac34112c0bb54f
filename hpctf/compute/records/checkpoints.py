"""Chief-only checkpoints on the shared filesystem, verified, and restored at one agreed step.

Saving under MultiWorkerMirroredStrategy runs collectives, so every worker must save; the
non-chief workers save into a node-local throwaway directory that is removed at once (the
pattern of tensorflow.org/tutorials/distribute/multi_worker_with_ctl). A checkpoint becomes the
latest only once complete: TF writes the data and index files first and then replaces the
``checkpoint`` state file.

Which checkpoints exist is read from the files on disk (:mod:`hpctf.core.run.checkpoint_files`),
never from TensorFlow's ``checkpoint`` state file alone: a damaged state file made TF see no
checkpoint at all, and the run trained from step 0 over intact ones. The chief rewrites a state
file that disagrees with the disk before its CheckpointManager reads it, so rotation
(``checkpoint.keep``) goes on over the checkpoints that are there.

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
from typing import Any

import tensorflow as tf

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat import tensorflow_internals
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import checkpoint_files
from hpctf.core.safe_files import write_atomic

log = logging.getLogger("hpctf.worker")

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
    see different directories: a UserError. If checkpoints are listed but no rank can read
    any, an EnvironmentProblem naming them (the storage lost them; the batch script does not
    requeue it): never a silent restart from step 0 over them.
    """
    verdicts: dict[int, bool] = {}

    def ok(step: int) -> bool:
        if step not in verdicts:
            verdicts[step] = step in listed and readable(listed[step])
        return verdicts[step]

    def newest_readable(bound: float) -> int:
        return next((s for s in sorted(listed, reverse=True) if s <= bound and ok(s)), NONE)

    # A rank with nothing readable proposes NONE - (how many it lists): below NONE when it
    # lists checkpoints it cannot read. The first round then also says whether any rank lists
    # one, so a fresh start (nothing listed anywhere) takes one collective, not two.
    bound: float = float("inf")
    first: Sequence[int] | None = None
    while True:
        newest = newest_readable(bound)
        said = gather(newest if newest != NONE else NONE - len(listed))
        first = said if first is None else first
        proposal = max(min(said), NONE)
        if proposal == NONE:
            break
        if min(gather(1 if ok(proposal) else 0)) == 1:
            return proposal
        bound = proposal - 1
    _none_agreed(first, listed, directory)
    return None


def _none_agreed(first: Sequence[int], listed: Mapping[int, str], directory: str) -> None:
    """After rounds of :func:`agree_on_step` that agreed on no step (``first``: the ranks'
    proposals of the first round): a UserError when some rank could read a checkpoint, an
    EnvironmentProblem when some listed one but none could read any; a fresh start returns."""
    if max(first) > NONE:
        raise UserError(
            f"the ranks see different checkpoints in {directory} (newest readable per rank: "
            f"{', '.join(str(s) if s > NONE else 'none' for s in first)}) and none is "
            "readable by all: is the run directory on a filesystem every node shares? "
            "(the site's runs_root)"
        )
    # Every rank gets here alike (``first`` is the same everywhere): none could read any, and
    # the first round said whether some rank lists checkpoints all the same.
    if min(first) < NONE:
        raise unreadable(listed, directory)


def unreadable(listed: Mapping[int, str], directory: str) -> EnvironmentProblem:
    """The one line for checkpoint files that exist but none of which reads back whole."""
    names = ", ".join(Path(listed[step]).name for step in sorted(listed)) or "those listed"
    run = Path(directory).parent
    return EnvironmentProblem(
        f"no checkpoint in {directory} reads back whole ({names}; the rank log says why): "
        "training from step 0 over them would lose them; restore them from a backup, or "
        f"start again from step 0 with: hpctf resubmit --from-scratch {run}"
    )


def checkpoint_of(
    objects: dict[str, Any], optional: dict[str, Any]
) -> tuple[tf.train.Checkpoint, tf.train.Checkpoint | None]:
    """The checkpoint each save writes (``objects`` and ``optional``), and the part a restore
    must find (None: all of it): ``optional`` objects joined later, and a checkpoint written
    before them still resumes (:class:`Checkpointer`'s ``required``)."""
    optional = {name: value for name, value in optional.items() if value}
    if not optional:
        return tf.train.Checkpoint(**objects), None
    return tf.train.Checkpoint(**objects, **optional), tf.train.Checkpoint(**objects)


class Checkpointer:
    """Saves every ``every_steps`` and restores the checkpoint all ranks agree on."""

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: Path,
        spec: ClusterSpec,
        keep: int,
        asynchronous: bool = False,
        required: tf.train.Checkpoint | None = None,
    ) -> None:
        """``checkpoint`` is what each save writes; ``required``, when given, the part of it a
        restore must find (the rest, such as random layers' seed states that a checkpoint
        written by an earlier hpctf lacks, is restored where the checkpoint has it)."""
        self._checkpoint = checkpoint
        self._required = required
        self._directory = directory
        self._task_index = spec.task_index
        self._manager = None
        if spec.is_chief:
            for name in checkpoint_files.remove_dead_temps(directory):
                log.info("removed %s, left by a save whose writer died", directory / name)
            repair_state_file(directory)
            self._manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=keep)
        # Asynchronous saves (checkpoint.asynchronous): the save copies every variable to host
        # memory in this thread (the only part with collectives, so every rank still runs them
        # in the same order), then TensorFlow writes the copy in a thread of its own while
        # training goes on. Its CheckpointManager lists the checkpoint in the state file only
        # once the write is complete (a write callback); files on disk count only once TF's
        # merge has written the index (:mod:`hpctf.core.run.checkpoint_files`).
        self._options = None
        if asynchronous:
            why = tensorflow_internals.enable_async_saves(checkpoint)
            if why is None:
                self._options = tf.train.CheckpointOptions(
                    experimental_enable_async_checkpoint=True
                )
            else:
                log.warning("asynchronous checkpoints unsupported (%s): saving synchronously", why)
        if self._options is not None and spec.is_chief:
            log.info("checkpoints are written while training goes on (checkpoint.asynchronous)")
        self._in_flight: int | None = None  # the step of a save still being written
        self._throwaway: str | None = None  # a non-chief's, kept while saves may be in flight

    def listed(self) -> dict[int, str]:
        """Checkpoints in the chief's directory as this rank sees its files, by step; a
        directory this rank may not read is an EnvironmentProblem, not "no checkpoint"."""
        try:
            return checkpoint_files.on_disk(self._directory)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot list the checkpoints in {self._directory}: {exc.strerror or exc}"
            ) from exc

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
            status = (self._required or self._checkpoint).restore(path)
            status.assert_existing_objects_matched()
            if self._required is not None:
                # The optional objects (random layers' seeds, fit's running metrics) are in the
                # file but not in ``required``: restored by the whole checkpoint next, so the
                # first restore's "Value in checkpoint could not be found" warnings (one per
                # value, when its status is collected) would be false.
                status.expect_partial()
                self._checkpoint.restore(path).expect_partial()
        except AssertionError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
            raise UserError(
                f"checkpoint {path} does not match the model and optimizer ({first}); "
                "resume with the code that wrote it, or start a new run"
            ) from None
        return path

    def save(self, step: int) -> str | None:
        """Save ``step``; returns the path on the chief, None on the other ranks.

        A filesystem that refuses the chief's save (full, over quota, read-only, permission
        denied) is an EnvironmentProblem, in one line; the newest complete checkpoint stays the
        latest.
        """
        self.wait()  # the save before: written whole, or its failure said in one line
        if self._manager is not None:
            try:
                extra = {"options": self._options} if self._options else {}
                path = str(self._manager.save(checkpoint_number=step, **extra))
            except _FILESYSTEM_ERRORS as exc:
                if _ours(exc):
                    raise
                raise self._save_failed(step, exc) from exc
            self._in_flight = step if self._options else None
            return path
        if self._options is not None:
            # Written in the background: the directory must outlive the write (close()).
            if self._throwaway is None:
                self._throwaway = tempfile.mkdtemp(prefix=f"hpctf-worker{self._task_index}-ckpt-")
            tf.train.CheckpointManager(self._checkpoint, self._throwaway, max_to_keep=1).save(
                checkpoint_number=step, options=self._options
            )
            self._in_flight = step
            return None
        throwaway = tempfile.mkdtemp(prefix=f"hpctf-worker{self._task_index}-ckpt-")
        try:
            tf.train.CheckpointManager(self._checkpoint, throwaway, max_to_keep=1).save(
                checkpoint_number=step
            )
        finally:
            shutil.rmtree(throwaway, ignore_errors=True)
        return None

    def poll(self) -> None:
        """After a step: when a background write has ended, take its outcome now (a failure
        raises as :meth:`wait` does) instead of at the next save. Cheap: no wait, no collective.

        A write that failed on a full disk must end the run within a step: training on, the
        rank logs, journal and metrics would be written to a disk with no room, and the
        one-line error and the run's end record with them (measured on the test cluster: the
        chief's error line and ``ended`` record lost a thousand steps after the failed save).
        """
        if self._in_flight is None:
            return
        if not tensorflow_internals.async_write_pending(self._checkpoint):
            self.wait()

    def wait(self) -> None:
        """Return once no save is being written; a write that failed raises here as
        :meth:`save` would have (a full disk: one line, the checkpoint before kept). Every
        rank calls it where the saved step must be on disk: before the next save, before a
        preemption is recorded, before the run is marked done."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return
        self._checkpoint.sync()
        # TensorFlow keeps a background write's exception and raises it only at the next
        # save; take it now, for the step it belongs to.
        error = tensorflow_internals.take_async_error(self._checkpoint)
        if error is None:
            return
        if self._manager is None:
            raise error  # a non-chief's throwaway copy: not the run's checkpoint
        if isinstance(error, _FILESYSTEM_ERRORS) and not _ours(error):
            raise self._save_failed(step, error) from error
        raise error

    def close(self) -> None:
        """Wait for a save in flight; remove a non-chief's throwaway directory."""
        try:
            self.wait()
        finally:
            if self._throwaway is not None:
                shutil.rmtree(self._throwaway, ignore_errors=True)
                self._throwaway = None

    def _save_failed(self, step: int, exc: BaseException) -> EnvironmentProblem:
        """The error for a save the filesystem refused, after removing what it left.

        TensorFlow writes ``ckpt-N_temp/`` first and lists ``ckpt-N`` in the ``checkpoint``
        state file only after the rename, so a failed save is never taken as the latest; on
        ENOSPC it removes its partial data file but leaves the empty temporary directory
        (measured, TF 2.21: ``ResourceExhaustedError ... No space left on device [Op:SaveV2]``;
        on a read-only mount ``PermissionDeniedError ... ckpt-20_temp; Read-only file system
        [Op:SaveV2]``, nothing left).
        """
        for leftover in self._directory.glob(f"ckpt-{step}_temp*"):
            shutil.rmtree(leftover, ignore_errors=True)
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        cause = said.rsplit("; ", 1)[-1].removesuffix(" [Op:SaveV2]")  # TF's: "<path>; <errno>"
        if isinstance(exc, OSError) and exc.strerror:
            cause = exc.strerror
        try:
            kept = max(self.listed(), default=None)
        except EnvironmentProblem:
            kept = None
        full = isinstance(exc, tf.errors.ResourceExhaustedError) or (
            isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        )
        fix = "free space there" if full else "make it writable for you"
        return EnvironmentProblem(
            f"cannot save the checkpoint of step {step} in {self._directory}: {cause}; "
            + (f"the checkpoint of step {kept} is kept" if kept is not None else "none is kept")
            + f": {fix}, then hpctf resubmit {self._directory.parent}",
            cause_said=True,
        )


_FILESYSTEM_ERRORS = (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError, OSError)
# What a filesystem says when it takes no more: full, over quota, read-only, not ours to write.
_REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _ours(exc: BaseException) -> bool:
    """An OSError that is not the filesystem refusing: hpctf's to report, as a bug."""
    return isinstance(exc, OSError) and exc.errno not in _REFUSED


def repair_state_file(directory: Path) -> None:
    """Rewrite ``directory``'s ``checkpoint`` state file from the files on disk when it is
    damaged, missing or names other checkpoints, so the CheckpointManager (which reads it once,
    when created) rotates the checkpoints that exist instead of orphaning them. The chief's
    job, before any save; a filesystem that refuses is an EnvironmentProblem."""
    try:
        found = checkpoint_files.on_disk(directory)
    except OSError:
        return  # the listing says so, in one line
    if not found:
        return
    state_file = directory / "checkpoint"
    try:
        said = state_file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        said = None
    wanted = checkpoint_files.state_file_text(found)
    if said is not None and _names_in(said) == _names_in(wanted):
        return
    log.warning(
        "checkpoint state file %s is %s; rewritten from the checkpoints on disk (%s)",
        state_file,
        "missing or unreadable" if said is None else "damaged or out of date",
        ", ".join(Path(p).name for p in found.values()),
    )
    try:
        write_atomic(state_file, wanted, mode=None)
    except EnvironmentProblem as exc:
        raise EnvironmentProblem(
            f"cannot rewrite the checkpoint state file {state_file}: {exc.__cause__ or exc}"
        ) from exc


def _names_in(state_text: str) -> tuple[str, set[str]]:
    """The latest and every listed checkpoint name of a state file's text."""
    latest = re.search(r'^model_checkpoint_path: "(?:.*/)?([^"/]*)"$', state_text, re.M)
    listed = re.findall(r'^all_model_checkpoint_paths: "(?:.*/)?([^"/]*)"$', state_text, re.M)
    return (latest.group(1) if latest else "", set(listed))


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
