"""The code a run trains with, copied into its run directory at submit.

Every start of a run (a requeue after preemption, a walltime continuation, a resubmit days
later) must run the code the run began with, not whatever is on disk by then. So at submit the
experiment's ``train.python_path`` directories are copied to ``RUN_DIR/code/`` and the frozen
config points there; ``hpctf resubmit --update-code`` takes a new copy on purpose. A sweep's
points share one copy, kept once in the sweep directory (``SWEEP/code/<digest>/``, named by
its content: :func:`take_shared`), each point's ``RUN_DIR/code`` a link to it.

Only source-like files are copied (:data:`SOURCE_SUFFIXES`, each at most :data:`MAX_FILE`),
never data, virtualenvs, caches, version control or earlier runs, and the whole copy is
bounded (:data:`MAX_TOTAL`): a python_path of ``~`` is refused, not copied. Where a source
directory is inside a git work tree, its commit and whether it had uncommitted changes are
recorded (``RUN_DIR/code/SNAPSHOT.json``), for ``hpctf status``. The copy is read-only
(:func:`seal`): a run's code cannot change behind its back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctf.core.errors import EnvironmentProblem, UserError

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
            break  # refused by take(); no need to walk the rest of a home directory
    return found, too_big


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


@dataclass(frozen=True)
class _Plan:
    """What a snapshot will copy: each python_path directory and its files, and those left
    out for their size."""

    roots: list[tuple[Path, list[Path]]]
    too_big: dict[Path, list[Path]]


def _plan(python_path: Sequence[str], runs_root: Path | None) -> _Plan:
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
    return _Plan(roots, too_big)


def _copy(
    plan: _Plan, staging: Path, final: Callable[[], Path], secrets: list[bytes]
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
    plan = _plan(python_path, runs_root)
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
    plan = _plan(python_path, runs_root)
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


def _digest(staging: Path, plan: _Plan) -> str:
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
