"""Local workers end with their launcher (``hpctf submit --site local``), saving first when
they can.

The launcher asks Linux to send each worker SIGTERM when the launcher dies
(``PR_SET_PDEATHSIG``, :func:`hpctf.login.submitting.local._end_with`): SIGTERM is the warning the
workers save an agreed step on. This watch is the fallback: where that signal does not exist
(not Linux), does not reach the worker (a ``python`` that is a wrapper script), or is swallowed
(TensorFlow's own C++ handler owns SIGTERM while the strategy is being created). It polls the
launcher, and once the launcher is gone it repeats the warning every poll and ends the process
:data:`DEADLINE_S` seconds later whatever it is doing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping

from hpctf.compute.process.leaving import exit_now

log = logging.getLogger("hpctf.worker")

# Set by the local launcher (hpctf.login.submitting.local.LAUNCHER_PID_ENV); absent under Slurm.
LAUNCHER_PID_ENV = "HPCTF_LAUNCHER_PID"
POLL_S = 0.5
# From the launcher's end to this process's: time for the next agreed step and its save
# (every train.preemption_check_every_steps steps) and a prompt exit.
DEADLINE_S = 8.0
# A worker stopped for good by this watch exits like one killed by SIGTERM.
ORPHAN_EXIT = 128 + signal.SIGTERM

_watched: tuple[int, int] | None = None  # (launcher pid, parent pid at start)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: the pid was reused, ours is gone
        return False
    return True


def launcher_ended() -> bool:
    """Whether this worker's local launcher has ended (always False under Slurm): dead, or
    this process re-parented."""
    if _watched is None:
        return False
    launcher, parent = _watched
    return os.getppid() != parent or not _alive(launcher)


def watch_launcher(env: Mapping[str, str]) -> bool:
    """Start the watch when a local launcher started this worker; returns whether it did."""
    global _watched
    text = env.get(LAUNCHER_PID_ENV, "")
    if not text.isdigit():
        return False
    _watched = (int(text), os.getppid())
    threading.Thread(target=_watch, name="hpctf-launcher-watch", daemon=True).start()
    return True


def _watch() -> None:
    while not launcher_ended():
        time.sleep(POLL_S)
    log.warning(
        "the launcher (pid %d) is gone: saving at the next agreed step and exiting",
        _watched[0] if _watched else -1,
    )
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        os.kill(os.getpid(), signal.SIGTERM)  # the warning; repeated in case one was swallowed
        time.sleep(POLL_S)
    log.warning("still running %.0f s after the launcher ended: exiting now", DEADLINE_S)
    exit_now(ORPHAN_EXIT)
