"""``--site local``: the job's tasks as processes on this machine, without Slurm.

Each process gets the environment srun would give a task of a one-node job step, so the
worker runs exactly the code it runs under Slurm. Like ``srun --kill-on-bad-exit=1``, when one
task fails the others are stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from typing import IO

from hpctf.core.config import ResolvedConfig
from hpctf.core.errors import PREEMPTED_EXIT
from hpctf.core.rundir import RunDir


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


def _pump(source: IO[bytes], sink: IO[str]) -> None:
    chunk = source.read()
    if chunk:
        sink.write(chunk.decode(errors="replace"))
        sink.flush()


# How long the other ranks may take to exit after one exited 75 (they passed the same barrier).
PREEMPTION_GRACE_S = 60.0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def launch(config: ResolvedConfig, run: RunDir, env: Mapping[str, str], echo: IO[str]) -> int:
    """Run every task to the end; echo rank 0's log; return the job's exit code."""
    job_id = os.getpid()
    ntasks = config.ntasks
    base = {**env, **config.site.env, **config.experiment.env}
    run.record_start(str(job_id), nodes=socket.gethostname())
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(ntasks):
        with run.rank_log(rank).open("ab") as log_file:
            procs.append(
                subprocess.Popen(
                    [config.python, "-m", "hpctf", "worker", str(run.path)],
                    env=task_environment(base, job_id, ntasks, rank),
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    status = 0
    preempted_at: float | None = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    with run.rank_log(0).open("rb") as chief_log:
        chief_log.seek(0, os.SEEK_END)
        try:
            while any(p.poll() is None for p in procs):
                _pump(chief_log, echo)
                codes = [p.returncode for p in procs if p.returncode not in (None, 0)]
                # 75: a rank saved the agreed preemption step; the others are exiting too.
                failed = [code for code in codes if code != PREEMPTED_EXIT]
                if codes and preempted_at is None:
                    preempted_at = time.monotonic()
                overdue = preempted_at is not None and time.monotonic() > (
                    preempted_at + PREEMPTION_GRACE_S
                )
                if failed or overdue:
                    status = (failed or codes)[0]
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            status = 130
        finally:
            # SIGKILL, as srun does after KillWait: once the strategy exists TensorFlow's own
            # handler swallows SIGTERM, so a polite signal may never end a worker.
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            for proc in procs:
                proc.wait()
            _pump(chief_log, echo)
            signal.signal(signal.SIGTERM, previous)
    status = status or next((p.returncode for p in procs if p.returncode), 0)
    run.record_end(str(job_id), status, config.site.preemption.signal)
    return status
