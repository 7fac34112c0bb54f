"""A new worker task handing its place to the slot's warm standby (:mod:`.standby`).

``hpctf worker`` calls :func:`hand_over` before anything else: with a standby ready for this
run and these GPUs, the task sends its environment, working directory, CPUs, start time and
its stdin, stdout and stderr, and from then on is a thin stand-in for the worker the standby
became. It relays the signals Slurm sends the task (a preemption's warning, srun's SIGTERM)
and exits as the worker did (its code, or killed by the same signal). If it is killed itself
(SIGKILL), its connection closes and the keeper kills the worker. Without a standby (none on
this node yet, one still importing, another user's socket), :func:`hand_over` returns None
and the task imports TensorFlow itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctf.compute.loop.agreement import WATCHED_SIGNALS
from hpctf.compute.process import startup_clock
from hpctf.compute.start import standby_socket as wire

# What a task may be sent that the worker must get: the signals the workers watch (the
# preemption warning, srun's SIGTERM at a peer's death or a cancel), any other --signal a site
# may send, a Ctrl-C through srun.
RELAYED = (
    *WATCHED_SIGNALS,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGQUIT,
    signal.SIGALRM,
)
CONNECT_TIMEOUT_S = 1.0
ANSWER_TIMEOUT_S = 10.0  # the keeper answers at once; a loaded node may take a while


def hand_over(run_dir: Path, env: Mapping[str, str]) -> int | None:
    """Run as the slot's standby, relaying to it; the exit status the task must leave with,
    or None when there is no standby to take over (then start here)."""
    path = wire.socket_path(env)
    if path is None or not path.exists():
        return None
    try:
        wire.private_folder(path.parent, make=False)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(str(path))
        wire.check_same_user(conn)  # the standby is the job user's own, not someone's socket
        conn.settimeout(ANSWER_TIMEOUT_S)
        wire.send(conn, _request(run_dir, env), [0, 1, 2])
        answer, fds = wire.receive(conn)
    except (ConnectionRefusedError, FileNotFoundError):
        return None  # no keeper listens (yet, or any more)
    except (wire.StandbyRefused, OSError) as exc:
        _say(f"no warm standby ({exc}): importing TensorFlow here")
        return None
    for fd in fds:
        os.close(fd)
    pid = answer.get("accepted") if answer else None
    if not isinstance(pid, int):
        why = answer.get("refused", "no answer") if answer else "the standby left"
        _say(f"no warm standby ({why}): importing TensorFlow here")
        conn.close()
        return None
    conn.settimeout(None)
    return _relay(conn, pid)


def _request(run_dir: Path, env: Mapping[str, str]) -> dict[str, object]:
    return {
        "run_dir": str(run_dir.resolve()),
        "env": dict(env),
        "cwd": os.getcwd(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "started": startup_clock.process_started(),
    }


def _relay(conn: socket.socket, pid: int) -> int:
    """Relay signals to worker ``pid`` until its keeper sends its exit status; that status, as
    an exit code (a worker killed by a signal: this process is killed by the same one)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # it has already ended: its status is on the way
        pidfd = -1

    def relay(signum: int, _: object) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signum)

    if pidfd >= 0:
        for signum in RELAYED:
            signal.signal(signum, relay)
    try:
        answer, fds = wire.receive(conn)  # interrupted by a relayed signal: retried (PEP 475)
    except (wire.StandbyRefused, OSError):
        answer, fds = None, []
    for fd in fds:
        os.close(fd)
    code = answer.get("exit") if answer else None
    if not isinstance(code, int):
        # The keeper is gone (its step ended): so is the worker, by its parent-death signal.
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _say(f"the warm standby's keeper left before worker {pid} ended")
        return 1
    if code < 0:  # killed by signal -code: so is this task, as srun would have seen it
        for signum in RELAYED:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _say(line: str) -> None:
    print(f"hpctf: {line}", file=sys.stderr, flush=True)
