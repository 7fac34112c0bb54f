"""A warm standby per task slot: a process that has imported TensorFlow and hpctf's training
and becomes the slot's worker when a new start of the job's workers asks it to, so that a
restart inside the allocation (job-end's exit 98) skips TensorFlow's import.

The batch script starts, once per allocation, a background ``srun --overlap`` step of ``hpctf
standby RUN_DIR`` with the workers' own task layout: one *keeper* per task slot. A keeper
imports no TensorFlow. It listens on the slot's unix socket (:mod:`.standby_socket`) and keeps
one standby *child* (``hpctf standby RUN_DIR --child FD``) that imports TensorFlow and
hpctf's training, then waits. A new step's ``hpctf worker`` (:mod:`.takeover`) connects and
hands over its environment and its stdin, stdout and stderr; the keeper checks who asks (the
job's user only), that the run and the GPUs Slurm gave both tasks are the same, and passes the
request to its ready child, which sets that environment (TF_CONFIG, CUDA_VISIBLE_DEVICES, the
CPU affinity) before TensorFlow initializes anything and runs the worker's own code from
there. The keeper reaps it and sends its exit status back; the thin task exits with it and
relays its signals. A thin task that dies (SIGKILL from Slurm) closes its connection: the keeper
kills the worker at once. A consumed child is replaced once the new worker has trained its first
step (its rank log says so), so its import does not compete with the restart.

No standby (the first start, one still importing, another run or other GPUs) is no failure: the
worker imports TensorFlow itself, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.compute.process import startup_clock
from hpctf.compute.process.worker_tmp import remove_left_behind
from hpctf.compute.start import standby_socket as wire
from hpctf.core.run.rundir import RunDir

log = logging.getLogger("hpctf.standby")

# Variables through which Slurm tells a task its GPUs: a standby becomes only a task whose GPUs
# its own step was given the same way (the same devices, numbered the same in the same device
# cgroup), else the worker imports TensorFlow itself.
GPU_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
)
# A fresh child starts once the slot's worker has trained this long past its first step, or
# this long after the keeper's start or its last takeover. A start that ends soon after its
# first step (a short run, a job at its end) gains nothing from a standby, whose import would
# take the CPU its training and input pipeline use; a crash that soon loses little by a start
# that imports TensorFlow itself.
TRAINED_FOR_S = 10.0
WARM_AFTER_S = 60.0
RETRY_AFTER_S = 30.0  # a child that died idle (its import failed) is tried again after this
POLL_S = 0.5
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
_PR_SET_PDEATHSIG = 1
_FIRST_STEP = re.compile(rb"rank \d+: first step \d+ after ")


def gpu_mismatch(own: Mapping[str, str], handed: Mapping[str, str]) -> str | None:
    """Why a standby started with environment ``own`` cannot become the task of ``handed``
    (Slurm gave them different GPUs), or None."""
    for name in GPU_VARIABLES:
        if own.get(name) != handed.get(name):
            mine, theirs = own.get(name), handed.get(name)
            return f"{name} differs (the standby's {mine!r}, the task's {theirs!r})"
    return None


class FirstSteps:
    """Counts the first-step lines (:mod:`hpctf.compute.process.startup_clock`) a rank log
    gains after this watch began, reading only what was appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._rest = b""

    def seen(self) -> bool:
        """Whether a first step was logged since the watch began."""
        with contextlib.suppress(OSError), self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = self._rest + handle.read(1 << 22)
            self._offset = handle.tell()
            lines, _, self._rest = data.rpartition(b"\n")
            return bool(_FIRST_STEP.search(lines))
        return False


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    pair: socket.socket
    pidfd: int
    ready: bool = False


