"""Checkpoints are found from the files on disk: TensorFlow's ``checkpoint`` state file is a
hint, and a damaged one never means "no checkpoint" (it did: the run trained from step 0 over
intact checkpoints). A directory this rank may not read, or checkpoints none of which reads
back, stop the run in one line; ``hpctf resubmit --from-scratch`` is there for the user who
means step 0."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.errors import EnvironmentProblem
from hpctf.core.run import checkpoint_files, journal
from hpctf.core.run.rundir import RunDir
from tests.fake_slurm import FakeSlurm, fake_checkpoint, new_run

GARBAGE = b"\x00\x01garbage{{{\n"  # what the damaged state file held in the report


def test_listing_reads_the_files_not_the_state_file(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    assert checkpoint_files.on_disk(directory) == {}  # no directory yet: no checkpoint
    fake_checkpoint(directory, 100)
    fake_checkpoint(directory, 2000, shards=2)
    fake_checkpoint(directory, 300, shards=3)
    (directory / "ckpt-300.data-00001-of-00003").unlink()  # a shard missing: not a checkpoint
    (directory / "ckpt-400.index").write_bytes(b"i")  # an index without data: neither
    (directory / "ckpt-500_temp").mkdir()  # a save in progress
    (directory / "checkpoint").write_bytes(GARBAGE)
    assert checkpoint_files.on_disk(directory) == {
        100: str(directory / "ckpt-100"),
        2000: str(directory / "ckpt-2000"),
    }
    assert RunDir(tmp_path).checkpoint_step() == 2000  # what the journal's records say
    state = checkpoint_files.state_file_text(checkpoint_files.on_disk(directory))
    assert state.startswith(
        'model_checkpoint_path: "ckpt-2000"\n'
        'all_model_checkpoint_paths: "ckpt-100"\n'
        'all_model_checkpoint_paths: "ckpt-2000"\n'
        "all_model_checkpoint_timestamps: "
    )


def test_resubmit_from_scratch_moves_the_checkpoints_aside(
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    path = new_run(runs_root, fake_slurm)
    fake_checkpoint(path / "checkpoints", 100)
    fake_slurm.answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    fake_slurm.answer("sbatch", "4343\n")
    result = CliRunner().invoke(cli, ["resubmit", "--from-scratch", str(path)])
    assert result.exit_code == 0, result.output
    (moved,) = path.glob("checkpoints-discarded-*")
    assert f"from scratch: the checkpoints were moved to {moved}; step 0 next" in result.output
    assert sorted(p.name for p in moved.iterdir()) == [
        "ckpt-100.data-00000-of-00001",
        "ckpt-100.index",
    ]
    assert list((path / "checkpoints").iterdir()) == []
    events = [e["event"] for e in RunDir(path).events()]
    assert events[-2:] == [journal.CHECKPOINTS_DISCARDED, journal.SUBMITTED]


# --- with TensorFlow's own files ---------------------------------------------------------------


def checkpointer(directory: Path, value: float = 1.0) -> Any:
    import tensorflow as tf

    from hpctf.compute.records.checkpoints import Checkpointer

    checkpoint = tf.train.Checkpoint(v=tf.Variable([value, value]))
    spec = SimpleNamespace(task_index=0, is_chief=True)
    return Checkpointer(checkpoint, directory, spec, keep=2)  # type: ignore[arg-type]


def one_rank(value: int) -> list[int]:
    return [value]


@pytest.mark.tf
def test_a_damaged_state_file_resumes_at_the_newest_checkpoint(tmp_path: Path) -> None:
    import tensorflow as tf

    directory = tmp_path / "run" / "checkpoints"
    saver = checkpointer(directory)
    for step in (16000, 17760):
        saver.save(step)
    (directory / "checkpoint").write_bytes(GARBAGE)
    assert tf.train.get_checkpoint_state(str(directory)) is None  # what TF alone would see

    resumed = checkpointer(directory, value=0.0)
    assert resumed.restore_agreed(one_rank) == str(directory / "ckpt-17760")
    # The state file was rebuilt from the disk, so rotation (keep=2) goes on over both.
    assert tf.train.get_checkpoint_state(str(directory)).all_model_checkpoint_paths == [
        str(directory / "ckpt-16000"),
        str(directory / "ckpt-17760"),
    ]
    resumed.save(18000)
    assert checkpoint_files.on_disk(directory).keys() == {17760, 18000}


@pytest.mark.tf
def test_checkpoints_none_of_which_reads_back_stop_the_run(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "checkpoints"
    saver = checkpointer(directory)
    saver.save(100)
    saver.save(200)
    for data in directory.glob("ckpt-*.data-*"):
        data.write_bytes(data.read_bytes()[:3])
    with pytest.raises(EnvironmentProblem) as caught:
        checkpointer(directory).restore_agreed(one_rank)
    said = str(caught.value)
    assert said.startswith(f"no checkpoint in {directory} reads back whole (ckpt-100, ckpt-200;")
    assert said.endswith(f"hpctf resubmit --from-scratch {directory.parent}")


@pytest.mark.tf
def test_a_checkpoint_without_the_optional_objects_still_restores(tmp_path: Path) -> None:
    """Seed states and running metrics joined the checkpoint later: a run checkpointed by an
    earlier hpctf resumes (its weights restored), and what the checkpoint has is restored."""
    import tensorflow as tf

    from hpctf.compute.records.checkpoints import Checkpointer

    spec = SimpleNamespace(task_index=0, is_chief=True)
    directory = tmp_path / "checkpoints"
    weights, seeds = tf.Variable([1.0, 2.0]), tf.Variable([7, 8], dtype=tf.int64)
    old = Checkpointer(tf.train.Checkpoint(model=weights), directory, spec, 2)  # type: ignore[arg-type]
    old.save(10)
    weights.assign([0.0, 0.0])
    whole = tf.train.Checkpoint(model=weights, random_state=[seeds])
    required = tf.train.Checkpoint(model=weights)
    new = Checkpointer(whole, directory, spec, 2, required=required)  # type: ignore[arg-type]
    assert new.restore_agreed(one_rank) == str(directory / "ckpt-10")
    assert weights.numpy().tolist() == [1.0, 2.0] and seeds.numpy().tolist() == [7, 8]
    seeds.assign([3, 4])
    new.save(20)
    seeds.assign([0, 0])
    assert new.restore_agreed(one_rank) == str(directory / "ckpt-20")
    assert seeds.numpy().tolist() == [3, 4]
    # Without `required`, the old checkpoint is refused as not matching (as before).
    strict = Checkpointer(whole, tmp_path / "other", spec, 2)  # type: ignore[arg-type]
    old_only = Checkpointer(tf.train.Checkpoint(model=weights), tmp_path / "other", spec, 2)  # type: ignore[arg-type]
    old_only.save(5)
    with pytest.raises(Exception, match="does not match"):
        strict.restore_agreed(one_rank)
