"""The node's InfiniBand ports, read from /sys/class/infiniband (:func:`read_infiniband`), and
judged against the ``NCCL_IB_HCA`` the job exports (:func:`infiniband_check`, pure): a port
NCCL would use that is down, or a device the site names that this node lacks. One of the node
checks of :mod:`hpctf.compute.doctor.node_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctf.compute.doctor.node_checks import Check

IB_ROOT = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class IbPort:
    """One port of an InfiniBand (or RoCE) device, as /sys/class/infiniband describes it."""

    device: str
    port: str
    state: str  # "ACTIVE", "DOWN", "INIT", ... (sysfs says "4: ACTIVE")
    rate: str = ""  # "200 Gb/sec (4X HDR)"
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


def _hca_entries(hca: str) -> tuple[bool, bool, list[tuple[str, str | None]]]:
    """NCCL_IB_HCA as (exclude, exact, [(device, port or None)]): ``^`` excludes, ``=`` makes
    names exact (otherwise a prefix: ``mlx5_1`` also matches mlx5_10), ``dev:port`` one port."""
    text = hca.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    text = text.lstrip("=")
    entries: list[tuple[str, str | None]] = []
    for item in text.split(","):
        item = item.strip()
        if item:
            device, _, port = item.partition(":")
            entries.append((device, port or None))
    return exclude, exact, entries


def _matches(port: IbPort, entry: tuple[str, str | None], exact: bool) -> bool:
    device, number = entry
    named = port.device == device if exact else port.device.startswith(device)
    return named and (number is None or number == port.port)


def infiniband_check(ports: Sequence[IbPort] | None, hca: str | None) -> Check:
    """Judge the node's InfiniBand ports (None: no /sys/class/infiniband) against the
    ``NCCL_IB_HCA`` the job exports (None or empty: NCCL may use every port)."""
    exclude, exact, entries = _hca_entries(hca or "")
    listed = bool(entries) and not exclude
    if not ports:
        return _no_ports(ports, hca, listed)
    if entries:
        chosen = [p for p in ports if any(_matches(p, e, exact) for e in entries) != exclude]
    else:
        chosen = list(ports)
    missing = [
        f"{d}:{n}" if n else d
        for d, n in entries
        if not exclude and not any(_matches(p, (d, n), exact) for p in ports)
    ]
    have = ", ".join(p.name for p in ports)
    if missing:
        return Check(
            "infiniband",
            "fail",
            f"NCCL_IB_HCA={hca} names {', '.join(missing)}, which this node lacks (it has {have})",
            "correct NCCL_IB_HCA in the site's env (`ibv_devinfo -l` lists the devices)",
        )
    if not chosen:
        return Check(
            "infiniband",
            "fail",
            f"NCCL_IB_HCA={hca} leaves none of this node's ports ({have})",
            "correct NCCL_IB_HCA in the site's env (`ibv_devinfo -l` lists the devices)",
        )
    return _chosen_ports(chosen, listed)


def _no_ports(ports: Sequence[IbPort] | None, hca: str | None, listed: bool) -> Check:
    """A node without InfiniBand ports: skipped, or failed when ``NCCL_IB_HCA`` lists some."""
    where = "no /sys/class/infiniband" if ports is None else "no devices in /sys/class/infiniband"
    if listed:
        return Check(
            "infiniband",
            "fail",
            f"NCCL_IB_HCA={hca} but this node has {where}",
            "the node's InfiniBand driver is not loaded (tell the admins which node), or "
            "the site's NCCL_IB_HCA does not apply to these nodes",
        )
    return Check("infiniband", "skip", f"{where}: no InfiniBand on this node")


def _chosen_ports(chosen: Sequence[IbPort], listed: bool) -> Check:
    """The ports NCCL would use, each with its state: a port not ACTIVE fails where the site
    listed it or no port is ACTIVE, and warns otherwise."""
    down = [p for p in chosen if p.state != "ACTIVE"]
    shown = "; ".join(
        f"{p.name} {p.state}"
        + (f" {p.rate}" if p.rate else "")
        + (f" ({p.link_layer})" if p.link_layer and p.link_layer != "InfiniBand" else "")
        for p in chosen
    )
    if not down:
        return Check("infiniband", "ok", shown)
    fix = (
        "a port NCCL would use is not ACTIVE: check its link (`ibstat`, cable, switch port) "
        "and tell the admins which node; or leave it out with NCCL_IB_HCA in the site's env"
    )
    if listed or len(down) == len(chosen):
        return Check("infiniband", "fail", shown, fix)
    return Check("infiniband", "warn", shown, fix)


def sysfs_text(path: Path) -> str:
    """One sysfs attribute's value, "" where it cannot be read (a port gone, a driver that
    leaves the file out)."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def read_infiniband(root: Path = IB_ROOT) -> list[IbPort] | None:
    """The ports under ``root`` (/sys/class/infiniband), or None when it does not exist."""
    if not root.is_dir():
        return None
    read = sysfs_text

    ports = []
    for device in sorted(root.iterdir()):
        for port in sorted((device / "ports").glob("*")):
            state = read(port / "state")  # "4: ACTIVE"
            ports.append(
                IbPort(
                    device.name,
                    port.name,
                    state.partition(":")[2].strip() or state or "UNKNOWN",
                    read(port / "rate"),
                    read(port / "link_layer"),
                )
            )
    return ports
