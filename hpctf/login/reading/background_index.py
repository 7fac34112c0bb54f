"""A runs root's index made in the background, after a lazy listing (``hpctf status``
without RUN) has shown the runs it could read at once (:func:`hpctf.login.reading.runs.
scan_runs`): one detached process per runs root reads every run directory the index lacks,
at low priority, and saves the index, so that the next listing is whole and warm.

Why a process: reading a run directory the index has not seen costs about 0.5 ms (its config,
journal, metrics' tail and snapshot), 5-7 s for 10,000 runs, and a listing should answer in
well under that; git's ``gc --auto --detach`` makes the same choice. One at a time per runs
root: ``<runs_root>/.hpctf-index/building`` (O_EXCL) holds its process id and is removed when
it ends; one left by a process that is gone, or older than :data:`STALE_S`, is taken over.
Only in an index folder this user owns (:func:`hpctf.core.safe_files.private_folder`): where
no index may be kept, nothing is started and ``hpctf status --all`` reads every run.

    python -m hpctf.login.reading.background_index RUNS_ROOT
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.run_index import INDEX_DIR, Index
from hpctf.core.safe_files import private_folder

MODULE = "hpctf.login.reading.background_index"
LOCK = "building"
# An indexer older than this is taken for lost (10,000 runs take seconds, not an hour).
STALE_S = 3600
# A lock just made whose process id is not written yet: the listing that made it starts one.
STARTING_S = 60


def lock_of(root: Path) -> Path:
    return root / INDEX_DIR / LOCK


def running(root: Path) -> bool:
    """Whether an indexer of ``root`` runs now; a lock it left behind is removed."""
    lock = lock_of(root)
    try:
        age = time.time() - lock.stat().st_mtime
        text = lock.read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return False
    if not text and age < STARTING_S:
        return True
    try:
        os.kill(int(text), 0)
        alive = age < STALE_S
    except (ValueError, ProcessLookupError, PermissionError):  # gone, or its id reused
        alive = False
    if not alive:
        with contextlib.suppress(OSError):
            lock.unlink()
    return alive


def start(root: Path) -> bool:
    """Start the indexer of ``root`` (resolved) unless one runs; whether one runs now. Never
    raises: the listing that asks has shown what it read either way."""
    if not private_folder(root / INDEX_DIR, create=True):
        return False
    if running(root):
        return True
    try:
        fd = os.open(lock_of(root), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return True  # another listing started one just now
    except OSError:
        return False
    with os.fdopen(fd, "w", encoding="ascii") as lock:
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", MODULE, str(root)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd="/",
                # The same hpctf as this process's, wherever it was imported from.
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )  # fmt: skip
        except OSError:
            with contextlib.suppress(OSError):
                lock_of(root).unlink()
            return False
        lock.write(str(process.pid))
    return True


def build(root: Path) -> None:
    """Read every run directory under ``root`` the index lacks (or whose row is stale) and
    save the index; then remove the lock, if it is still this process's."""
    try:
        with contextlib.suppress(OSError):
            os.nice(10)  # a login node's shell comes first
        index = Index(root)
        try:
            children = [Path(e.path) for e in os.scandir(root) if e.is_dir() and e.name[:1] != "."]
        except OSError:
            return
        for path in children:
            with contextlib.suppress(UserError, EnvironmentProblem):
                index.facts(path)  # a run that cannot be read: said by the listings
        index.save(keep=(str(p) for p in children))
    finally:
        with contextlib.suppress(OSError, ValueError):
            if lock_of(root).read_text(encoding="ascii").strip() in ("", str(os.getpid())):
                lock_of(root).unlink()


if __name__ == "__main__":
    build(Path(sys.argv[1]))
