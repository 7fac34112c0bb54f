"""Many run directories' files made at once on a parallel filesystem, where each metadata
operation is a round trip to its server: each file new (``O_EXCL``: no temporary file, rename
or fsync of its own; the caller syncs the filesystem once), a point's files in its claimed
directory (:func:`write_point`), journal entries unsynced (:func:`record_unsynced`), the work
in contiguous shares over a few threads (:func:`in_shares`). Used by
:func:`hpctf.core.run.rundir.create_run_dirs_sharing_code` (a sweep's points), a search's
trials and a sweep's ``submitted`` records.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpctf.core.errors import EnvironmentProblem
from hpctf.core.run import journal, journal_entries, secret_store, snapshot
from hpctf.core.safe_files import safe_dir
from hpctf.core.secrets import SECRETS_FILE

if TYPE_CHECKING:
    from hpctf.core.run.rundir import RunDir
    from hpctf.core.settings.config import ResolvedConfig


Item = TypeVar("Item")


def in_shares(do: Callable[[Item], object], items: Sequence[Item], workers: int) -> None:
    """``do(item)`` for each of ``items``, by up to ``workers`` threads, each over a contiguous
    share of them in order (one task per thread, not one per item: a thread per item handed
    over through a queue made a thousand points 250,000 futex calls, the threads taking the
    GIL from each other between every two metadata operations). The first failure is raised
    once every thread has stopped; a thread stops at its first failure or at another's."""
    count = max(1, min(workers, len(items)))
    if count == 1:
        for item in items:
            do(item)
        return
    size = -(-len(items) // count)
    failed = threading.Event()

    def share(start: int) -> None:
        try:
            for item in items[start : start + size]:
                if failed.is_set():
                    return
                do(item)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(share, start) for start in range(0, len(items), size)]
    for future in futures:
        future.result()  # the first share's failure, raised


def write_point(run: RunDir, frozen: ResolvedConfig, script: str, code: Path) -> None:
    """A point's files in its new, claimed directory ``run`` (a sweep's point or a search's
    trial): empty ``logs/``, ``checkpoints/`` and ``journal/``, ``code`` a link to the shared
    snapshot, its secrets and config, its script and its journal's ``created`` record, each
    file new (:func:`write_new`)."""
    redacted, secrets = secret_store.split(frozen)
    try:
        for folder in (run.logs, run.checkpoints, run.journal):
            folder.mkdir()
        snapshot.link(run.path, code)
        if secrets:  # before the config: the config is never there without them
            write_new(run.path / SECRETS_FILE, secret_store.text(secrets))
        write_new(run.config_file, redacted.model_dump_json(indent=2))
        write_new(run.script, script, 0o777)  # less the umask, as for any new file
        name, entry = journal.created_file(run, frozen.experiment_file, frozen.site.name)
        write_new(run.journal / name, json.dumps(entry))
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create run directory {run.path}: {exc.strerror}") from exc


def record_unsynced(run: RunDir, event: str, fields: Mapping[str, Any]) -> None:
    """One journal entry of ``run``, as :meth:`hpctf.core.run.rundir.RunDir.record` writes one
    (the reader sees the whole entry or none: written beside its name, then renamed), in fewer
    metadata operations and without an fsync (the caller syncs the filesystem once for many
    runs: a sweep's ``submitted`` records): the journal opened once, never through a link
    (``O_NOFOLLOW``: one planted for it is refused), the entry's temporary file a name of its
    own (``O_EXCL``) in it."""
    try:
        folder = os.open(run.journal, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            safe_dir(run.journal, create=False)  # says what stands there, in its words
        raise EnvironmentProblem(f"cannot open {run.journal}: {exc.strerror or exc}") from exc
    try:
        stamp = journal_entries.next_stamp(os.listdir(folder), time.time_ns())
        name = journal_entries.file_name(stamp, os.getpid(), event)
        temporary = f".{name}.tmp"
        write_new(Path(temporary), json.dumps(journal_entries.entry(event, fields)), dir_fd=folder)
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write to {run.journal}: {exc.strerror or exc}") from exc
    finally:
        os.close(folder)


def write_new(path: Path, text: str, mode: int = 0o600, dir_fd: int | None = None) -> None:
    """A new file (never through a link: O_EXCL) holding ``text``, ``mode`` less the umask;
    ``path`` relative to the directory ``dir_fd`` when given. Written with ``os.write``: no
    buffered file object (its isatty and seek calls were half of a point's system calls)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    data = text.encode("utf-8")
    fd = os.open(path, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
