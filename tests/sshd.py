"""A real OpenSSH server for the SSH path's tests (Debian's openssh-server).

:func:`start_sshd` runs ``/usr/sbin/sshd -D`` as root on a loopback port with a throwaway
host key, ``PermitRootLogin no``, ``UsePAM no`` and ``LogLevel VERBOSE``; the only user it
lets in is :data:`USER`, a throwaway account, with a throwaway key. That user cannot run
this checkout's venv (its interpreter lives under root's 0700 home), and the clone itself may
sit under a folder only root may enter, so :func:`cluster_side` binds the checkout read-only
at a path of its own under /tmp and makes a venv from the system's python3 (the same 3.11)
that reads the checkout's site-packages there: the same hpctf, the same TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

SSHD = Path("/usr/sbin/sshd")
# Arguments that a shell would act on, each of which must reach the cluster as it is.
HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    "; touch {canary}",
    "' ; touch {canary} ; '",
    '" ; touch {canary} ; "',
    "a\nb; touch {canary}",
    "* ? [a] ~ {{x,y}} | & > {canary}",
    "${{HOME}} $HOME \\ !x %s %n",
    "-rf",
]
USER = "hpctfssh"


def ensure_user() -> pwd.struct_passwd:
    """The throwaway user, made once; its password field ``*`` (no password, and not the
    ``!`` of a locked account, which sshd without PAM refuses)."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", USER],
            check=True,
            capture_output=True,
        )
    subprocess.run(["usermod", "-p", "*", USER], check=True, capture_output=True)
    return pwd.getpwnam(USER)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpctf-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Sshd:
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def accepted(self) -> int:
        """How many logins it has accepted so far ("Accepted publickey" in its log)."""
        return self.log.read_text(errors="replace").count("Accepted publickey")

    def stop(self) -> None:
        """Stop it and the sessions it forked (which a stopped sshd leaves running)."""
        sessions = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        self.process.terminate()
        self.process.wait(timeout=10)
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)


def start_sshd(base: Path, name: str, env: dict[str, str], user_key_pub: str) -> Sshd:
    """Start one sshd under ``base/name``; ``env`` is set in every session it starts."""
    where = base / name
    where.mkdir()
    host_key = where / "host_ed25519"
    keygen(host_key)
    (where / "authorized_keys").write_text(user_key_pub + "\n")
    port = free_port()
    log = where / "sshd.log"
    set_env = " ".join(f'"{k}={v}"' for k, v in env.items())
    (where / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"PidFile {where / 'sshd.pid'}\nAuthorizedKeysFile {where / 'authorized_keys'}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin no\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n"
        f"AllowUsers {USER}\nAllowTcpForwarding yes\nMaxSessions 100\nMaxStartups 100\n"
        + (f"SetEnv {set_env}\n" if env else "")
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    process = subprocess.Popen(
        [str(SSHD), "-D", "-f", str(where / "sshd_config"), "-E", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # its sessions outlive it: they must hold none of our pipes
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited {process.returncode}: {log.read_text()}") from None
            time.sleep(0.1)
    with (base / "known_hosts").open("a") as known:
        known.write(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text()}")
    return Sshd(port, log, process)


REPO = Path(__file__).resolve().parent.parent


def reachable_checkout() -> Path:
    """This checkout where another user can read it, whatever folder the clone sits in: bound
    read-only at a folder of its own under /tmp (outside any folder a test removes), or the
    clone's own path where nothing can be mounted. :func:`release_checkout` undoes it. Made
    once per session, before the Slurm test cluster starts (conftest's ``checkout_for_others``),
    so that the emulated nodes' mount namespaces hold it too."""
    mount = Path(tempfile.mkdtemp(prefix="hpctf-checkout-", dir="/tmp"))
    mount.chmod(0o755)
    bound = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(REPO), str(mount)], capture_output=True, check=False
    )
    if bound.returncode != 0:
        mount.rmdir()
        return REPO
    return mount


def release_checkout(path: Path) -> None:
    if path != REPO:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            path.rmdir()  # an empty folder once unmounted; never a walk into the checkout


def cluster_side(base: Path, checkout: Path) -> tuple[Path, Path]:
    """A venv the test user can run (system python3 + this checkout's site-packages, both as
    they are seen through ``checkout``) and an ``hpctf`` command in it; returns (python,
    hpctf)."""
    venv = base / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    seen = checkout / ours.relative_to(REPO) if ours.is_relative_to(REPO) else ours
    # The checkout first on the path: the venv's editable install names the clone's own path.
    (venv / "lib" / "python3.11" / "site-packages" / "checkout.pth").write_text(
        f"import site, sys; site.addsitedir({str(seen)!r}); sys.path.insert(0, {str(checkout)!r})\n"
    )
    hpctf = base / "bin" / "hpctf"
    hpctf.parent.mkdir()
    hpctf.write_text(f'#!/bin/sh\nexec {venv}/bin/python -m hpctf "$@"\n')
    hpctf.chmod(0o755)
    return venv / "bin" / "python", hpctf


def usable() -> str | None:
    """Why the real-sshd tests cannot run here, or None."""
    if not SSHD.exists() or shutil.which("ssh") is None:
        return "openssh-server/openssh-client not installed (tests/system-packages.sh)"
    if os.geteuid() != 0:
        return "the sshd tests run sshd as root (a throwaway user logs in)"
    if not Path("/usr/bin/python3").exists() or sys.version_info[:2] != (3, 11):
        return "the sshd tests need /usr/bin/python3 of this interpreter's minor version"
    return None


@dataclass
class SetUp:
    """A login sshd and a jump sshd in front of this machine, and a laptop's environment whose
    sites ``cluster`` (runs under ``runs``), ``jumped`` (the same, through ``jump``) and
    ``skewed`` (a cluster hpctf that says it is 0.0.1) are behind them."""

    base: Path
    runs: Path
    login: Sshd
    jump: Sshd
    env: dict[str, str]

    def stop(self) -> None:
        """Stop both sshds; remove what they served (the runs, the keys, the laptop's cache)."""
        for host in ("cluster", "jumped"):  # the laptop's master connections
            subprocess.run(
                ["ssh", "-F", str(self.base / "ssh_config"), "-o",
                 f"ControlPath={self.env['XDG_CACHE_HOME']}/hpctf/ssh/%C", "-O", "exit", host],
                capture_output=True, check=False,
            )  # fmt: skip
        self.login.stop()
        self.jump.stop()
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.env["XDG_CACHE_HOME"], ignore_errors=True)


