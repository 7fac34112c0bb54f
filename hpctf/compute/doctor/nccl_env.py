"""NCCL's network settings against the node, before the first collective: ``NCCL_SOCKET_IFNAME``
against its interfaces (/sys/class/net) and ``NCCL_IB_HCA`` against its HCAs' ports and link
layers (/sys/class/infiniband, read by :func:`hpctf.compute.doctor.infiniband.read_infiniband`).

Why here: a ``NCCL_SOCKET_IFNAME`` that matches nothing is no configuration error to NCCL; the
job starts and stops at the first collective with "Bootstrap : no socket interface found"
(NVIDIA/nccl#952). IPoIB interfaces on current systems are named ``ibp24s0``, ``ibs85f0``
(predictable names; DGX H100 user guide), not ``ib0``. And an ``NCCL_IB_HCA`` list written for
another machine can take storage HCAs (Ethernet, RoCE) beside the compute rails and drop rails:
NCCL runs, slower, and nothing says so.

NCCL's own rules for both variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):
a comma-separated list of prefixes (``ib`` matches ``ib0``, ``ibp24s0``); a leading ``^``
excludes what the list matches; ``=`` after it makes every name exact (``=mlx5_1`` is not
mlx5_10); for HCAs ``name:port`` names one port. Unset ``NCCL_SOCKET_IFNAME``: NCCL takes an
``ib*`` interface first, else any but ``lo`` and ``docker*``.

Pure functions take what was read; :func:`read_interfaces` takes the sysfs root as a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctf.compute.doctor.infiniband import IbPort, sysfs_text
from hpctf.compute.doctor.node_checks import Check

NET_ROOT = Path("/sys/class/net")

_FIND_INTERFACES = (
    "`ip -br addr` lists the node's interfaces and addresses (IPoIB ones have link/infiniband "
    "in `ip -br link`); use a prefix that fits every node (ib for IPoIB), or ^lo,docker for "
    "any but those"
)
_FIND_HCAS = (
    "`ibv_devinfo -l` lists the HCAs, `ibdev2netdev` (or /sys/class/infiniband/*/ports/*/"
    "link_layer) which are InfiniBand and which Ethernet; leave NCCL_IB_HCA unset to let NCCL "
    "pick, or list the compute rails of every node"
)


@dataclass(frozen=True)
class Interface:
    """One network interface, as /sys/class/net describes it."""

    name: str
    operstate: str = ""  # "up", "down", "unknown" (loopback and some IPoIB say unknown)
    kind: str = ""  # ARPHRD type: "1" Ethernet, "32" InfiniBand (IPoIB), "772" loopback


@dataclass(frozen=True)
class NameFilter:
    """A parsed NCCL name list: ``^`` exclude, ``=`` exact, and its (name, port or None)."""

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, str | None], ...]

    def matches(self, name: str, port: str | None = None) -> bool:
        """Whether the list names ``name`` (port ``port``), before ``^`` is applied."""
        for prefix, number in self.entries:
            named = name == prefix if self.exact else name.startswith(prefix)
            if named and (number is None or port is None or number == port):
                return True
        return False

    def selects(self, name: str, port: str | None = None) -> bool:
        """Whether NCCL would use ``name``: listed, or not listed under ``^``."""
        return self.matches(name, port) != self.exclude


def parse_name_list(text: str, ports: bool = False) -> NameFilter:
    """NCCL's list syntax (see the module's docstring). ``ports``: ``name:port`` entries."""
    text = text.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries: list[tuple[str, str | None]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if ports:
            name, _, port = item.partition(":")
            entries.append((name, port or None))
        else:
            entries.append((item, None))
    return NameFilter(exclude, exact, tuple(entries))


def read_interfaces(root: Path = NET_ROOT) -> list[Interface] | None:
    """The interfaces under ``root`` (/sys/class/net), or None when it does not exist."""
    if not root.is_dir():
        return None
    read = sysfs_text
    return [
        Interface(entry.name, read(entry / "operstate"), read(entry / "type"))
        for entry in sorted(root.iterdir(), key=lambda path: path.name)
    ]


def socket_ifname_check(interfaces: Sequence[Interface] | None, ifname: str | None) -> Check:
    """Judge ``NCCL_SOCKET_IFNAME`` against the node's interfaces (None: no /sys/class/net)."""
    if not ifname or not ifname.strip():
        return Check("nccl_socket_ifname", "skip", "NCCL_SOCKET_IFNAME unset: NCCL picks")
    if interfaces is None:
        return Check("nccl_socket_ifname", "skip", "no /sys/class/net to check it against")
    names = ", ".join(i.name for i in interfaces) or "none"
    wanted = parse_name_list(ifname)
    chosen = [i for i in interfaces if wanted.selects(i.name)]
    if not chosen:
        return Check(
            "nccl_socket_ifname",
            "fail",
            f"NCCL_SOCKET_IFNAME={ifname} matches none of this node's interfaces ({names}): "
            "NCCL would stop at its first collective (no socket interface found)",
            _FIND_INTERFACES,
        )
    usable = [i for i in chosen if i.operstate in ("up", "unknown", "")]
    shown = ", ".join(f"{i.name} {i.operstate}" if i.operstate else i.name for i in chosen)
    if not usable:
        return Check(
            "nccl_socket_ifname",
            "fail",
            f"NCCL_SOCKET_IFNAME={ifname} matches only interfaces that are down ({shown}); "
            f"the node has {names}",
            _FIND_INTERFACES,
        )
    if all(i.kind == "772" or i.name == "lo" for i in usable):
        return Check(
            "nccl_socket_ifname",
            "warn",
            f"NCCL_SOCKET_IFNAME={ifname} leaves only loopback ({shown}): other nodes cannot "
            f"reach it; the node has {names}",
            _FIND_INTERFACES,
        )
    return Check("nccl_socket_ifname", "ok", f"NCCL_SOCKET_IFNAME={ifname}: {shown}")


