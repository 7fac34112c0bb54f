"""``--site local``: the job's tasks as processes on this machine, without Slurm.

Each process gets the environment srun would give a task of a one-node job step, so the
worker runs exactly the code it runs under Slurm. Like ``srun --kill-on-bad-exit=1``, when one
task fails the others are stopped; like a Slurm job, a first Ctrl-C or SIGTERM is a warning
that the workers save on, and the workers end with their launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from hpctf.core.errors import PREEMPTED_EXIT, UserError, shell_status
from hpctf.core.run import journal, ownership
from hpctf.core.run.history import EndReason, record_end_read
from hpctf.core.run.notifications import notify_end
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import open_append
from hpctf.core.secrets import is_secret, plain_env
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.private_network import PrivateNetwork, open_private_network


def task_environment(
    base: Mapping[str, str], job_id: int, ntasks: int, rank: int
) -> dict[str, str]:
    """What srun would set for task ``rank`` of a one-node step of ``ntasks`` tasks."""
    host = "localhost"
    return {
        **base,
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": host,
        "SLURM_STEP_NODELIST": host,
        "SLURM_TASKS_PER_NODE": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": str(ntasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": host,
        "PYTHONUNBUFFERED": "1",
    }


class Echo:
    """Rank 0's log echoed to ``sink`` (the terminal) by a thread of its own, so that a terminal
    that does not read (a pipe nobody empties, a paused or flow-controlled one) never holds the
    launcher: its supervision, and with it a Ctrl-C or ``hpctf cancel``, goes on. What the sink
    cannot take in time is dropped (the rank log keeps every line); a sink that is gone (a
    closed terminal) ends the echo and the run goes on."""

    QUEUED = 1024  # chunks waiting for the sink; more are dropped and counted

    def __init__(self, sink: IO[str] | None) -> None:
        self._sink = sink
        self._queue: queue.Queue[str | None] = queue.Queue(self.QUEUED)
        self.dropped = 0
        self._thread = threading.Thread(target=self._write, name="hpctf-echo", daemon=True)
        if sink is not None:
            self._thread.start()

    def put(self, text: str) -> None:
        if self._sink is None or not text:
            return
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            self.dropped += len(text)

    def close(self, wait_s: float = 2.0) -> None:
        """Let the queued text out for up to ``wait_s`` seconds, then leave it."""
        if self._sink is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=wait_s)
        self._thread.join(wait_s)

    def _write(self) -> None:
        sink = self._sink
        while sink is not None and (text := self._queue.get()) is not None:
            if self.dropped:
                note = f"hpctf: ({self.dropped} bytes of rank 0's log not shown here: the "
                text = note + "terminal did not read them; the rank log has them)\n" + text
                self.dropped = 0
            try:
                sink.write(text)
                sink.flush()
            except (OSError, ValueError):
                return  # the terminal is gone: no echo from here on


def _pump(source: IO[bytes], echo: Echo) -> None:
    """Hand what rank 0 wrote since the last call to the echo."""
    chunk = source.read()
    if chunk:
        echo.put(chunk.decode(errors="replace"))


def _say(echo: Echo, line: str) -> None:
    echo.put(f"hpctf: {line}\n")


# `hpctf submit --site local`'s exit status after a Ctrl-C (the shell's 128 + SIGINT).
CANCELLED_EXIT = 130
# How long the other ranks may take to exit after one exited 75 (they passed the same barrier).
PREEMPTION_GRACE_S = 60.0
# How long the workers may take, once warned by the launcher, to reach the next agreed step,
# save it and exit (the agreement comes every train.preemption_check_every_steps steps).
WARNED_GRACE_S = 120.0
# The worker's fallback watch on its launcher (hpctf.compute.process.launcher_watch) reads this.
LAUNCHER_PID_ENV = "HPCTF_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with(launcher: int) -> Callable[[], None]:
    """A ``preexec_fn``: the worker gets SIGTERM (the warning it saves on) when the launcher
    dies, even by SIGKILL or a closed terminal (Linux's PR_SET_PDEATHSIG, kept across exec).
    Elsewhere the worker's own watch on ``launcher`` does it, a little later."""

    def in_child() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != launcher:  # the launcher died before prctl: nobody to signal us
            os._exit(1)

    return in_child


class _StopSignals:
    """The launcher's SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal): the first is a
    warning, as Slurm's ``--signal`` or ``hpctf cancel`` is to a job; a second stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.first = 0
        self._previous = {signum: signal.signal(signum, self._on) for signum in self.SIGNALS}

    def _on(self, signum: int, frame: object) -> None:
        if self.first:
            raise KeyboardInterrupt
        self.first = signum

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _signal_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)


# The warning is repeated this often until the workers exit: TensorFlow's own handler swallows
# a SIGTERM that arrives while the strategy is being created (DESIGN.md).
REWARN_S = 2.0


def _warn(run: RunDir, job_id: int, procs: list[subprocess.Popen[bytes]], signum: int) -> str:
    """Warn every worker as Slurm would (SIGTERM: each saves at the next agreed step and
    exits 75); a Ctrl-C is also recorded as the user's cancel, so the run ends ``cancelled``
    rather than ``preempted``. Returns what to tell the user."""
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
        journal.record_cancelled(run, [str(job_id)])
    _signal_workers(procs)
    again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
    return (
        f"got {name}: the workers save at the next agreed step and stop; {again} stops "
        "them at once, without saving"
    )


def spawn_tasks(
    argv: Sequence[str],
    ntasks: int,
    base: Mapping[str, str],
    log_of: Callable[[int], Path],
    launcher: int | None = None,
) -> list[subprocess.Popen[bytes]]:
    """The ``ntasks`` tasks of a one-node job as processes of this one, each running ``argv``
    with srun's environment for its rank (:func:`task_environment`, job id: this process's
    pid) and its output appended to ``log_of(rank)``; each in a session of its own, out of
    the terminal's process group, so that a Ctrl-C reaches this process alone, which decides
    what the tasks get. With ``launcher`` (this process's pid) each task ends with it
    (:func:`_end_with`). A task that cannot be started stops those started before it.
    The one local spawner: a run's workers (:func:`launch`) and ``hpctf doctor``'s checks."""
    job_id = os.getpid()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(ntasks):
            with open_append(log_of(rank)) as log_file:
                procs.append(
                    subprocess.Popen(
                        list(argv),
                        env=task_environment(base, job_id, ntasks, rank),
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=None if launcher is None else _end_with(launcher),
                    )
                )
    except BaseException:
        stop_tasks(procs)
        raise
    return procs


def stop_tasks(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL to every task still running (each one's whole session), and wait for them."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


class Interrupted(Exception):
    """:func:`launch` with ``interrupt``: a SIGINT stopped the run (after the workers' save
    and the recorded end), for a caller that raises KeyboardInterrupt."""


def launch(
    config: ResolvedConfig,
    run: RunDir,
    env: Mapping[str, str],
    echo: IO[str] | None,
    interrupt: bool = False,
) -> int:
    """Run every task to the end; echo rank 0's log (``echo``: where; None: only the rank
    logs get it); return the job's exit code.

    The first SIGINT, SIGTERM or SIGHUP makes the workers save an agreed step and stop; the
    run then ends ``cancelled`` (SIGINT: the exit code is 130) or ``preempted`` (75), and
    ``hpctf resubmit`` resumes it. A second one stops them at once. With ``interrupt``, a
    SIGINT raises :class:`Interrupted` once all of that is done. Workers never outlive the
    launcher (:func:`_end_with`).
    """
    job_id = os.getpid()
    _claim(run)
    ntasks = config.ntasks
    base = _workers_env(config, env, job_id)
    journal.record_started(run, str(job_id), socket.gethostname(), config.site.preemption.signal)
    stop = _StopSignals()
    procs: list[subprocess.Popen[bytes]] = []
    status = 0
    echoed = Echo(echo)
    network: PrivateNetwork | None = None
    try:
        network, said = open_private_network(config, env)
        _say(echoed, said)
        worker = _worker_command(config, run, network)
        procs = spawn_tasks(worker, ntasks, base, run.rank_log, launcher=job_id)
        status = _supervise(run, job_id, procs, stop, echoed)
    except KeyboardInterrupt:
        status = 128 + (stop.first or signal.SIGINT)
    finally:
        # SIGKILL, as srun does after KillWait: once the strategy exists TensorFlow's own
        # handler swallows SIGTERM, so a polite signal may never end a worker.
        stop_tasks(procs)
        if network is not None:
            network.close()
        stop.restore()
        echoed.close()
    status = shell_status(status or next((p.returncode for p in procs if p.returncode), 0))
    reason = record_end_read(run, str(job_id), status, config.site.preemption.signal)
    notify_end(run, config, str(job_id))  # notify: done, failed
    if interrupt and stop.first == signal.SIGINT:
        raise Interrupted(reason)
    return CANCELLED_EXIT if reason == EndReason.CANCELLED else status


def _claim(run: RunDir) -> None:
    """One owner per run directory (hpctf.core.run.ownership), as job-start does on Slurm: a
    resubmit of this run has claimed it for this process already; anyone else's live claim
    stops here (a UserError naming it)."""
    owner = ownership.take(run.path, ownership.claim_of("local"), ownership.alive, 0)
    if owner is not None:
        raise UserError(f"{owner.describe()} owns {run.path}; wait for it, or stop it")


def _workers_env(config: ResolvedConfig, env: Mapping[str, str], job_id: int) -> dict[str, str]:
    """The workers' environment: ``env`` and the run's plain env: values, and the launcher's
    pid. The secret env: values are not given: each worker reads them from secrets.env, so that
    they are not in its environment at exec (hpctf.compute.start.runtime.run_worker)."""
    given = {**config.site.env, **config.experiment.env}
    secret = {k for k, v in given.items() if is_secret(v)}
    public = {k: v for k, v in {**env, **plain_env(given)}.items() if k not in secret}
    return {**public, LAUNCHER_PID_ENV: str(job_id)}


def _worker_command(
    config: ResolvedConfig, run: RunDir, network: PrivateNetwork | None
) -> list[str]:
    """``python -m hpctf worker RUN_DIR``, inside the run's private network when it has one."""
    worker = [config.python, "-m", "hpctf", "worker", str(run.path)]
    if network is not None:
        worker = network.command(worker)
    return worker


