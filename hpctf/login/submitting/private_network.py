"""A local run's workers in a network namespace of their own, so that TensorFlow's ports are not
a door into the user's account.

TensorFlow's worker server listens on every interface and authenticates nobody: any user of
the machine who reaches a worker's port can open ``tf.compat.v1.Session("grpc://HOST:PORT")``
and run ops in it as the run's user (read ``/proc/self/environ`` and its secrets, write
``~/.ssh/authorized_keys``). TF documents its distributed runtime as for trusted networks only.

On a local site (``worker_network: private``, the default) the launcher starts one holder
process in a new user and network namespace (``unshare --user --map-root-user --net``, which
an unprivileged user may do where the kernel allows it), brings its loopback up, and starts
every worker inside it (``nsenter --preserve-credentials -U -n -t HOLDER``): the workers reach
each other over the namespace's own loopback, and nothing outside it, another user or the
network, reaches them. Inside, the workers have no network but that loopback; a run whose
tracker must reach a server, or a site with ``worker_network: host``, runs them on this
machine's network instead, and the launcher says so in one line, as it does where the kernel
refuses the namespace.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctf.core.settings.config import ResolvedConfig

# Run inside the new namespaces, as the namespace's root: bring lo up (SIOCGIFFLAGS, then
# SIOCSIFFLAGS with IFF_UP; struct ifreq is 40 bytes), say so, then hold the namespace open
# until the launcher closes our stdin (or dies).
_HOLDER = """
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
print("up", flush=True)
sys.stdin.read()
"""
READY_S = 10.0  # for the holder to say its loopback is up


@dataclass
class PrivateNetwork:
    """The holder of the workers' namespace; :meth:`command` runs a worker inside it."""

    holder: subprocess.Popen[bytes]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace, with this user's credentials kept."""
        pid = str(self.holder.pid)
        return ["nsenter", "--preserve-credentials", "-U", "-n", "-t", pid, "--", *argv]

    def close(self) -> None:
        """End the holder: the namespace goes with its last process."""
        with contextlib.suppress(OSError):
            if self.holder.stdin is not None:
                self.holder.stdin.close()
        try:
            self.holder.wait(2)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()


def network_needed(config: ResolvedConfig, env: Mapping[str, str]) -> str | None:
    """Why this run's workers need this machine's network (None: they do not): a tracker that
    sends to a server."""
    tracking = config.experiment.tracking
    if tracking.mlflow is not None:
        uri = tracking.mlflow.tracking_uri or env.get("MLFLOW_TRACKING_URI", "")
        if uri and not uri.startswith(("file:", "/", ".")):
            return "tracking.mlflow sends to a server"
    if tracking.wandb is not None:
        mode = tracking.wandb.mode or env.get("WANDB_MODE") or "online"
        if mode == "online":
            return "tracking.wandb is online"
    return None


def open_private_network(
    config: ResolvedConfig, env: Mapping[str, str]
) -> tuple[PrivateNetwork | None, str]:
    """The namespace for this run's workers, and the one line the launcher says of it; None
    when the workers run on this machine's network (the line says why)."""
    open_ports = "TensorFlow's ports of its workers are open to every user of this machine"
    if config.site.worker_network == "host":
        return None, f"{open_ports} (the site's worker_network: host)"
    needed = network_needed(config, env)
    if needed is not None:
        return None, f"{open_ports}: {needed} (the workers need this machine's network)"
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return None, f"{open_ports}: no {' or '.join(missing)} here (util-linux)"
    holder = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "--", sys.executable, "-c", _HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C is the launcher's to handle
    )
    assert holder.stdout is not None and holder.stderr is not None  # PIPE given
    ready, _, _ = select.select([holder.stdout], [], [], READY_S)
    said = holder.stdout.readline() if ready else b""
    if said.strip() != b"up":
        holder.kill()
        _, error = holder.communicate()
        why = (error.decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
        return None, f"{open_ports}: this kernel refused a private network namespace ({why[:160]})"
    network = PrivateNetwork(holder)
    probe = subprocess.run(network.command(["true"]), capture_output=True, check=False)
    if probe.returncode != 0:
        network.close()
        why = (probe.stderr.decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
        return None, f"{open_ports}: cannot enter a private network namespace ({why[:160]})"
    return network, (
        "the workers run in a private network namespace: only they reach TensorFlow's ports, "
        "and they reach no network but their own loopback (worker_network: host to share it)"
    )
