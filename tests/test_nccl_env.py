"""NCCL_SOCKET_IFNAME and NCCL_IB_HCA against the node (hpctf/compute/doctor/nccl_env.py), on
fake /sys/class trees named as a DGX H100's (DGX H100 user guide: IPoIB interfaces ibp24s0...,
compute rails mlx5_0,3,4,5,6,9,10,11 on InfiniBand; mlx5_1,2,7,8 the storage/management
ConnectX-7s, here on Ethernet). The real worker on this machine's own /sys/class/net:
tests/test_quick_preflight.py.

No InfiniBand node has run this: the trees are what the guide and sysfs's layout say.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctf.compute.cluster.spec import cluster_spec
from hpctf.compute.doctor.infiniband import read_infiniband
from hpctf.compute.doctor.nccl_env import (
    Interface,
    hca_rails_check,
    parse_name_list,
    read_interfaces,
    socket_ifname_check,
)
from hpctf.compute.start.quick_preflight import before_tensorflow
from hpctf.login.submitting.local import task_environment
from tests.conftest import write

RAILS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
STORAGE = ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]
IPOIB = ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"]
DGX_H100_RAILS = "=" + ",".join(RAILS)


def dgx_h100(root: Path) -> Path:
    """A /sys/class with net/ and infiniband/ as on a DGX H100 (the parts NCCL reads)."""
    net = root / "net"
    for name, state, kind in [
        ("lo", "unknown", "772"),
        ("eno3", "up", "1"),  # the BMC-side management port
        ("enp170s0f0np0", "up", "1"),  # storage, Ethernet
        ("docker0", "down", "1"),
        *[(name, "up", "32") for name in IPOIB],
    ]:
        write(net / name / "operstate", state + "\n")
        write(net / name / "type", kind + "\n")
    for device in RAILS + STORAGE:
        port = root / "infiniband" / device / "ports" / "1"
        rail = device in RAILS
        write(port / "state", "4: ACTIVE\n")
        write(port / "rate", ("400 Gb/sec (4X NDR)" if rail else "200 Gb/sec (4X HDR)") + "\n")
        write(port / "link_layer", ("InfiniBand" if rail else "Ethernet") + "\n")
    return root


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return dgx_h100(tmp_path / "sys" / "class")


def ifname(node: Path, value: str | None) -> tuple[str, str]:
    check = socket_ifname_check(read_interfaces(node / "net"), value)
    assert "\n" not in check.detail
    return check.status, check.detail


def test_ib0_on_a_node_with_ibp24s0_fails_naming_the_nodes_interfaces(node: Path) -> None:
    status, detail = ifname(node, "ib0")
    assert status == "fail"
    assert detail.startswith(
        "NCCL_SOCKET_IFNAME=ib0 matches none of this node's interfaces (docker0, eno3, "
        "enp170s0f0np0, ibp154s0, "
    )
    assert "ibp24s0" in detail and "no socket interface found" in detail


@pytest.mark.parametrize(
    ("value", "status", "takes"),
    [
        ("ib", "ok", "ibp154s0 up"),  # prefix: every IPoIB interface
        ("^lo,docker", "ok", "eno3 up"),  # any but loopback and docker
        ("=ibp24s0", "ok", "ibp24s0 up"),
        ("=ibp24", "fail", "matches none"),  # exact: no such interface
        ("^=lo,=docker0", "ok", "eno3 up"),  # ^ then = : every name exact
        ("docker", "fail", "matches only interfaces that are down (docker0 down)"),
        ("lo", "warn", "leaves only loopback"),
        (None, "skip", "NCCL_SOCKET_IFNAME unset"),
    ],
)
def test_nccl_socket_ifname_rules(node: Path, value: str | None, status: str, takes: str) -> None:
    got, detail = ifname(node, value)
    assert got == status, detail
    assert takes in detail


def test_name_lists_follow_nccls_rules() -> None:
    exact = parse_name_list("=mlx5_1:1,mlx5_2", ports=True)
    assert exact.selects("mlx5_1", "1") and not exact.selects("mlx5_1", "2")
    assert not exact.selects("mlx5_10", "1")  # exact: mlx5_1 is not a prefix here
    assert parse_name_list("mlx5_1", ports=True).selects("mlx5_10", "1")  # prefix
    assert not parse_name_list("^mlx5_1", ports=True).selects("mlx5_11", "1")
    assert parse_name_list("^=mlx5_1", ports=True).selects("mlx5_11", "1")


def hca(node: Path, value: str | None) -> tuple[str, str]:
    check = hca_rails_check(read_infiniband(node / "infiniband"), value)
    assert "\n" not in check.detail
    return check.status, check.detail


def test_the_dgx_h100_rails_are_accepted(node: Path) -> None:
    status, detail = hca(node, DGX_H100_RAILS)
    assert status == "ok", detail
    assert hca(node, None)[0] == "skip"  # left to NCCL


def test_mlx5_0_to_7_on_a_dgx_h100_is_flagged(node: Path) -> None:
    status, detail = hca(node, "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7")
    assert status == "fail"
    assert "mixes link layers (Ethernet: mlx5_1:1, mlx5_2:1, mlx5_7:1; InfiniBand: " in detail
    assert "the node has Ethernet: mlx5_1:1, mlx5_2:1, mlx5_7:1, mlx5_8:1; InfiniBand:" in detail


def test_dropped_rails_warn(node: Path) -> None:
    status, detail = hca(node, "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6")
    assert status == "warn"
    assert "leaves out mlx5_10:1, mlx5_11:1, mlx5_9:1, active and like the 5 it takes" in detail


def test_read_interfaces(node: Path, tmp_path: Path) -> None:
    assert read_interfaces(tmp_path / "absent") is None
    found = read_interfaces(node / "net")
    assert found is not None
    assert Interface("ibp24s0", "up", "32") in found
    assert Interface("lo", "unknown", "772") in found


def test_the_preflight_runs_both_on_the_nodes_first_task(node: Path) -> None:
    spec = cluster_spec(task_environment(os.environ, 7, 1, 0), (20000, 30000))
    env = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": DGX_H100_RAILS}
    checks = {c.check: c for c in before_tensorflow(spec, env, sys_class=node)}
    assert checks["nccl_socket_ifname"].status == "fail"
    assert checks["nccl_ib_hca"].status == "ok"
    assert checks["infiniband"].status == "ok"
