"""The checkpoints of a run as the files on disk show them, read without TensorFlow.

TensorFlow's ``checkpoint`` state file (``model_checkpoint_path: "ckpt-300"``) names the
latest checkpoint, but it is only a hint: a damaged one makes ``tf.train.get_checkpoint_state``
log a ``ParseError`` and return None, which reads as "no checkpoint" and restarts training from
step 0 over intact checkpoints (seen: ckpt-16000 and ckpt-17760 on disk, the run started at 0
and rewrote the state file). The files themselves are the truth: ``ckpt-N.index`` and every
``ckpt-N.data-SSSSS-of-TTTTT`` shard it was written with. TensorFlow writes them into
``ckpt-N_temp/`` and moves them into place before it rewrites the state file, so a name without
its files is a save that never finished; whether the bytes read back whole is for the worker to
check (:func:`hpctf.compute.records.checkpoints.verify`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

PREFIX = "ckpt"  # tf.train.CheckpointManager's default checkpoint_name
_INDEX = re.compile(rf"^{PREFIX}-(\d+)\.index$")
_DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


def on_disk(directory: Path) -> dict[int, str]:
    """The checkpoints in ``directory`` whose index and data files are all there, as step ->
    path prefix (``<directory>/ckpt-N``, what TensorFlow's readers take); {} when the directory
    does not exist. Raises OSError when it cannot be read (permission denied): that is not "no
    checkpoint"."""
    try:
        names = {entry.name for entry in directory.iterdir()}
    except FileNotFoundError:
        return {}
    found: dict[int, str] = {}
    for name in names:
        match = _INDEX.match(name)
        if match and _shards_complete(name.removesuffix(".index"), names):
            found[int(match.group(1))] = str(directory / name.removesuffix(".index"))
    return dict(sorted(found.items()))


def _shards_complete(stem: str, names: set[str]) -> bool:
    shards = [m for n in names if n.startswith(f"{stem}.data-") and (m := _DATA.search(n))]
    if not shards:
        return False
    total = int(shards[0].group(2))
    return total > 0 and {int(m.group(1)) for m in shards} >= set(range(total))


def newest_step(directory: Path) -> int:
    """The step of the newest checkpoint on disk (0 for none, or an unreadable directory)."""
    try:
        return max(on_disk(directory), default=0)
    except OSError:
        return 0


def state_file_text(paths: dict[int, str]) -> str:
    """A ``checkpoint`` state file listing ``paths`` (step -> path), newest last and latest,
    in TensorFlow's text format (``CheckpointState``), with paths relative to the directory as
    ``tf.train.CheckpointManager`` writes them. Each carries its index file's time: without
    timestamps the manager keeps every listed checkpoint forever instead of rotating it out
    (``checkpoint_management.py``: only those newer than ``last_preserved_timestamp`` may go)."""
    steps = sorted(paths)
    names = [Path(paths[step]).name for step in steps]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] if names else []
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    lines += [f"all_model_checkpoint_timestamps: {_mtime(paths[step])}" for step in steps]
    return "".join(f"{line}\n" for line in lines)


def _mtime(path: str) -> float:
    try:
        return Path(f"{path}.index").stat().st_mtime
    except OSError:
        return 1.0  # still newer than the default last_preserved_timestamp, 0


def set_aside(directory: Path, stamp: str) -> Path | None:
    """Move the checkpoint directory ``directory`` aside to ``<name>-discarded-<stamp>`` beside it
    and leave an empty one in its place, so that the next start trains from step 0 and nothing
    is deleted; returns where it went (None when there was nothing in it). An OSError is the
    caller's to report."""
    try:
        if not any(directory.iterdir()):
            return None
    except FileNotFoundError:
        directory.mkdir()
        return None
    target = directory.with_name(f"{directory.name}-discarded-{stamp}")
    directory.rename(target)
    directory.mkdir()
    return target


_TEMP = re.compile(rf"^{PREFIX}-\d+_temp")


def remove_dead_temps(directory: Path) -> list[str]:
    """Remove the ``ckpt-N_temp*`` directories a save left when its writer died (a chief killed
    mid-save leaves one for ever); returns their names. Only for the chief at a start, when
    the run's claim (:mod:`hpctf.core.run.ownership`) says no other writer is alive. A link
    there is removed as a link, never followed."""
    try:
        names = [entry.name for entry in directory.iterdir() if _TEMP.match(entry.name)]
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        path = directory / name
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)
        except OSError:
            continue  # the listing of checkpoints says what is wrong with the directory
        removed.append(name)
    return removed
