"""The real Slurm test cluster (tests/slurm/cluster.sh) for a benchmark: started in a state
directory, ports and job ids of its own, so that it never meets a cluster of the tests or of
another benchmark running at the same time, and stopped (its state removed) afterwards.

    with slurm_cluster("crash") as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)

Where Slurm is not installed (:func:`slurm_missing`), the caller decides: a benchmark section
is skipped there unless HPCTF_REQUIRE_SLURM (or CI) asks for Slurm, as the tests do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
# What cluster.sh runs and what a benchmark calls; a machine without one of them has no Slurm.
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "scancel")
# Below the tests' clusters (16817 + 400 per pytest-xdist worker) and below the TF ports the
# local-slurm site draws for its jobs (21000-29000): a benchmark's cluster takes the first free
# block of PORT_STRIDE ports of PORT_BLOCKS from here.
FIRST_PORT = 12017
PORT_STRIDE = 400  # slurmctld PORT, slurmd PORT+1.., MariaDB PORT+300, slurmdbd PORT+301
PORT_BLOCKS = 10
# Blocks this process's clusters hold: the tiny run's lanes start theirs at the same moment, and
# a block is only bound once cluster.sh's daemons are up (seen: two lanes drew one block, and
# the second slurmd found its port taken).
_BLOCKS_HELD: set[int] = set()
_BLOCKS_LOCK = threading.Lock()


class SlurmClusterError(RuntimeError):
    """The test cluster did not start; the message holds cluster.sh's output."""


@dataclass(frozen=True)
class SlurmCluster:
    """A started test cluster: ``env`` is this process's environment with the cluster's
    knobs and SLURM_CONF, for every Slurm client and ``hpctf`` command a benchmark runs."""

    env: dict[str, str]
    conf: Path
    dir: Path
    port: int
    first_job_id: int


def slurm_missing() -> str | None:
    """Why the test cluster cannot start here (a tool not installed, not root), or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} not found): "
            "run tests/system-packages.sh as root"
        )
    if os.geteuid() != 0:
        return "the Slurm test cluster (tests/slurm/cluster.sh) needs root"
    return None


def slurm_required() -> bool:
    """Whether a benchmark must fail, not skip, where Slurm is missing (the tests' rule)."""
    return bool(os.environ.get("HPCTF_REQUIRE_SLURM") or os.environ.get("CI"))


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _hold_free_block(nodes: int, accounting: bool) -> int:
    """The first block of ports whose slurmctld, slurmd and database ports are all free and
    that no other cluster of this process holds, from one drawn by this process's id (so that
    two benchmark runs at once start apart); held until its cluster stops."""
    first = os.getpid() % PORT_BLOCKS
    with _BLOCKS_LOCK:
        for index in range(PORT_BLOCKS):
            base = FIRST_PORT + PORT_STRIDE * ((first + index) % PORT_BLOCKS)
            ports = [base + i for i in range(nodes + 1)]
            ports += [base + 300, base + 301] if accounting else []
            if base not in _BLOCKS_HELD and all(_free(port) for port in ports):
                _BLOCKS_HELD.add(base)
                return base
    raise SlurmClusterError(
        f"no free block of ports for a Slurm test cluster in {FIRST_PORT}-"
        f"{FIRST_PORT + PORT_STRIDE * PORT_BLOCKS}"
    )


@contextlib.contextmanager
def slurm_cluster(
    name: str,
    *,
    nodes: int = 2,
    accounting: bool = False,
    port: int | None = None,
    first_job_id: int | None = None,
    slurmd_timeout: int | None = None,
) -> Iterator[SlurmCluster]:
    """Start a test cluster of ``nodes`` nodes named ``name`` (its state in
    /tmp/hpctf-bench-slurm-NAME-PID: munged, running as the munge user, cannot enter a 0700
    temporary directory of root's), yield it, and stop it and remove its state however the
    body ends. ``port`` and ``first_job_id`` default to a free block of ports and a job id
    range drawn from it (TF's ports are drawn from job ids: two clusters must not share them).
    ``slurmd_timeout``: slurm.conf's SlurmdTimeout (cluster.sh's default 60 s otherwise)."""
    reason = slurm_missing()
    if reason:
        raise SlurmClusterError(reason)
    held = port is None
    base = port if port is not None else _hold_free_block(nodes, accounting)
    first = first_job_id if first_job_id is not None else 30_000_001 + (base % 100_000) * 100
    state = Path(f"/tmp/hpctf-bench-slurm-{name}-{os.getpid()}")
    knobs = {
        "HPCTF_SLURM_DIR": str(state),
        "HPCTF_SLURM_PORT": str(base),
        "HPCTF_SLURM_FIRST_JOB_ID": str(first),
        "HPCTF_SLURM_NODES": str(nodes),
        "HPCTF_SLURM_ACCOUNTING": "1" if accounting else "0",
    }
    if slurmd_timeout is not None:
        knobs["HPCTF_SLURM_SLURMD_TIMEOUT"] = str(slurmd_timeout)
    # Nothing of a cluster this process may itself run in, nor of another test cluster.
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SLURMD_", "HPCTF_SLURM_"))
    }
    env = {**inherited, **knobs}
    try:
        started = subprocess.run(
            [str(CLUSTER), "start"], env=env, capture_output=True, text=True, check=False
        )
        if started.returncode != 0:
            # slurmctld's own words: cluster.sh's output is cut to fit, and the state is
            # removed below (how a 24.11 client on PATH, "Invalid Protocol Version", was found).
            raise SlurmClusterError(
                f"the Slurm test cluster did not start (tests/slurm/cluster.sh start, exit "
                f"{started.returncode}):\n{started.stdout[-1500:]}{started.stderr[-2500:]}\n"
                f"===== slurmctld.log (last 25 lines)\n"
                f"{_tail(state / 'log' / 'slurmctld.log', 25)}"
            )
        conf = state / "etc" / "slurm.conf"
        yield SlurmCluster(
            env={**env, "SLURM_CONF": str(conf)},
            conf=conf,
            dir=state,
            port=base,
            first_job_id=first,
        )
    finally:
        subprocess.run([str(CLUSTER), "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
        if held:
            with _BLOCKS_LOCK:
                _BLOCKS_HELD.discard(base)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"