def set_up(slurm_conf: str | None, checkout: Path) -> SetUp:
    """``checkout``: this checkout where the login user reads it (:func:`reachable_checkout`,
    bound before the Slurm test cluster started: each emulated node's slurmd has a mount
    namespace of its own, copied when it starts)."""
    user = ensure_user()
    base = Path(tempfile.mkdtemp(prefix="hpctf-ssh-", dir="/tmp"))
    base.chmod(0o755)
    pub = keygen(base / "id_ed25519")
    python, hpctf = cluster_side(base, checkout)
    runs = base / "runs"
    runs.mkdir()
    os.chown(runs, user.pw_uid, user.pw_gid)
    session_env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    if slurm_conf:
        session_env["SLURM_CONF"] = slurm_conf
    login = start_sshd(base, "login", session_env, pub)
    jump = start_sshd(base, "jump", {}, pub)
    common = (
        f"  User {USER}\n  IdentityFile {base / 'id_ed25519'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {base / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
    )
    (base / "ssh_config").write_text(
        f"Host cluster\n  HostName 127.0.0.1\n  Port {login.port}\n{common}"
        f"Host jump\n  HostName 127.0.0.1\n  Port {jump.port}\n{common}"
        f"Host jumped\n  HostName 127.0.0.1\n  Port {login.port}\n  ProxyJump jump\n"
        f"  ControlPath none\n{common}"
    )
    skewed = base / "bin" / "hpctf-skewed"
    skewed.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "hpctf, version 0.0.1"; exit 0; }\n'
        f'exec {hpctf} "$@"\n'
    )
    skewed.chmod(0o755)
    sites = base / "sites"
    sites.mkdir()
    ssh_options = ["-F", str(base / "ssh_config")]
    for name, host, command in (
        ("cluster", "cluster", hpctf),
        ("jumped", "jumped", hpctf),
        ("skewed", "cluster", skewed),
    ):
        site = {
            "name": name,
            "extends": "local-slurm",
            "runs_root": str(runs),
            "python": str(python),
            "login": {"host": host, "hpctf": str(command), "ssh_options": ssh_options},
        }
        (sites / f"{name}.yaml").write_text(yaml.safe_dump(site))
    # Short: ssh's socket path (the cache dir + /hpctf/ssh/ + 40 hex digits) must fit 108 bytes.
    cache = Path(tempfile.mkdtemp(prefix="h4c", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCTF_RUNS_ROOT"))}
    env.update(HPCTF_SITE_PATH=str(sites), XDG_CACHE_HOME=str(cache))
    env.pop("HPCTF_ON_LOGIN", None)
    return SetUp(base, runs, login, jump, env)
