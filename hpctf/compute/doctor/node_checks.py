"""The checks of one node that need no other node: what ``hpctf preflight`` runs on every task
before the all-reduce, each returning a :class:`Check` (ok, warn, fail or skip, with a fix).

- ``tensorflow``: importable; its build (CUDA or CPU) and the GPUs it sees against what Slurm
  gave the task (:func:`check_tensorflow_gpus`);
- ``memlock``: the locked-memory limit, which RDMA needs unlimited;
- ``infiniband``: devices and port state under /sys/class/infiniband (skipped without it;
  :mod:`hpctf.compute.doctor.infiniband`);
- ``hostnames``: the names the site's ``hostname_template`` gives the nodes resolve here;
- ``port``: this task's worker port is free (:func:`check_port_free`);
- ``nccl``: an NCCL log scanned for a fallback to TCP sockets where InfiniBand exists.

The judging functions are pure; the ``read_``/``*_check(spec)`` ones look at this machine.
TensorFlow is imported inside :func:`tensorflow_check` only.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import resource
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.compute.cluster.gpus import Grant, check_gpus
from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.core.errors import UserError

_MEMLOCK_FIX = (
    "RDMA registers memory and needs `ulimit -l unlimited`: ask the admins for "
    "`* - memlock unlimited` in /etc/security/limits.conf and LimitMEMLOCK=infinity for slurmd; "
    "Slurm copies the submitting shell's limits by default (PropagateResourceLimits), so also "
    "raise it where you submit, or add `ulimit -l unlimited` to the site's setup"
)


@dataclass(frozen=True)
class Check:
    """One check's outcome on one task. ``status``: ok, warn, fail or skip."""

    check: str
    status: str
    detail: str
    fix: str = ""


# --- pure checks ------------------------------------------------------------------------------


def memlock_check(soft: int, infiniband: bool) -> Check:
    """The locked-memory limit (``RLIMIT_MEMLOCK``'s soft value, bytes or RLIM_INFINITY)."""
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", "ok", "unlimited")
    text = f"{soft // 1024} KiB"
    if not infiniband:
        return Check("memlock", "ok", f"{text} (no InfiniBand here: RDMA does not need it)")
    return Check("memlock", "warn", f"{text} with InfiniBand: RDMA may fail", _MEMLOCK_FIX)


def hostnames_check(
    names: Sequence[tuple[str, str]], template: str, resolve: Callable[[str], str | None]
) -> Check:
    """Whether every ``(address, node)`` resolves here; ``resolve`` returns why not, or None."""
    failed = [(address, node, why) for address, node in names if (why := resolve(address))]
    if not failed:
        shown = ", ".join(address for address, _ in names[:4])
        more = f" and {len(names) - 4} more" if len(names) > 4 else ""
        return Check("hostnames", "ok", f"{len(names)} name(s) resolve: {shown}{more}")
    shown = ", ".join(f"{address} ({node})" for address, node, _ in failed[:3])
    more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    verb = "does" if len(failed) == 1 else f"of {len(names)} names do"
    return Check(
        "hostnames",
        "fail",
        f"{shown}{more} {verb} not resolve here: {failed[0][2]}",
        f"hostname_template {template!r} must give names the nodes resolve: set it in the site "
        "file to the nodes' fast-network names (`getent hosts $(hostname)-ib`), or '{host}'",
    )


def resolve_reason(name: str) -> str | None:
    """None when ``name`` resolves, else why not (as the worker's own check looks it up)."""
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return str(exc.args[-1] if exc.args else exc)
    return None


_NETWORK_RE = re.compile(r"Using network (\S+)")
_NET_LINE_RE = re.compile(r"NET/(?:IB|Socket)\s*:\s*(?:Using|No device).*")