class Keeper:
    """One task slot's keeper (:func:`keep`): its socket, its standby child (importing or
    ready), and the worker a child became (with the connection of the task it serves)."""

    def __init__(self, run: RunDir, listener: socket.socket, env: Mapping[str, str]) -> None:
        self.run, self.listener, self.env = run, listener, dict(env)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "listen")
        self.child: _Child | None = None
        self.worker: _Child | None = None
        self.serving: socket.socket | None = None  # the worker's task's connection
        self.warm_at = time.monotonic() + WARM_AFTER_S
        self.first_steps = FirstSteps(run.rank_log(int(env.get("SLURM_PROCID", "0") or 0)))
        self.stopping = False

    def run_forever(self) -> None:
        # Stopped (SIGTERM: the job ends, is preempted or requeued), it still waits for a
        # worker it serves: that worker got the same signal through its task and saves first.
        while not self.stopping or self.worker is not None:
            if self.child is None and not self.stopping and self._warm_time():
                self._spawn()
            for key, _ in self.selector.select(POLL_S):
                if key.fileobj in self.selector.get_map():  # not unregistered by the one before
                    getattr(self, f"_on_{key.data}")()
        self.close()

    def _warm_time(self) -> bool:
        """Whether the next standby may import now: the slot's worker trained
        :data:`TRAINED_FOR_S` past its first step (its rank log says when), or it is
        :data:`WARM_AFTER_S` since the keeper's start or the last takeover."""
        now = time.monotonic()
        if self.first_steps.seen():
            self.warm_at = min(self.warm_at, now + TRAINED_FOR_S)
        return now >= self.warm_at

    def close(self) -> None:
        """Kill what is left (an idle standby; a worker whose job is ending) and leave."""
        for left in (self.child, self.worker):
            if left is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(left.pidfd, signal.SIGKILL)
                left.process.wait()
                _release(left)
        self.listener.close()

    def _spawn(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "hpctf", "standby", str(self.run.path), "--child"]
        process = subprocess.Popen([*argv, str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        self.child = _Child(process, mine, os.pidfd_open(process.pid))
        self.selector.register(mine, selectors.EVENT_READ, "child_says")
        self.selector.register(self.child.pidfd, selectors.EVENT_READ, "child_ended")
        log.info("standby %d importing TensorFlow", process.pid)

    def _on_child_says(self) -> None:
        assert self.child is not None
        message, fds = wire.receive(self.child.pair)
        for fd in fds:
            os.close(fd)
        if message is not None and message.get("ready"):
            self.child.ready = True
            log.info("standby %d ready", self.child.process.pid)
        elif message is None:  # it is ending: its pidfd says when
            self.selector.unregister(self.child.pair)

    def _on_child_ended(self) -> None:
        """An idle standby ended (its import failed, or a signal): another later."""
        assert self.child is not None
        child, self.child = self.child, None
        code = child.process.wait()
        self._forget(child)
        log.warning("standby %d ended idle (%d)", child.process.pid, code)
        self.warm_at = time.monotonic() + RETRY_AFTER_S
        self.first_steps = FirstSteps(self.first_steps.path)

    def _on_worker_ended(self) -> None:
        """The worker ended: its exit status to its task, and its own tmp removed."""
        assert self.worker is not None
        worker, self.worker = self.worker, None
        code = worker.process.wait()
        self._forget(worker)
        remove_left_behind(Path(tempfile.gettempdir()))  # a killed worker's own directory
        if self.serving is not None:
            with contextlib.suppress(OSError):
                wire.send(self.serving, {"exit": code})
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.serving)
            self.serving.close()
            self.serving = None
        log.info("worker %d ended (%d)", worker.process.pid, code)

    def _forget(self, gone: _Child) -> None:
        for end in (gone.pair, gone.pidfd):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(end)
        _release(gone)

    def _on_serving(self) -> None:
        """The task's connection: readable only when the task is gone (it sends no more)."""
        assert self.serving is not None
        with contextlib.suppress(wire.StandbyRefused, OSError):
            message, fds = wire.receive(self.serving)
            for fd in fds:
                os.close(fd)
            if message is not None:
                return
        # The task Slurm started is gone (killed): its worker must not outlive it.
        self.selector.unregister(self.serving)
        if self.worker is not None:
            log.warning("the task of worker %d is gone: killing it", self.worker.process.pid)
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.worker.pidfd, signal.SIGKILL)

    def _on_listen(self) -> None:
        conn, _ = self.listener.accept()
        try:
            self._take(conn)
        except (wire.StandbyRefused, OSError) as exc:
            with contextlib.suppress(OSError):
                wire.send(conn, {"refused": str(exc)})
            conn.close()
            log.info("refused a takeover: %s", exc)

    def _take(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        asker = wire.check_same_user(conn)
        message, fds = wire.receive(conn)
        try:
            if message is None:
                raise wire.StandbyRefused(f"process {asker} left without asking")
            self._check(message, len(fds))
            assert self.child is not None
            wire.send(self.child.pair, message, fds)
        finally:
            for fd in fds:
                os.close(fd)
        worker, self.child = self.child, None
        self.selector.unregister(worker.pair)
        self.selector.modify(worker.pidfd, selectors.EVENT_READ, "worker_ended")
        self.worker = worker
        conn.settimeout(None)
        wire.send(conn, {"accepted": worker.process.pid})
        self.serving = conn
        self.selector.register(conn, selectors.EVENT_READ, "serving")
        log.info("standby %d became the worker of task %d", worker.process.pid, asker)
        # The next standby once this worker has trained its first step.
        self.first_steps = FirstSteps(self.first_steps.path)
        self.warm_at = time.monotonic() + WARM_AFTER_S

    def _check(self, message: dict[str, Any], fds: int) -> None:
        if self.child is None or not self.child.ready or self.worker is not None:
            raise wire.StandbyRefused("no standby ready")
        handed = message.get("env")
        if fds != 3 or not isinstance(handed, dict) or not isinstance(message.get("cwd"), str):
            raise wire.StandbyRefused("a request without an environment and 3 descriptors")
        if message.get("run_dir") != str(self.run.path):
            raise wire.StandbyRefused(f"this standby is for {self.run.path}")
        if (why := gpu_mismatch(self.env, handed)) is not None:
            raise wire.StandbyRefused(why)


def _release(gone: _Child) -> None:
    """Close what the keeper held of a child that ended."""
    gone.pair.close()
    with contextlib.suppress(OSError):
        os.close(gone.pidfd)
    gone.pidfd = -1


def keep(run_dir: Path, env: Mapping[str, str]) -> int:
    """The keeper of this task slot's standby, until SIGTERM (the batch script ends it with its
    job); 0 when there is nothing to keep (not a Slurm task, no private socket possible)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s standby: %(message)s", datefmt="%H:%M:%S"
    )
    path = wire.socket_path(env)
    if path is None:
        log.info("no standby: not a Slurm task, or no socket path short enough")
        return 0
    # Sockets of this user's keepers killed outright on this node (their jobs ended).
    wire.remove_stale(path.parent.parent, env.get("SLURMD_NODENAME", ""), keep=path.parent)
    try:
        wire.private_folder(path.parent, make=True)
    except wire.StandbyRefused as exc:
        log.warning("no standby: %s", exc)
        return 0
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # an earlier keeper's, in this user's own folder
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(4)
    keeper = Keeper(RunDir(run_dir.resolve()), listener, env)

    def stop(signum: int, _: object) -> None:
        keeper.stopping = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    # Slurm's --signal warning reaches every step of the job, this one too: it is the
    # workers' business (their tasks relay it). Ignored here and, inherited, in the idle
    # standby, which restores it when it becomes a worker.
    for signum in WARNINGS:
        signal.signal(signum, signal.SIG_IGN)
    try:
        keeper.run_forever()
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):  # the last slot's keeper on this node removes it
            path.parent.rmdir()
    return 0


def _die_with_parent() -> None:
    """SIGKILL this process when its keeper dies (prctl PR_SET_PDEATHSIG), so that neither an
    idle standby nor the worker it became outlives the keeper's step."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the keeper died before the prctl
        os.kill(os.getpid(), signal.SIGKILL)


def wait_for_takeover(run_dir: Path, fd: int) -> Path | None:
    """The standby child: import what a worker imports, say ready on ``fd`` (the keeper's
    socket), and wait for a task to take over; returns its run directory once this process is
    that task (its environment, descriptors, directory and CPUs), None when the keeper left."""
    _die_with_parent()
    pair = socket.socket(fileno=fd)
    run = RunDir(run_dir.resolve())
    config = run.load_config()
    from hpctf.compute.script.entry import keras_environment

    os.environ.update(keras_environment(config.experiment.train))  # TF reads it at import
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from hpctf.compute.compat import tensorflow_internals
    from hpctf.compute.loop import training  # noqa: F401  (TensorFlow, Keras, the loop)

    if tensorflow_internals.eager_context_started():  # TF_CONFIG would be read too late
        raise RuntimeError("TensorFlow's context started in a standby before any takeover")
    wire.send(pair, {"ready": True})
    message, fds = wire.receive(pair)
    pair.close()
    if message is None:
        return None
    become(message, fds)
    return Path(message["run_dir"])


def become(message: Mapping[str, Any], fds: list[int]) -> None:
    """Turn this process into the task that sent ``message``: its stdin, stdout and stderr
    (``fds``), environment, working directory, CPUs, and its start on the startup clock."""
    sys.stdout.flush()
    sys.stderr.flush()
    for signum in WARNINGS:  # ignored while it waited (keep): a worker's from here on
        signal.signal(signum, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # The process's C environment too (os.environ's putenv/unsetenv): CUDA and NCCL read it.
    os.environ.clear()
    os.environ.update(message["env"])
    os.chdir(message["cwd"])
    if cpus := message.get("cpus"):
        with contextlib.suppress(OSError):  # a CPU outside this step's cpuset: keep its own
            os.sched_setaffinity(0, cpus)
    startup_clock.restart(float(message["started"]), "standby takeover")
