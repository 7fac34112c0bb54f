"""A checkpoint the filesystem refuses (full, over quota, read-only): one line saying so, the
environment's fault, and the previous checkpoint stays the latest. tests/test_slurm_faults.py
fills a real filesystem under a real Slurm job; here the refusal is TensorFlow's own error."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpctf.core.errors import EnvironmentProblem

pytestmark = pytest.mark.tf


def checkpointer(directory: Path, asynchronous: bool = False) -> Any:
    import tensorflow as tf

    from hpctf.compute.records.checkpoints import Checkpointer

    checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
    spec = SimpleNamespace(task_index=0, is_chief=True)
    return Checkpointer(checkpoint, directory, spec, 3, asynchronous)  # type: ignore[arg-type]


def full_disk_said_and_100_kept(said: str, directory: Path) -> None:
    """The one line for a full disk at step 200, and checkpoint 100 alone on disk, the latest."""
    import tensorflow as tf

    assert said == (
        f"cannot save the checkpoint of step 200 in {directory}: No space left on device; the "
        f"checkpoint of step 100 is kept: free space there, then hpctf resubmit {directory.parent}"
    )
    assert sorted(p.name for p in directory.iterdir()) == [
        "checkpoint",
        "ckpt-100.data-00000-of-00001",
        "ckpt-100.index",
    ]
    assert tf.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-100")


def test_a_full_disk_during_an_asynchronous_save_is_one_line_at_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write fails in TensorFlow's background thread: the save itself returned; the next
    wait (before a preemption record, DONE or the next save) says it in the same one line."""
    import tensorflow as tf

    directory = tmp_path / "run" / "checkpoints"
    saver = checkpointer(directory, asynchronous=True)
    assert saver.save(100) == str(directory / "ckpt-100")
    saver.wait()
    assert tf.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-100")
    write = tf.train.Checkpoint._write

    def full_in_the_background(self: Any, prefix: str, options: Any = None) -> str:
        if options is not None and options.experimental_enable_async_checkpoint:
            return write(self, prefix, options=options)  # the training thread: copy, hand over
        Path(f"{prefix}_temp").mkdir()
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{prefix}_temp/part-00000; No space left on device [Op:SaveV2]"
        )

    # TensorFlow's writer thread saves through a Checkpoint of its own: patch the class.
    monkeypatch.setattr(tf.train.Checkpoint, "_write", full_in_the_background)
    assert saver.save(200) == str(directory / "ckpt-200")  # returned before the write
    # Taken after the next step (poll), not a thousand steps later at the next save.
    deadline = time.monotonic() + 30
    with pytest.raises(EnvironmentProblem) as caught:
        while time.monotonic() < deadline:
            saver.poll()
            time.sleep(0.01)
    full_disk_said_and_100_kept(str(caught.value), directory)


def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorflow as tf

    directory = tmp_path / "run" / "checkpoints"
    saver = checkpointer(directory)
    assert saver.save(100) == str(directory / "ckpt-100")
    manager = saver._manager

    def full(checkpoint_number: int) -> str:
        # What TF 2.21 leaves and says on ENOSPC (measured on a 1 MB tmpfs).
        (directory / f"ckpt-{checkpoint_number}_temp").mkdir()
        message = (
            f"{{{{function_node __wrapped__SaveV2}}}} {directory}/ckpt-{checkpoint_number}_temp/"
            "part-00000-of-00001.data-00000-of-00001.tempstate1; No space left on device "
            "[Op:SaveV2]"
        )
        raise tf.errors.ResourceExhaustedError(None, None, message)

    monkeypatch.setattr(manager, "save", full)
    with pytest.raises(EnvironmentProblem) as caught:
        saver.save(200)
    full_disk_said_and_100_kept(str(caught.value), directory)

    # Read-only: the same; any other OSError is not the filesystem's word and stays as it is.
    def refused(checkpoint_number: int) -> str:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(manager, "save", refused)
    with pytest.raises(
        EnvironmentProblem,
        match=r"step 300 .*: Read-only file system; the checkpoint of step 100 is kept",
    ):
        saver.save(300)

    def other(checkpoint_number: int) -> str:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(manager, "save", other)
    with pytest.raises(OSError, match="Bad file descriptor") as bad:
        saver.save(400)
    assert not isinstance(bad.value, EnvironmentProblem)


def test_a_read_only_checkpoint_directory_is_one_line_not_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorFlow says PermissionDeniedError (it was a traceback and "a bug in hpctf", then two
    failure requeues): the environment's fault, one line, and the chief records it so the batch
    script does not requeue (test_runstate: environment_failed)."""
    import os

    import tensorflow as tf

    directory = tmp_path / "run" / "checkpoints"
    saver = checkpointer(directory)
    saver.save(100)

    def read_only(checkpoint_number: int) -> str:
        # What TF 2.21 says on a read-only mount (measured: a tmpfs remounted ro).
        message = (
            "{{function_node __wrapped__SaveV2_dtypes_3_device_/job:localhost/replica:0/task:0/"
            f"device:CPU:0}}}} {directory}/ckpt-{checkpoint_number}_temp; Read-only file "
            "system [Op:SaveV2]"
        )
        raise tf.errors.PermissionDeniedError(None, None, message)

    with monkeypatch.context() as patch:
        patch.setattr(saver._manager, "save", read_only)
        with pytest.raises(EnvironmentProblem) as caught:
            saver.save(200)
    assert str(caught.value) == (
        f"cannot save the checkpoint of step 200 in {directory}: Read-only file system; the "
        "checkpoint of step 100 is kept: make it writable for you, then hpctf resubmit "
        f"{directory.parent}"
    )
    if os.geteuid() != 0:  # root writes through mode bits: only the message above applies then
        directory.chmod(0o555)
        try:
            with pytest.raises(EnvironmentProblem, match=r"step 300 .*Permission denied"):
                saver.save(300)
        finally:
            directory.chmod(0o755)