def scan_nccl_log(text: str, infiniband: bool, path: str) -> Check:
    """Judge NCCL's INFO log: with InfiniBand devices on the node, NCCL must not have fallen
    back to TCP sockets (``Using network Socket``, channels ``via NET/Socket``)."""
    if not text.strip():
        return Check(
            "nccl",
            "warn",
            f"NCCL wrote no log to {path}",
            "NCCL did not initialise or ignores NCCL_DEBUG_FILE: see the task's log",
        )
    networks = sorted(set(_NETWORK_RE.findall(text)))
    socket_used = "Socket" in networks or "via NET/Socket" in text
    lines = sorted(set(m.group(0).strip() for m in _NET_LINE_RE.finditer(text)))
    said = f"network {', '.join(networks) or 'not named'}" + (f"; {lines[0]}" if lines else "")
    if infiniband and socket_used:
        return Check(
            "nccl",
            "fail",
            f"NCCL fell back to TCP sockets (NET/Socket) on a node with InfiniBand: {said}",
            "NCCL cannot use the HCAs: libibverbs/rdma-core missing (often inside a container), "
            f"NCCL_IB_DISABLE=1, or an NCCL_IB_HCA that matches nothing; see {path}",
        )
    if not infiniband:
        return Check("nccl", "ok", f"{said} (no InfiniBand on this node)")
    return Check("nccl", "ok", said)


# --- the checks that need this machine -------------------------------------------------------


def tensorflow_packages_check(packages: Sequence[str], python: str) -> Check | None:
    """A failed check when more than one distribution provides the ``tensorflow`` module
    (``tensorflow`` and ``tensorflow-cpu`` after ``pip install tf_keras`` beside
    ``tensorflow-cpu``): they install the same files over each other, and which one's files
    are on disk depends on the order they were installed in. None when there is one or none."""
    if len(packages) < 2:
        return None
    return Check(
        "tensorflow",
        "fail",
        f"{len(packages)} TensorFlow packages are installed for {python}: "
        f"{', '.join(packages)}; they overwrite each other's files",
        f"{python} -m pip uninstall -y {' '.join(packages)}, then install one: "
        "pip install 'hpctf[tf]' (or hpctf[gpu]; add keras2 for tf_keras)",
    )


def tensorflow_check(grant: Grant) -> tuple[Check, dict[str, Any]]:
    """Import TensorFlow and judge it against ``grant``; the facts for the version check."""
    duplicate = tensorflow_packages_check(_tensorflow_packages(), sys.executable)
    if duplicate is not None:  # before the import: which files it loads is chance
        return duplicate, {}
    try:
        import tensorflow as tf
    except Exception as exc:  # ImportError, or a broken installation failing its own way
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Check(
            "tensorflow",
            "fail",
            f"cannot import tensorflow with {sys.executable}: {first}",
            "install hpctf[tf] (CPU nodes) or hpctf[gpu] (GPU nodes) into the python the site "
            "names (its venv or python) on every node",
        ), {}
    info = tf.sysconfig.get_build_info()
    if info.get("is_cuda_build"):
        build = f"CUDA {info.get('cuda_version', '?')} build"
    elif info.get("is_rocm_build"):
        build = "ROCm build"
    else:
        build = "CPU-only build"
    gpu_build = bool(tf.test.is_built_with_gpu_support())
    seen = len(tf.config.list_physical_devices("GPU")) if gpu_build else 0
    facts = {"tensorflow": tf.__version__, "build": build, "gpus_seen": seen}
    try:
        check_tensorflow_gpus(grant)
    except UserError as exc:
        return Check("tensorflow", "fail", str(exc)), facts
    given = f"Slurm gave {grant.count} ({grant.source})" if grant.count else "none requested"
    detail = f"TensorFlow {tf.__version__}, {build}, sees {seen} GPU(s); {given}"
    return Check("tensorflow", "ok", detail), facts


def port_check(spec: ClusterSpec) -> Check:
    try:
        check_port_free(spec.host, spec.port)
    except UserError as exc:
        return Check(
            "port",
            "fail",
            str(exc),
            f"find the listener with `ss -ltnp 'sport = :{spec.port}'` on {spec.node}: a "
            "leftover process of an earlier job, or a service inside the site's port_range",
        )
    return Check("port", "ok", f"worker port {spec.port} free")


