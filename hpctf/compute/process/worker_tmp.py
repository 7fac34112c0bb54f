"""A worker's own temporary directory, removed however the worker leaves.

Python's ``tempfile`` in a worker makes its files in one directory of the worker's own under
``$TMPDIR``: TensorFlow's autograph sources (``__autograph_generated_file*.py``), the other
ranks' throwaway checkpoints (:mod:`hpctf.compute.records.checkpoints`) and whatever the user's
code asks ``tempfile`` for. It is removed on every way out: the normal exit and an
exception's (an ``atexit`` function, registered before TensorFlow is imported so it runs after
TensorFlow's own), and the bounded exit that skips ``atexit``
(:func:`hpctf.compute.process.leaving.exit_now`).

Why: autograph deletes each source it wrote with an ``atexit`` function of its own, which the
bounded exit skips. On a loaded 2-node test cluster that bound fired after DONE, and the job's
``$TMPDIR`` kept 22 autograph files. On a cluster whose nodes keep ``/tmp`` they pile up job
after job.

A worker killed outright (SIGKILL: Slurm's KillWait, the OOM killer) runs none of these. Its
directory holds a lock file the worker keeps locked while it lives (``flock``, which the kernel
releases when the process dies), and the next worker on the node to start removes every such
directory of this user whose lock is free, made on this host: the directory's name holds the
host's name (``hpctf-rank0-node17-k3j9x_2a``), because on a ``$TMPDIR`` shared by several nodes
``flock``'s locks may be node-local, and another node's live directory would look free.

``$TMPDIR`` itself is not changed: data a batch script staged there is still where it says,
and programs the user's code starts get the same ``$TMPDIR``. Only ``tempfile.gettempdir()``
answers the worker's own directory.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("hpctf")

_own: Path | None = None
# Held through a removal: the exit bound's timer and the main thread's leave() may both remove
# the directory; the second waits for the first's rmtree, or its os._exit would cut it short
# (seen on the Slurm 24.11 cluster: a rank gone with its autograph files left behind).
_removing = threading.Lock()
# How long a second remover waits for the first (a removal on a hung filesystem must not hold
# the exit for ever).
REMOVAL_WAIT_S = 2.0
_PREFIX = "hpctf-rank"
_OWNER = "owner.lock"  # locked by the worker while it lives


def use_own_tmp(task_index: int) -> Path | None:
    """Point ``tempfile`` at a new directory (mode 0700) under the current temporary directory
    and return it. Without one (``$TMPDIR`` full or not writable), log one line and return
    None: the files go where they went before."""
    global _own
    base = Path(tempfile.gettempdir())
    remove_left_behind(base)
    try:
        path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{task_index}-{_host()}-", dir=base))
        _lock_for_life(path)
    except OSError as exc:
        log.warning(
            "no temporary directory of this worker's own (%s); using %s", exc, tempfile.gettempdir()
        )
        return None
    _own = path
    tempfile.tempdir = str(path)
    atexit.register(remove_own_tmp)
    return path


def remove_own_tmp() -> None:
    """Remove the worker's own temporary directory, if it has one; never raises. A second
    caller (another thread) returns once the first caller's removal is over."""
    global _own
    if not _removing.acquire(timeout=REMOVAL_WAIT_S):
        return
    try:
        if _own is None:
            return
        path, _own = _own, None
        tempfile.tempdir = None  # gettempdir() finds $TMPDIR again
        shutil.rmtree(path, ignore_errors=True)
    finally:
        _removing.release()


def _lock_for_life(path: Path) -> None:
    """Lock ``path``'s owner file for as long as this process lives (the descriptor is never
    closed). Locked before it takes its name, so no other worker ever sees it unlocked."""
    making = path / f".{_OWNER}.new"
    fd = os.open(making, os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(making, path / _OWNER)


def _host() -> str:
    """This host's name as it goes into a directory name (no dash-free guess needed: the
    name is matched whole, :func:`remove_left_behind`)."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"


def remove_left_behind(base: Path) -> list[Path]:
    """Remove the directories under ``base`` of this user's workers on this host that are gone
    (their owner lock is free) and return them; a live worker's, another host's, another
    user's, a link, and one still being made are left alone."""
    # tempfile's random names are 8 of [a-z0-9_]: the host's part is matched whole.
    ours = re.compile(rf"{_PREFIX}\d+-{re.escape(_host())}-[a-z0-9_]{{8}}")
    removed = []
    for old in base.glob(f"{_PREFIX}*-*"):
        if not ours.fullmatch(old.name):
            continue
        try:
            if old.is_symlink() or old.stat().st_uid != os.getuid():
                continue
            fd = os.open(old / _OWNER, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its worker lives
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    return removed
