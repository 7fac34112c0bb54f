"""The code a run trains with, copied into its run directory at submit.

Every start of a run (a requeue after preemption, a walltime continuation, a resubmit days
later) must run the code the run began with, not whatever is on disk by then. So at submit the
experiment's ``train.python_path`` directories are copied to ``RUN_DIR/code/`` and the frozen
config points there; ``hpctf resubmit --update-code`` takes a new copy on purpose. A sweep's
points share one copy, kept once in the sweep directory (``SWEEP/code/<digest>/``, named by
its content: :func:`take_shared`), each point's ``RUN_DIR/code`` a link to it.

Only source-like files are copied, never data, virtualenvs, caches, version control or earlier
runs, and the whole copy is bounded: a python_path of ``~`` is refused, not copied
(:mod:`hpctf.core.run.snapshot_files`). Where a source
directory is inside a git work tree, its commit and whether it had uncommitted changes are
recorded (``RUN_DIR/code/SNAPSHOT.json``), for ``hpctf status``. The copy is read-only
(:func:`seal`): a run's code cannot change behind its back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctf.core.errors import EnvironmentProblem
from hpctf.core.run.snapshot_files import MAX_FILE as MAX_FILE  # read here by the SSH path
from hpctf.core.run.snapshot_files import MAX_TOTAL as MAX_TOTAL
from hpctf.core.run.snapshot_files import SnapshotPlan, plan_snapshot

CODE_DIR = "code"
MANIFEST = "SNAPSHOT.json"


@dataclass(frozen=True)
class Source:
    """One python_path directory and its copy."""

    source: str
    copy: str
    files: int
    bytes: int
    git_commit: str | None = None
    git_dirty: bool | None = None
    # Source-like files over MAX_FILE, left out (relative to ``source``): said at submit.
    too_big: list[str] = field(default_factory=list)
    # Python sources holding a secret (relative to ``source``): kept, owner-only (0400), and
    # said at submit -- a secret hard-coded in code is the user's to move.
    holds_secret: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.git_commit is None:
            version = "not in git"
        else:
            version = f"git {self.git_commit[:12]}{' (dirty)' if self.git_dirty else ''}"
        return f"{self.source}: {self.files} files, {version}"


def _git(directory: Path) -> tuple[str | None, bool | None]:
    """The commit of the git work tree holding ``directory`` and whether it is dirty there."""

    def run(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(directory), *args],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = run("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = run("status", "--porcelain", "--", ".")
    return commit.strip(), bool(status and status.strip())


def _copy(
    plan: SnapshotPlan, staging: Path, final: Callable[[], Path], secrets: list[bytes]
) -> list[Source]:
    """Copy ``plan``'s files into ``staging`` (new), one directory per python_path entry, and
    write the manifest there: each :class:`Source`'s copy named under ``final()``, the
    directory ``staging`` becomes (asked once the files are copied: a content-addressed
    snapshot is named by them). Sealed read-only (:func:`seal`) before it returns."""
    staging.mkdir(parents=True)
    copied: list[tuple[Path, str, list[Path], list[str]]] = []
    for index, (root, files) in enumerate(plan.roots):
        name = f"{index}-{root.name or 'root'}"
        copy = staging / name
        copy.mkdir()
        holding: list[str] = []
        for file in files:
            target = copy / file.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)
            if _keeps_secret(target, secrets):
                holding.append(str(file.relative_to(root)))
        copied.append((root, name, files, holding))
    where = final()
    sources = []
    for root, name, files, holding in copied:
        commit, dirty = _git(root) if root.is_dir() else (None, None)
        sources.append(
            Source(
                str(root),
                str(where / name),
                len(files),
                sum(f.stat().st_size for f in files),
                commit,
                dirty,
                [str(f.relative_to(root)) for f in plan.too_big[root]],
                holding,
            )
        )
    (staging / MANIFEST).write_text(
        json.dumps([asdict(s) for s in sources], indent=2) + "\n", encoding="utf-8"
    )
    seal(staging)
    _owner_only(staging, secrets)
    return sources


def _secret_bytes(secrets: Sequence[str]) -> list[bytes]:
    return sorted({s.encode("utf-8") for s in secrets if s}, key=len, reverse=True)


def take(
    python_path: list[str],
    run_path: Path,
    runs_root: Path | None = None,
    secrets: Sequence[str] = (),
) -> list[Source]:
    """Copy ``python_path`` into ``run_path/code`` (replacing an earlier copy, or the link to a
    sweep's shared snapshot: :func:`take_shared`); return what was copied, also written to
    ``code/SNAPSHOT.json``. A UserError, with nothing left behind, when the copy would be over
    :data:`MAX_TOTAL`. A copied file holding one of ``secrets`` has each replaced by ``***``
    in the copy (the experiment file, most often); a Python source holding one is kept as it
    is, readable by its owner alone (0400), and named in :attr:`Source.holds_secret`. The copy
    is read-only for everyone (:func:`seal`)."""
    plan = plan_snapshot(python_path, runs_root)
    code = run_path / CODE_DIR
    staging = run_path / f".{CODE_DIR}.new"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        sources = _copy(plan, staging, lambda: code, _secret_bytes(secrets))
        if code.is_symlink():  # a sweep's point: its own copy from now on, the others keep theirs
            code.unlink()
        else:
            shutil.rmtree(code, ignore_errors=True)
        os.replace(staging, code)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise EnvironmentProblem(f"cannot copy the code into {code}: {exc.strerror}") from exc
    return sources


def take_shared(
    python_path: list[str],
    store: Path,
    runs_root: Path | None = None,
    secrets: Sequence[str] = (),
) -> tuple[Path, list[Source]]:
    """A snapshot as :func:`take` makes one, kept once in ``store`` (a sweep's ``code/``) for
    every run that links to it (:func:`link`): ``store/<digest>/``, named by what it holds (the
    sources' paths, each copied file's path and bytes), so the same code taken twice is one
    directory. Returns that directory and what was copied.

    A 1,000-point sweep held 1,000 copies of its code (13 files a point, each a metadata
    operation on a parallel filesystem's shared server); its points now hold one link each.
    Removing a point removes its link only; ``hpctf resubmit --update-code`` of a point gives
    that point a copy of its own (:func:`take`) and leaves the others on the shared one."""
    plan = plan_snapshot(python_path, runs_root)
    staging = store / f".new-{os.getpid()}-{os.urandom(6).hex()}"
    found: list[Path] = []

    def named() -> Path:
        found.append(store / _digest(staging, plan))
        return found[0]

    try:
        store.mkdir(parents=True, exist_ok=True)
        # As seal() leaves a copy's directories: whoever could write here could put other
        # code in every point's place.
        store.chmod(store.stat().st_mode & 0o755)
        sources = _copy(plan, staging, named, _secret_bytes(secrets))
        try:
            os.rename(staging, found[0])
        except OSError:
            if not found[0].is_dir():  # not the same code taken before: a real failure
                raise
            shutil.rmtree(staging)  # the same bytes are there already
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)  # sealed dirs keep the owner's write bit
        raise EnvironmentProblem(f"cannot copy the code into {store}: {exc.strerror}") from exc
    return found[0], sources


def link(run_path: Path, shared: Path) -> None:
    """Make ``run_path/code`` the shared snapshot ``shared`` (:func:`take_shared`): a relative
    symbolic link, one inode, that every reader of ``RUN_DIR/code`` follows."""
    os.symlink(os.path.relpath(shared, run_path), run_path / CODE_DIR)


def _digest(staging: Path, plan: SnapshotPlan) -> str:
    """The name of a shared snapshot: a hash of its sources' paths and of every copied file's
    path and bytes (after secrets were replaced), in a stable order."""
    digest = hashlib.sha256()
    for root, _ in plan.roots:
        digest.update(f"source {root}\n".encode())
    for directory, dirs, names in sorted(os.walk(staging)):
        dirs.sort()
        for name in sorted(names):
            file = Path(directory) / name
            data = file.read_bytes()
            rel = file.relative_to(staging)
            digest.update(f"file {rel} {len(data)} {file.stat().st_mode & 0o777:o}\n".encode())
            digest.update(data)
    return digest.hexdigest()[:32]


def seal(copy: Path) -> None:
    """Make the copy read-only: no write bit on any file for anyone, and no group or other write
    bit on its directories (the owner keeps that one, so ``--update-code`` and removing the run
    can replace it). ``shutil.copy2`` keeps the source's mode: a world-writable source file
    stayed world-writable in the copy, and another local user's lines appended there ran as the
    job's owner at the next start."""
    for directory, _, names in os.walk(copy):
        for name in names:
            file = Path(directory) / name
            file.chmod(file.stat().st_mode & 0o555)
        Path(directory).chmod(Path(directory).stat().st_mode & 0o755)


def _keeps_secret(copy: Path, secrets: list[bytes]) -> bool:
    """Replace each of ``secrets`` in the file ``copy`` by ``***``; True, leaving it as it is,
    when it is Python source (rewriting code could change what it does: the owner-only mode of
    :func:`_owner_only` keeps it from others, and submit names the file)."""
    if not secrets:
        return False
    data = copy.read_bytes()
    if not any(secret in data for secret in secrets):
        return False
    if copy.suffix in {".py", ".pyi"}:
        return True
    for secret in secrets:  # longest first, as hpctf.core.secrets.redact
        data = data.replace(secret, b"***")
    copy.unlink()  # copy2 kept the source's mode: a new file, not a write through it
    copy.write_bytes(data)
    return False


def _owner_only(copy: Path, secrets: list[bytes]) -> None:
    if not secrets:
        return
    for directory, _, names in os.walk(copy):
        for name in names:
            file = Path(directory) / name
            data = file.read_bytes()
            if any(secret in data for secret in secrets):
                file.chmod(0o400)


def read(run_path: Path) -> list[Source]:
    """The snapshot of a run, or [] for a run made before snapshots existed (or whose record
    is damaged)."""
    try:
        data: list[dict[str, Any]] = json.loads(
            (run_path / CODE_DIR / MANIFEST).read_bytes().decode("utf-8")
        )
        return [Source(**item) for item in data]
    except (OSError, ValueError, TypeError):
        return []


def copy_of(path: str, sources: list[Source]) -> str:
    """Where file ``path`` (absolute, inside one of the copied directories, or already inside
    a copy) lies in the snapshot ``sources``; ``path`` itself when no source holds it."""
    target = Path(path)
    for source in sources:
        if target.is_relative_to(source.copy):
            return path  # a resubmit --update-code: copies keep their names
        if target.is_relative_to(source.source):
            return str(Path(source.copy) / target.relative_to(source.source))
    return path