def node_addresses(spec: ClusterSpec) -> list[tuple[str, str]]:
    """Every node's address (first task of a node), or this task's own and the chief's."""
    pairs = dict(
        (worker.rpartition(":")[0], node)
        for worker, node in zip(spec.workers, spec.nodes, strict=True)
    )
    if spec.local_id == 0:
        return list(pairs.items())
    return list({spec.host: spec.node, spec.chief_host: spec.nodes[0]}.items())


def check_port_free(host: str, port: int) -> None:
    """UserError naming host and port if something already listens on ``port`` here.

    TensorFlow's gRPC server listens on 0.0.0.0:PORT; on a taken port (even one taken on
    127.0.0.1 only) it fails with just "UNKNOWN: Could not start gRPC server", naming neither
    port nor host (measured with TF 2.21). The test socket binds the same wildcard address and
    is closed again at once (a small race remains; ports come from a window that moves with the
    job id, see :func:`hpctf.compute.cluster.spec.port_window`).
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # gRPC sets SO_REUSEADDR too, so a port in TIME_WAIT from an earlier run is free for it;
        # without the flag such a port would be reported as taken. A listening socket still
        # makes bind fail with EADDRINUSE.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise UserError(
                f"port {port} on {host} is taken ({exc.strerror}): another job or a leftover "
                "process listens there; hpctf picks ports from the site's port_range by job id"
            ) from None
        raise
    finally:
        probe.close()


def check_tensorflow_gpus(grant: Grant) -> None:
    """Import TensorFlow and stop with a UserError unless it can use the GPUs of ``grant``.

    Runs after :func:`prepare_environment` (CUDA_VISIBLE_DEVICES is final) and before the
    strategy exists; listing physical devices does not create TensorFlow's context, so MWMS
    still configures the devices afterwards. The decision is
    :func:`hpctf.compute.cluster.gpus.check_gpus`.
    """
    import tensorflow as tf  # the worker imports it next anyway (hpctf.compute.loop.training)

    if not grant.count:
        return
    cuda_build = bool(tf.test.is_built_with_gpu_support())
    seen = len(tf.config.list_physical_devices("GPU")) if cuda_build else 0
    check_gpus(
        grant.count,
        seen,
        cuda_build,
        tf.__version__,
        source=grant.source,
        device_files=grant.device_files,
        packages=_tensorflow_packages() if not cuda_build else (),
        machine=platform.machine(),
    )


def _tensorflow_packages(path: Sequence[str] | None = None) -> tuple[str, ...]:
    """The installed distributions that provide the ``tensorflow`` module (for messages), on
    ``path`` (default ``sys.path``).

    Every worker asks this before its first step, so only the distributions whose name could
    be a TensorFlow build (``*tensorflow*``, ``tf-nightly*``) are read, from their folder
    names: ``importlib.metadata.packages_distributions()`` reads every distribution's file
    list, 0.2 s of CPU (1.3 s under load) on this project's own venv. A candidate provides
    the module when its ``top_level.txt`` names it, or (without one) its ``RECORD`` holds a
    file under ``tensorflow/``.
    """
    found: set[str] = set()
    for folder in sys.path if path is None else path:
        try:
            entries = list(os.scandir(folder or "."))
        except OSError:  # a zip, a folder that is gone: no distributions there
            continue
        for entry in entries:
            stem, dot, kind = entry.name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            name = re.sub(r"[-_.]+", "-", stem.split("-")[0]).lower()  # PEP 503
            candidate = "tensorflow" in name or name.startswith("tf-nightly")
            if candidate and _provides_tensorflow(Path(entry.path)):
                found.add(name)
    return tuple(sorted(found))


def _provides_tensorflow(info: Path) -> bool:
    """Whether the distribution of metadata folder ``info`` installs the ``tensorflow``
    package; False when neither file can be read (a broken entry says nothing)."""
    try:
        return "tensorflow" in (info / "top_level.txt").read_text(errors="replace").split()
    except OSError:
        pass
    try:
        with (info / "RECORD").open(encoding="utf-8", errors="replace") as record:
            return any(line.startswith("tensorflow/") for line in record)
    except OSError:
        return False
