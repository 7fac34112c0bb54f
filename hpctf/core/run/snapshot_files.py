"""Which files a code snapshot (:mod:`hpctf.core.run.snapshot`) copies, decided before
anything is written (:func:`plan_snapshot`): source-like files only (:data:`SOURCE_SUFFIXES`,
each at most :data:`MAX_FILE`), never data, virtualenvs, caches, version control, earlier runs
or credentials (:func:`is_credential`), and the whole bounded (:data:`MAX_FILES`,
:data:`MAX_TOTAL`): a python_path of ``~`` is refused, not copied.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctf.core.errors import UserError

SOURCE_SUFFIXES = frozenset(
    {".py", ".pyi", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".txt", ".sh", ".j2"}
)
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        "__pycache__",
        ".venv",
        "venv",
        "env",
        "node_modules",
        "data",
        "datasets",
        "checkpoints",
        "runs",
        "logs",
        "outputs",
        "wandb",
        "mlruns",
        "build",
        "dist",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        ".tox",
    }
)
MAX_FILE = 1 << 20  # 1 MiB: larger "source" files are data in disguise
MAX_TOTAL = 32 << 20  # 32 MiB in all
# Each run holds its own copy (a sweep's points share one: take_shared): 20,000 small files
# were 20,000 inodes per run. A project's own code is hundreds of files.
MAX_FILES = 5_000
# Credentials beside the code stay where they are (a 0700 home), not copied into a runs root
# others may read: dot-files and dot-directories (.env, .netrc, .secrets/, .aws/), and these.
CREDENTIAL_NAMES = frozenset(
    {"kaggle.json", "credentials.json", "client_secret.json", "service_account.json"}
)
CREDENTIAL_SUFFIXES = frozenset({".pem", ".key", ".p12", ".pfx", ".keytab"})
_CREDENTIAL_WORDS = re.compile(r"secret|credential|password", re.IGNORECASE)


def is_credential(name: str) -> bool:
    """Whether a file called ``name`` looks like it holds credentials (never copied)."""
    return (
        name.startswith(".")
        or name.lower() in CREDENTIAL_NAMES
        or Path(name).suffix.lower() in CREDENTIAL_SUFFIXES
        or bool(_CREDENTIAL_WORDS.search(name))
    )


def _files(root: Path, skip: Path | None) -> tuple[list[Path], list[Path]]:
    """The source-like files under ``root``, in a stable order, and those left out for their
    size (over :data:`MAX_FILE`). Dot-directories and credential-looking files
    (:func:`is_credential`) are not looked at."""
    found: list[Path] = []
    too_big: list[Path] = []
    for directory, dirs, names in os.walk(root):
        here = Path(directory)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIPPED_DIRS
            and not d.startswith(".")
            and not d.endswith(".egg-info")
            and (skip is None or (here / d).resolve() != skip)
            and not (here / d / "journal").is_dir()  # an earlier run directory
        )
        for name in sorted(names):
            path = here / name
            if (
                path.suffix in SOURCE_SUFFIXES
                and not is_credential(name)
                and path.is_file()
                and not path.is_symlink()
            ):
                (found if path.stat().st_size <= MAX_FILE else too_big).append(path)
        if len(found) > MAX_FILES:
            break  # refused by plan_snapshot(); no need to walk the rest of a home directory
    return found, too_big


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot will copy: each python_path directory and its files, and those left
    out for their size."""

    roots: list[tuple[Path, list[Path]]]
    too_big: dict[Path, list[Path]]


def plan_snapshot(python_path: Sequence[str], runs_root: Path | None) -> SnapshotPlan:
    """The files of ``python_path`` to copy, or a UserError when there are too many or too much
    (:data:`MAX_FILES`, :data:`MAX_TOTAL`), before anything is written."""
    skip = runs_root.resolve() if runs_root is not None else None
    roots: list[tuple[Path, list[Path]]] = []
    too_big: dict[Path, list[Path]] = {}
    total = 0
    for entry in python_path:
        root = Path(entry)
        files, too_big[root] = _files(root, skip) if root.is_dir() else ([], [])
        total += sum(f.stat().st_size for f in files)
        roots.append((root, files))
    count = sum(len(files) for _, files in roots)
    if count > MAX_FILES:
        biggest = max(roots, key=lambda item: len(item[1]))[0]
        raise UserError(
            f"train.python_path holds more than {MAX_FILES:,} source-like files ({count:,} "
            f"counted before stopping, most in {biggest}), the most hpctf copies into each "
            "run: point python_path at the directories with your code only"
        )
    if total > MAX_TOTAL:
        biggest = max(roots, key=lambda item: sum(f.stat().st_size for f in item[1]))[0]
        raise UserError(
            f"train.python_path holds {total / 2**20:.0f} MiB of source-like files (most in "
            f"{biggest}), over the {MAX_TOTAL >> 20} MiB hpctf copies into a run: point "
            "python_path at the directories with your code only"
        )
    return SnapshotPlan(roots, too_big)
