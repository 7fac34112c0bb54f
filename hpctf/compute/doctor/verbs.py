"""Whether NCCL can reach InfiniBand from where the worker runs: ``libibverbs`` loads and lists
the node's devices. Checked by the worker itself, so inside the site's container when there is
one, before the strategy exists.

NCCL opens libibverbs at run time (dlopen); where that fails, or the library finds no device
(its provider, ``libmlx5`` from rdma-core, missing; /dev/infiniband not in the container), NCCL
falls back to TCP sockets and the job trains, slowly, with no error: images built from
``tensorflow/tensorflow:*-gpu`` lack rdma-core (NVIDIA/nccl#451;
NVIDIA/nvidia-container-toolkit#1877). Checked only where the node has an ACTIVE InfiniBand
port (sysfs, read outside the library: /sys is the host's inside pyxis and Apptainer).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from hpctf.compute.doctor.infiniband import IbPort
from hpctf.compute.doctor.node_checks import Check

LIBRARIES = ("libibverbs.so.1", "libibverbs.so")


def load_verbs(names: Sequence[str] = LIBRARIES) -> tuple[int | None, str]:
    """(the devices libibverbs lists, "") or (None, why no library loaded). Calls only
    ``ibv_get_device_list`` and ``ibv_free_device_list``: no device is opened."""
    why = "not found"
    for name in names:
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            why = str(exc)
            continue
        get = library.ibv_get_device_list
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.POINTER(ctypes.c_int)]
        count = ctypes.c_int(0)
        devices = get(ctypes.byref(count))
        if devices:
            free = library.ibv_free_device_list
            free.argtypes = [ctypes.c_void_p]
            free.restype = None
            free(devices)
        return count.value, ""
    return None, why


def verbs_check(
    ports: Sequence[IbPort] | None, loaded: tuple[int | None, str], image: str | None
) -> Check:
    """Judge :func:`load_verbs`'s answer against the node's ports; ``image``: the site's
    container image the worker runs in, if any (named in the line)."""
    active = [
        p
        for p in ports or []
        if p.state == "ACTIVE" and (p.link_layer or "InfiniBand") == "InfiniBand"
    ]
    if not active:
        return Check("verbs", "skip", "no ACTIVE InfiniBand port: NCCL needs no libibverbs here")
    count, why = loaded
    where = f"container image {image}" if image else "the worker's environment"
    have = f"the node has {len(active)} ACTIVE InfiniBand port(s) ({active[0].name}, ...)"
    fix = (
        "build the image with rdma-core (Debian/Ubuntu: ibverbs-providers libibverbs1) or on "
        "an NGC TensorFlow image, which has it"
        if image
        else "ask the admins for rdma-core (libibverbs and its providers) on the nodes"
    )
    if count is None:
        return Check(
            "verbs",
            "fail",
            f"{where} cannot load libibverbs ({why}) but {have}: NCCL would fall back to TCP "
            "sockets",
            fix,
        )
    if count == 0:
        return Check(
            "verbs",
            "fail",
            f"libibverbs in {where} lists no device but {have}: NCCL would fall back to TCP "
            "sockets (no provider such as libmlx5, or /dev/infiniband not passed in)",
            fix,
        )
    return Check("verbs", "ok", f"libibverbs lists {count} device(s); {have}")
