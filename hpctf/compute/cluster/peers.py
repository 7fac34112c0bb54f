"""A peer's death is nobody's bug: TensorFlow's error when a rank stops answering, turned into
one line that names the rank and its host, as the environment's fault.

When a rank dies (killed, out of memory, its node lost) or freezes, the others fail in their
next collective with a gRPC status (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ...) whose text
names the task: ``remote target /job:worker/replica:0/task:1 ... Connection reset by peer``
(killed), ``The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1`` (frozen, seen by the coordination service on rank 0), or only
``RPC: /tensorflow.CoordinationService/Heartbeat`` (rank 0 frozen: the heartbeats to it time
out). Pure: the message in, the line out.
"""

from __future__ import annotations

import re

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.core.errors import EnvironmentProblem

_TASK = re.compile(r"/job:worker(?:/replica:\d+)?/task:(\d+)")
_CAUSE = re.compile(r"aborted by: (.+)")
_HEARTBEAT = "CoordinationService/Heartbeat"
# The gRPC statuses of a peer that went away; anything else is not a peer's loss.
PEER_LOSS_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED"})


class PeerLost(EnvironmentProblem):
    """Another rank stopped answering. Exit 3 like every environment problem, but not
    recorded as ``environment_failed``: a requeue (other nodes, a new process) may well
    succeed, so the run's failure budget decides."""

    def __init__(self, line: str) -> None:
        # The line carries TensorFlow's status and words; its traceback stays in the rank log.
        super().__init__(line, cause_said=True)


def lost_peer(code: str, message: str, spec: ClusterSpec) -> PeerLost | None:
    """The error to raise for TensorFlow's error ``code`` (its gRPC status name) and
    ``message`` on this rank, when they say a peer stopped answering; None otherwise."""
    if code not in PEER_LOSS_CODES:
        return None
    ranks = sorted({int(n) for n in _TASK.findall(message)} - {spec.task_index})
    if not ranks and _HEARTBEAT in message and not spec.is_chief:
        ranks = [0]  # the coordination service's leader: every heartbeat goes to rank 0
    ranks = [rank for rank in ranks if rank < len(spec.workers)]
    if not ranks:
        return None
    who = ", ".join(f"rank {r} ({spec.workers[r]} on node {spec.nodes[r]})" for r in ranks)
    cause = _CAUSE.search(message)
    said = (cause.group(1) if cause else message.strip().splitlines()[0]).strip()
    return PeerLost(
        f"{who} stopped answering ({code}: {said[:200]}): it was killed, ran out of memory, froze, "
        f"or lost its node; this rank ({spec.task_index} on {spec.node}) stops too. The cause is "
        "in that rank's log and in what Slurm says of the job"
    )
