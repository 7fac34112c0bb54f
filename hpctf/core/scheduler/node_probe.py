"""Whether a running job's nodes can still start a step: ``srun --overlap -w NODES true``
through the one wrapper (:func:`hpctf.core.scheduler.slurm.run_command`).

Slurm's own word on a node lags its loss: a node whose slurmd is gone stays up in Slurm's
view until it misses pings for SlurmdTimeout (300 s by default). srun usually waits that long
for the lost node's tasks, but not always: when the node's slurmstepd reported its tasks'
deaths before it died itself, srun ends at once (seen on Slurm 24.11 when a node's processes
were SIGKILLed together), and a step started there again would fail, 11 s later, with
"Communication connection failure" (MessageTimeout 10 s). A probe step answers in about
0.05 s from a node that is there; one that does not answer within :data:`PROBE_TIMEOUT_S` is
taken as lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from hpctf.core.scheduler.slurm import SlurmFailure, checked_job_ids, run_command

# A node that is there starts `true` in ~0.05 s (measured on the test cluster); a loaded one
# in well under a second.
PROBE_TIMEOUT_S = 3.0
# Probes of single nodes at once, after the probe of all of them failed.
MAX_PARALLEL = 32


def unreachable_nodes(
    job_id: str,
    nodes: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> list[str]:
    """The ``nodes`` of running job ``job_id`` (its own Slurm id) where a step does not start
    within ``timeout`` seconds, in their order: one probe of them all, then, only when it
    fails, one per node at once."""
    if not nodes or _starts(job_id, nodes, env, timeout):
        return []
    if len(nodes) == 1:
        return list(nodes)
    with ThreadPoolExecutor(min(len(nodes), MAX_PARALLEL)) as pool:
        fine = list(pool.map(lambda node: _starts(job_id, [node], env, timeout), nodes))
    return [node for node, ok in zip(nodes, fine, strict=True) if not ok]


def _starts(
    job_id: str, nodes: Sequence[str], env: Mapping[str, str] | None, timeout: float
) -> bool:
    """Whether a step of one ``true`` per node starts and ends on ``nodes`` within ``timeout``:
    --overlap, beside whatever steps the job still has (the one of a lost node among them)."""
    (checked,) = checked_job_ids([job_id])
    argv = [
        "srun",
        f"--jobid={checked}",
        "--overlap",
        "--quiet",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "true",
    ]
    try:
        run_command(argv, env=env, timeout=timeout)
    except SlurmFailure:
        return False
    return True
