"""Where a task slot's warm standby listens, and the messages it and a new worker exchange.

One unix socket per task slot of a job on a node, ``<tmp>/hpctf-standby-<uid>-<job>/<node>-
<localid>.sock``: the directory is made 0700 by the job's user (one that exists with another
owner, other modes, or as a link is refused, never used), and each side checks the other's
user with ``SO_PEERCRED`` besides, so another user of the node can neither hand a standby an
environment nor pose as one. ``SOCK_SEQPACKET``: each message is one JSON object, whole, with
the file descriptors it carries (``SCM_RIGHTS``); a message over :data:`MAX_MESSAGE` is
refused. The standby's keeper is :mod:`.standby`, the new worker's side :mod:`.takeover`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_MESSAGE = 1 << 20  # an environment of a few hundred variables is some 10 KB
MAX_FDS = 8
STALE_AFTER_S = 60.0  # a socket younger than this is never taken for a dead keeper's
_UNIX_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL


class StandbyRefused(OSError):
    """The socket, its directory or the peer is not the job user's own, or a message broke
    the protocol: no takeover (the worker imports TensorFlow itself)."""


def socket_path(env: Mapping[str, str], base: Path | None = None) -> Path | None:
    """The socket of this task slot (Slurm's job, node and local id in ``env``) under ``base``
    (default: the temporary directory); None outside a Slurm task, or when the path would not
    fit a unix socket address."""
    names = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_LOCALID")
    job, node, local = (env.get(name, "") for name in names)
    if not (job.isdigit() and local.isdigit() and node) or "/" in node:
        return None
    folder = (base or Path(tempfile.gettempdir())) / f"hpctf-standby-{os.getuid()}-{job}"
    path = folder / f"{node}-{local}.sock"
    return path if len(os.fsencode(path)) <= _UNIX_PATH_MAX else None


def private_folder(folder: Path, make: bool) -> None:
    """Make ``folder`` (mode 0700) when ``make`` and it is missing; StandbyRefused unless it is
    then a directory (not a link) of this user's that nobody else may enter."""
    if make:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StandbyRefused(f"cannot make {folder}: {exc}") from exc
    try:
        info = folder.lstat()
    except OSError as exc:
        raise StandbyRefused(f"{folder}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StandbyRefused(
            f"{folder} is not a directory of this user's only (mode {info.st_mode & 0o777:o}, "
            f"owner uid {info.st_uid})"
        )


def remove_stale(base: Path, node: str, keep: Path) -> list[Path]:
    """Remove the sockets of this user's keepers on node ``node`` under ``base`` that nobody
    listens on any more (a keeper killed outright: its job ended), then their folders once
    empty; ``keep`` (this keeper's folder) is left alone. Returns what was removed. Only this
    node's sockets are asked: on a temporary directory that several nodes share, another
    node's socket cannot be reached from here and would look dead."""
    removed = []
    for folder in base.glob(f"hpctf-standby-{os.getuid()}-*"):
        if folder == keep:
            continue
        try:
            private_folder(folder, make=False)
        except StandbyRefused:
            continue
        for path in folder.glob(f"{node}-*.sock"):
            with contextlib.suppress(OSError):
                if time.time() - path.lstat().st_mtime < STALE_AFTER_S:
                    continue  # a keeper starting now binds before it listens
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
                removed.append(path)
            except OSError:
                pass
            finally:
                probe.close()
        try:
            folder.rmdir()  # only once empty: other nodes' keepers may live in it
            removed.append(folder)
        except OSError:
            pass
    return removed


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process at the other end of unix socket ``sock``."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def check_same_user(sock: socket.socket) -> int:
    """The peer's pid; StandbyRefused when the peer runs as another user."""
    pid, uid, _ = peer_credentials(sock)
    if uid != os.getuid():
        raise StandbyRefused(f"process {pid} of uid {uid} is not this job's user ({os.getuid()})")
    return pid


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """``message`` as one packet, with ``fds`` passed along."""
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise StandbyRefused(f"a message of {len(data)} bytes is over {MAX_MESSAGE}")
    socket.send_fds(sock, [data], list(fds))


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors it brought; (None, []) when the peer has gone. The
    descriptors are the caller's to close."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise StandbyRefused("a message too long, or with too many descriptors")
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        message = json.loads(data)
    except ValueError as exc:
        for fd in fds:
            os.close(fd)
        raise StandbyRefused(f"not a message: {exc}") from exc
    if not isinstance(message, dict):
        for fd in fds:
            os.close(fd)
        raise StandbyRefused("not a message: not an object")
    return message, fds
