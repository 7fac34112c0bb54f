"""Writing and reading files in places others may share, without following a link hpctf did
not make, and without reading more than a file should hold.

A run directory may sit on a scratch filesystem other users can see, and may be read by users
who do not own it (``hpctf status``, ``hpctf plot``). Whoever can write into it can plant a
symbolic link where hpctf is about to write (``loss.png -> ~victim/thesis.tex``): every write
here either opens with ``O_NOFOLLOW`` (appends: metrics, rank logs) or writes a temporary file
beside the target and renames it over the name (``rename(2)`` replaces a link, never writes
through it). An existing link at the name is refused in one line either way, so the planted
link stays visible to whoever looks. Hard links to another user's file cannot be planted where
``fs.protected_hardlinks`` is 1 (the default of every current distribution), and a rename
replaces a hard link's name without touching its other names.

Reads of files a user or a run hands us (experiment, site, journal) take regular files only
(a FIFO would block the reader forever, ``/dev/zero`` never ends) and at most a cap of bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pwd
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from hpctf.core.errors import EnvironmentProblem, UserError

# How much of a value an error message quotes (a 1 MB value must not become a 1 MB line).
QUOTE_CHARS = 200


class LinkRefused(UserError):
    """hpctf was to write where a symbolic link (or something not a file) stands."""


class NotARegularFile(UserError):
    """A file to read is a FIFO, a device, a directory, or larger than its cap."""


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with its length said
    (a 1 MB value must not become a 1 MB line)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def shortened(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, its length said when cut."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _refused(path: Path, what: str) -> LinkRefused:
    return LinkRefused(
        f"{path} is {what}, which hpctf did not make; refusing to write through it "
        "(whoever can write this directory may have planted it: look, then remove it)"
    )


def refuse_link(path: Path) -> None:
    """A :class:`LinkRefused` when ``path`` is a symbolic link (or anything but a regular file
    or nothing)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EnvironmentProblem(f"cannot look at {path}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(mode):
        raise _refused(path, "a symbolic link")
    if not stat.S_ISREG(mode):
        raise _refused(path, "not a regular file")


def safe_dir(path: Path, create: bool = True) -> Path:
    """``path`` as a real directory (made when ``create`` and missing): a symbolic link there
    is refused, so nothing written below it lands elsewhere."""
    if create:
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create {path}: {exc.strerror or exc}") from exc
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise _refused(path, "a symbolic link")
    if not stat.S_ISDIR(mode):
        raise _refused(path, "not a directory")
    return path


def umask() -> int:
    """This process's umask, read without changing it (Linux' /proc/self/status, else the
    set-and-restore dance)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def write_atomic(
    path: Path, data: str | bytes, mode: int | None = 0o600, sync: bool = True
) -> None:
    """Write ``data`` to ``path`` so readers see the old content or the new, never a part,
    and never through a link (:func:`refuse_link`). ``mode``: the file's permissions (None:
    0666 less the user's umask, as any new file). ``sync``: on disk before this returns
    (fsync); False for one of many files that :func:`sync_filesystem` makes durable together.

    A filesystem that refuses (full, read-only, over quota) is an EnvironmentProblem naming the
    file, with the OSError kept as its cause.
    """
    refuse_link(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~umask() if mode is None else mode)
            handle.write(raw)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise


def sync_filesystem(path: Path) -> None:
    """Everything written to the filesystem holding ``path`` on disk (``syncfs(2)``; elsewhere
    than Linux, ``sync(2)``): one call for the thousands of files of a sweep's points, each
    written without its own fsync (one fsync a file took most of a 1,000-point sweep's
    creation). An EnvironmentProblem when the filesystem reports a write it lost."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise EnvironmentProblem(f"cannot write {path} to disk: {os.strerror(error)}")
    finally:
        os.close(fd)


def open_append(path: Path, mode: int = 0o644) -> BinaryIO:
    """``path`` opened to append bytes (created with ``mode`` less the umask), never through a
    link, and only when it is a regular file (a FIFO planted there would block the writer)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "a symbolic link") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise _refused(path, "not a regular file") from None
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refused(path, "not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path, what: str) -> BinaryIO:
    """``path`` opened for reading, a regular file, without following a link at its last
    component and without blocking on open (O_NONBLOCK: a FIFO with no writer would hold the
    reader forever); anything else (a FIFO, /dev/zero, a directory, a link) is a
    :class:`NotARegularFile` in one line naming ``what`` it was to be. For a file read as a
    stream (metrics, logs); :func:`read_bounded` reads a small one whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except IsADirectoryError:
        raise NotARegularFile(f"{path}: {what} is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(f"{path}: {what} is a symbolic link; not followed") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotARegularFile(f"{path}: {what} is {_kind(info.st_mode)}, not a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, cap: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``cap`` bytes; anything else (a FIFO,
    a device such as /dev/zero, a directory, a bigger file) is a :class:`NotARegularFile` in
    one line, naming ``what`` the file was to be. Opening never blocks (O_NONBLOCK: a FIFO with
    no writer); a missing file is FileNotFoundError, another failure OSError, as open's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise NotARegularFile(f"{path}: {what} is a directory, not a file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path}: {what} is {_kind(info.st_mode)}, not a file")
        if info.st_size > cap:
            raise NotARegularFile(
                f"{path}: {what} is {info.st_size:,} bytes, over the limit of {cap:,} bytes"
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(cap + 1)  # a file that grew since fstat
        if len(data) > cap:
            raise NotARegularFile(f"{path}: {what} is over the limit of {cap:,} bytes")
        return data
    finally:
        os.close(fd)


def private_folder(folder: Path, create: bool) -> bool:
    """Whether hpctf may keep what it trusts (a runs root's index, the code shipped from a
    laptop) in ``folder``: a real directory (made, mode 0700, when ``create``, it is missing and
    its parent is this user's) owned by this user and writable by nobody else. Never raises."""
    try:
        if create and not folder.exists() and folder.parent.stat().st_uid == os.geteuid():
            folder.mkdir(mode=0o700, exist_ok=True)  # another writer may make it first
        found = os.lstat(folder)
    except OSError:
        return False
    return (
        stat.S_ISDIR(found.st_mode)
        and found.st_uid == os.geteuid()
        and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def someone_elses(path: Path) -> str | None:
    """The name of the user who owns ``path`` when it is not this process's user (``uid N``
    without a name), else None; None too when ``path`` is gone."""
    try:
        owner = path.stat().st_uid
    except OSError:
        return None
    if owner == os.geteuid():
        return None
    try:
        return pwd.getpwuid(owner).pw_name
    except KeyError:
        return f"uid {owner}"
