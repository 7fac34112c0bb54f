"""Can NCCL reach InfiniBand from where the worker runs (hpctf/compute/doctor/verbs.py): the real
ctypes path against small libibverbs stand-ins compiled here (gcc), one that lists 2 devices and
one that lists none (a missing provider), and a name that does not load (an image without
rdma-core). No InfiniBand or container has run this: the stand-ins export the two functions the
check calls, with libibverbs's signatures."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpctf.compute.cluster.spec import cluster_spec
from hpctf.compute.doctor.infiniband import IbPort
from hpctf.compute.doctor.verbs import load_verbs, verbs_check
from hpctf.compute.start.quick_preflight import before_tensorflow
from hpctf.login.submitting.local import task_environment
from tests.conftest import write

STAND_IN = """
#include <stdlib.h>
struct ibv_device;
struct ibv_device **ibv_get_device_list(int *num) {
    *num = %d;
    return calloc(%d + 1, sizeof(struct ibv_device *));
}
void ibv_free_device_list(struct ibv_device **list) { free(list); }
"""

PORTS = [IbPort(f"mlx5_{i}", "1", "ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand") for i in (0, 3)]
IMAGE = "docker://tensorflow/tensorflow:2.15.0-gpu"


def stand_in(directory: Path, devices: int) -> str:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the libibverbs stand-in")
    source = write(directory / f"verbs{devices}.c", STAND_IN % (devices, devices))
    library = directory / f"libibverbs-{devices}.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_a_library_that_lists_the_devices_passes(tmp_path: Path) -> None:
    loaded = load_verbs([stand_in(tmp_path, 2)])
    assert loaded == (2, "")
    check = verbs_check(PORTS, loaded, IMAGE)
    assert (check.status, check.detail) == (
        "ok",
        "libibverbs lists 2 device(s); the node has 2 ACTIVE InfiniBand port(s) (mlx5_0:1, ...)",
    )


def test_an_image_without_libibverbs_stops_in_one_line_naming_it(tmp_path: Path) -> None:
    loaded = load_verbs([str(tmp_path / "libibverbs.so.1")])  # absent: what such an image has
    assert loaded[0] is None and "libibverbs.so.1" in loaded[1]
    check = verbs_check(PORTS, loaded, IMAGE)
    assert check.status == "fail"
    assert check.detail.startswith(f"container image {IMAGE} cannot load libibverbs (")
    assert check.detail.endswith("NCCL would fall back to TCP sockets")
    assert "\n" not in check.detail and "rdma-core" in check.fix


def test_a_library_without_a_provider_lists_nothing_and_fails(tmp_path: Path) -> None:
    check = verbs_check(PORTS, load_verbs([stand_in(tmp_path, 0)]), None)
    assert check.status == "fail"
    assert check.detail.startswith("libibverbs in the worker's environment lists no device")


def test_no_active_infiniband_needs_no_libibverbs() -> None:
    down = [IbPort("mlx5_0", "1", "DOWN"), IbPort("mlx5_1", "1", "ACTIVE", "", "Ethernet")]
    assert verbs_check(down, (None, "x"), IMAGE).status == "skip"
    assert verbs_check(None, (None, "x"), IMAGE).status == "skip"


def test_the_preflight_checks_libibverbs_where_the_node_has_infiniband(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    write(port / "state", "4: ACTIVE\n")
    write(port / "link_layer", "InfiniBand\n")
    spec = cluster_spec(task_environment(os.environ, 7, 1, 0), (20000, 30000))
    checks = {c.check: c for c in before_tensorflow(spec, {}, sys_class=tmp_path / "class")}
    verbs = checks["verbs"]
    # This machine's own libibverbs, if any: loaded for real; without one, the image-less line.
    if load_verbs()[0] is None:
        assert verbs.status == "fail" and "the worker's environment cannot load" in verbs.detail
    else:
        assert verbs.status in ("ok", "fail")
