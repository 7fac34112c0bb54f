"""A local run's processes, seen from another command: ``hpctf cancel RUN`` stops its launcher
as Ctrl-C does (:func:`cancel_local`), and ``hpctf resubmit`` waits for the workers of a killed
launcher to save and end (:func:`wait_for_old_workers`) instead of starting beside them.

Which processes: the launcher's pid is the open start's job id in the journal, checked
against the run's owner claim (a local claim by that pid on this host, made after the process
began: a pid the system reused is never signalled); a worker's pid is in the first line of its
rank log, checked against its command line (``hpctf worker RUN_DIR``). Linux's ``/proc``
tells; elsewhere nothing is signalled and nothing waited for.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.core.run import ownership
from hpctf.core.run.history import RunHistory, read_history
from hpctf.core.run.rundir import RunDir

# The workers of a killed launcher save and exit within the launcher watch's deadline
# (hpctf.compute.process.launcher_watch.DEADLINE_S, 8 s) after noticing; with their exit, this.
OLD_WORKERS_S = 30.0
# How long ``hpctf cancel`` waits for the launcher to record the end after its SIGINT: the
# launcher's own bound on the workers' save (hpctf.login.submitting.local.WARNED_GRACE_S) and
# some.
CANCEL_WAIT_S = 130.0
_WORKER_LINE = re.compile(r"rank \d+: host (\S+) pid (\d+) ")


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def started_at(pid: int) -> float | None:
    """When process ``pid`` began (seconds since the epoch), from ``/proc``; None elsewhere."""
    fields = _proc_stat(pid)
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
    return None if fields is None else boot + int(fields[19]) / ticks


def old_workers(run: RunDir) -> list[int]:
    """The pids of this run's worker processes still running on this host, from the rank
    logs (each one's last start line) and checked by their command lines."""
    host, pids = socket.gethostname(), []
    for log in sorted(run.logs.glob("rank-*.log")):
        try:
            found = _WORKER_LINE.findall(log.read_text(errors="replace"))
        except OSError:
            continue
        if not found or found[-1][0] != host:
            continue
        pid = int(found[-1][1])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if running(pid) and b"worker" in argv and str(run.path).encode() in argv:
            pids.append(pid)
    return pids


def wait_for_old_workers(
    run: RunDir, bound_s: float = OLD_WORKERS_S, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Return once no worker of an earlier start of ``run`` runs here (they save and end when
    their launcher is killed); said on stderr while waiting, a UserError after ``bound_s``."""
    pids = old_workers(run)
    if not pids:
        return
    click.echo(
        f"hpctf: waiting up to {bound_s:.0f} s for the workers of the last start (pids "
        f"{' '.join(map(str, pids))}) to save and end",
        err=True,
    )
    deadline = time.monotonic() + bound_s
    while pids and time.monotonic() < deadline:
        sleep(0.2)
        pids = [pid for pid in pids if running(pid)]
    if pids:
        raise UserError(
            f"the workers of the last start of {run.path} (pids {' '.join(map(str, pids))}) "
            f"still run after {bound_s:.0f} s; stop them (kill {' '.join(map(str, pids))}), "
            "then resubmit"
        )


def local_launcher(run: RunDir, history: RunHistory | None = None) -> int | None:
    """The pid of the launcher training ``run`` on this host now, or None (no open start, or
    its process gone, or not the one that claimed the run). ``history``: the run's, when the
    caller has read it (else it is read here)."""
    known = history or read_history(run)
    jobs = [job.job_id for job in known.jobs if not job.ended]  # cancelled or not
    _, owner = ownership.current(run.path)
    if not jobs or owner is None or not owner.local_launch:
        return None
    if owner.host != socket.gethostname() or str(owner.pid) != jobs[-1]:
        return None
    began = started_at(owner.pid)
    # Recorded after the process began (its own claim): a later process has the pid reused.
    if not running(owner.pid) or began is None or began > owner.time + 1.0:
        return None
    return owner.pid


def cancel_local(run: RunDir, wait_s: float = CANCEL_WAIT_S) -> tuple[str, int | None] | None:
    """``hpctf cancel`` on a local run: SIGINT to its launcher, as a Ctrl-C in its terminal
    (the workers save at the next agreed step, the run ends ``cancelled``; a second one stops
    them at once, as a second Ctrl-C); waits up to ``wait_s`` for the launcher to end. Its
    job id and the checkpoint step it saved (None when it did not end in time); None when no
    launcher of the run runs here."""
    pid = local_launcher(run)
    if pid is None:
        return None
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + wait_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return str(pid), None if running(pid) else run.checkpoint_step()
