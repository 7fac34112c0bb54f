"""``train.preflight: quick``: every rank checks its own node before it joins the others.

The cheap checks ``hpctf doctor`` runs per node (:mod:`hpctf.compute.doctor.node_checks`), without
its all-reduce. On the first task of each node: ``memlock``, ``infiniband``, NCCL's
``NCCL_IB_HCA`` and ``NCCL_SOCKET_IFNAME`` against the node
(:mod:`hpctf.compute.doctor.nccl_env`), ``verbs`` (libibverbs loads and lists devices where
InfiniBand is up: :mod:`hpctf.compute.doctor.verbs`). On every task: ``hostnames`` (this task's
address and the chief's, as the worker always checked: two lookups per task, not one per node),
``port``, and ``tensorflow`` (its build and GPUs against what Slurm gave the task) once
TensorFlow may be imported. A warning is logged and the rank goes on.

A failed check ends this rank before the strategy exists, so the others never wait in a
collective for it (srun --kill-on-bad-exit ends them): one line in the rank log naming node,
rank and check, a ``node_check_failed`` record in the run's journal, exit status
:data:`hpctf.core.errors.NODE_CHECK_EXIT` (69). The record is what reaches job-end: when srun
kills the other ranks it reports their 143 or 137, not the failed rank's 69 (measured on Slurm
22.05 with --kill-on-bad-exit=1). It reads::

    {"event": "node_check_failed", "time": ..., "job_id": "41", "node": "node017",
     "rank": 3, "check": "infiniband", "detail": "...", "fix": "..."}
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from hpctf.compute.cluster.gpus import Grant
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.doctor.infiniband import infiniband_check, read_infiniband
from hpctf.compute.doctor.nccl_env import hca_rails_check, read_interfaces, socket_ifname_check
from hpctf.compute.doctor.node_checks import (
    Check,
    hostnames_check,
    memlock_check,
    port_check,
    resolve_reason,
    tensorflow_check,
)
from hpctf.compute.doctor.verbs import load_verbs, verbs_check
from hpctf.compute.doctor.versions import version_check
from hpctf.core.errors import NODE_CHECK_EXIT
from hpctf.core.run import journal
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.version import VERSION

log = logging.getLogger("hpctf.worker")


def before_tensorflow(
    spec: ClusterSpec,
    env: Mapping[str, str],
    names: list[tuple[str, str]] | None = None,
    sys_class: Path = Path("/sys/class"),
    image: str | None = None,
) -> list[Check]:
    """The checks that need no TensorFlow, in the order doctor shows them. ``names``: the
    (address, node) pairs to resolve; by default this task's own and the chief's (``hpctf
    doctor`` gives every node's). ``sys_class``: where ``net/`` and ``infiniband/`` are read
    (a fake tree in tests). ``image``: the site's container image the worker runs in."""
    checks = []
    if spec.local_id == 0:  # node-wide: once per node
        ports = read_infiniband(sys_class / "infiniband")
        hca = env.get("NCCL_IB_HCA")
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        checks.append(memlock_check(soft, has_infiniband(ports, hca)))
        checks.append(infiniband_check(ports, hca))
        checks.append(hca_rails_check(ports, hca))
        interfaces = read_interfaces(sys_class / "net")
        checks.append(socket_ifname_check(interfaces, env.get("NCCL_SOCKET_IFNAME")))
        active = any(p.state == "ACTIVE" for p in ports or [])
        checks.append(verbs_check(ports, load_verbs() if active else (None, ""), image))
    if names is None:
        names = list(dict([(spec.host, spec.node), (spec.chief_host, spec.nodes[0])]).items())
    checks.append(hostnames_check(names, spec.hostname_template, resolve_reason))
    checks.append(port_check(spec))
    return checks


def has_infiniband(ports: Sequence[object] | None, hca: str | None) -> bool:
    """Whether this node has InfiniBand (or RoCE) to use: ports in sysfs, or an
    ``NCCL_IB_HCA`` that names devices (not one that excludes them with ``^``)."""
    return bool(ports) or bool(hca and not hca.startswith("^"))


def failure_line(spec: ClusterSpec, check: Check) -> str:
    """The one line a failed check leaves in the rank log."""
    fix = f"; fix: {check.fix}" if check.fix else ""
    return (
        f"node check failed on {spec.node} (rank {spec.task_index}): "
        f"{check.check}: {check.detail}{fix}"
    )


def judge(run: RunDir, spec: ClusterSpec, checks: Iterable[Check]) -> int | None:
    """Log ``checks``; on the first failure record it and return the exit status, else None."""
    checks = list(checks)
    for check in checks:
        if check.status == "warn":
            log.warning("node check %s on %s: %s", check.check, spec.node, check.detail)
    failed = next((c for c in checks if c.status == "fail"), None)
    if failed is None:
        shown = ", ".join(f"{c.check} {c.status}" for c in checks)
        log.info("node checks on %s: %s", spec.node, shown)
        return None
    log.error("%s", failure_line(spec, failed))
    journal.record_node_check_failed(
        run, spec.journal_job, spec.node, spec.task_index, failed.check, failed.detail, failed.fix
    )
    return NODE_CHECK_EXIT


def check_node(
    run: RunDir, spec: ClusterSpec, env: Mapping[str, str], image: str | None = None
) -> int | None:
    """Before TensorFlow: None when this node may go on, else the exit status (recorded).
    The chief also compares its hpctf with the host's (:mod:`hpctf.compute.doctor.versions`)."""
    checks = before_tensorflow(spec, env, image=image)
    if spec.is_chief:
        history = read_history(run)
        checks.append(version_check(history, spec.journal_job, VERSION, image))
    return judge(run, spec, checks)


def check_tensorflow(run: RunDir, spec: ClusterSpec, grant: Grant) -> int | None:
    """Import TensorFlow and judge it against ``grant``; as :func:`check_node`."""
    check, _facts = tensorflow_check(grant)
    return judge(run, spec, [check])