def _supervise(
    run: RunDir,
    job_id: int,
    procs: list[subprocess.Popen[bytes]],
    stop: _StopSignals,
    echo: Echo,
) -> int:
    """Echo rank 0 and wait for the workers, as srun --kill-on-bad-exit=1 would; returns the
    first bad exit status that ends the others, or 0."""
    preempted_at: float | None = None
    warned_at: float | None = None
    rewarned = 0.0
    with run.rank_log(0).open("rb") as chief_log:
        chief_log.seek(0, os.SEEK_END)
        while any(p.poll() is None for p in procs):
            _pump(chief_log, echo)
            if stop.first and warned_at is None:
                warned_at = rewarned = time.monotonic()
                _say(echo, _warn(run, job_id, procs, stop.first))
            elif warned_at is not None and time.monotonic() > rewarned + REWARN_S:
                rewarned = time.monotonic()
                _signal_workers(procs)
            codes = [p.returncode for p in procs if p.returncode not in (None, 0)]
            # 75: a rank saved the agreed preemption step; the others are exiting too.
            failed = [code for code in codes if code != PREEMPTED_EXIT]
            if codes and preempted_at is None:
                preempted_at = time.monotonic()
            now = time.monotonic()
            overdue = (preempted_at is not None and now > preempted_at + PREEMPTION_GRACE_S) or (
                warned_at is not None and now > warned_at + WARNED_GRACE_S
            )
            if failed or overdue:
                return (failed or codes or [128 + signal.SIGKILL])[0]
            time.sleep(0.1)
        _pump(chief_log, echo)
    return 0