def hca_rails_check(ports: Sequence[IbPort] | None, hca: str | None) -> Check:
    """Judge the ports ``NCCL_IB_HCA`` selects by their link layers and speeds: a list that
    takes both InfiniBand and Ethernet (RoCE) ports mixes the compute rails with storage or
    management HCAs (fail); one that leaves out active ports like the ones it takes drops
    rails (warn). Names that the node lacks, and ports down, are
    :func:`hpctf.compute.doctor.infiniband.infiniband_check`'s."""
    if not hca or not hca.strip():
        return Check("nccl_ib_hca", "skip", "NCCL_IB_HCA unset: NCCL picks the HCAs")
    if not ports:
        return Check("nccl_ib_hca", "skip", "no InfiniBand ports to check it against")
    wanted = parse_name_list(hca, ports=True)
    chosen = [p for p in ports if wanted.selects(p.device, p.port)]
    if not chosen:  # infiniband_check says so
        return Check("nccl_ib_hca", "skip", f"NCCL_IB_HCA={hca} selects no port here")
    layers = {p.link_layer or "InfiniBand" for p in chosen}

    def by_layer(group: Sequence[IbPort]) -> str:
        found: dict[str, list[str]] = {}
        for p in group:
            found.setdefault(p.link_layer or "InfiniBand", []).append(p.name)
        return "; ".join(f"{layer}: {', '.join(names)}" for layer, names in sorted(found.items()))

    if len(layers) > 1:
        return Check(
            "nccl_ib_hca",
            "fail",
            f"NCCL_IB_HCA={hca} mixes link layers ({by_layer(chosen)}): storage or management "
            f"HCAs beside the compute rails; the node has {by_layer(ports)}",
            _FIND_HCAS,
        )
    like = {(p.link_layer or "InfiniBand", p.rate) for p in chosen}
    left = [
        p
        for p in ports
        if p not in chosen
        and p.state == "ACTIVE"
        and (p.link_layer or "InfiniBand", p.rate) in like
    ]
    if left:
        return Check(
            "nccl_ib_hca",
            "warn",
            f"NCCL_IB_HCA={hca} leaves out {', '.join(p.name for p in left)}, active and like "
            f"the {len(chosen)} it takes (rails dropped?); the node has {by_layer(ports)}",
            _FIND_HCAS,
        )
    return Check("nccl_ib_hca", "ok", f"NCCL_IB_HCA={hca}: {', '.join(p.name for p in chosen)}")
