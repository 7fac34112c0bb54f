"""The one SSH connection per login host, through the system's OpenSSH client.

``ssh`` itself reads ``~/.ssh/config``, talks to the agent and does ProxyJump, Kerberos and
keyboard-interactive prompts (multi-factor logins): hpctf never sees or stores a password.
One master connection per host (``ControlMaster``), in a private directory (0700), is opened
once and kept for :data:`CONTROL_PERSIST`: one login, one MFA prompt, serves every command
after it. Each remote command is an argv list whose every word is quoted for the remote
shell (:func:`remote_command`): no value reaches that shell unquoted.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from hpctf.core.errors import EnvironmentProblem
from hpctf.core.safe_files import private_folder
from hpctf.core.settings.config import Login

CONTROL_PERSIST = "8h"
# ssh's own exit status when it, not the remote command, failed.
SSH_FAILED = 255


# A Unix socket's path holds at most 107 bytes (sun_path); ssh names a master's socket by %C
# (40 hex digits) and creates it under a temporary name 17 characters longer first.
SOCKET_PATH_MAX = 107
_SOCKET_NAME = 1 + 40 + 17


def control_dir(env: Mapping[str, str]) -> Path:
    """Where the master connections' sockets live: ``$XDG_CACHE_HOME/hpctf/ssh`` (default
    ``~/.cache/hpctf/ssh``), made and kept mode 0700: whoever can reach a socket can run
    commands as you on the cluster. Where that path is too long for a socket's name (a cache
    path over about 39 characters), ``/tmp/hpctf-UID/ssh``: this user's own, mode 0700, or
    refused in one line."""
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or "~").expanduser() / ".cache")
    where = Path(cache) / "hpctf" / "ssh"
    shared = len(os.fsencode(where)) + _SOCKET_NAME > SOCKET_PATH_MAX
    if shared:  # in /tmp, where anyone could have made the folders first
        where = Path("/tmp") / f"hpctf-{os.geteuid()}" / "ssh"
        private_folder(where.parent, create=True)
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        where.chmod(0o700)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot make {where} for ssh's sockets: {exc.strerror}") from exc
    if shared and not (private_folder(where.parent, False) and private_folder(where, False)):
        raise EnvironmentProblem(
            f"{where} for ssh's sockets is not a folder only you can write (someone made it "
            "first?): remove it, or set XDG_CACHE_HOME to a short path of your own"
        )
    return where


def ssh_options(login: Login, env: Mapping[str, str]) -> list[str]:
    """The site's ``login.ssh_options``, ``~`` expanded (ssh would not expand it in -F)."""
    home = env.get("HOME") or str(Path("~").expanduser())
    return [home + o[1:] if o == "~" or o.startswith("~/") else o for o in login.ssh_options]


def hpctf_word(command: str) -> str:
    """``login.hpctf`` as one word for the remote shell; a leading ``~/`` stays unquoted so the
    remote shell expands it to the remote home."""
    if command.startswith("~/"):
        return "~/" + shlex.quote(command[2:])
    return shlex.quote(command)


def remote_command(login: Login, args: Sequence[str]) -> str:
    """The command line the remote shell runs: hpctf and each of ``args``, each quoted."""
    return " ".join([hpctf_word(login.hpctf), *(shlex.quote(a) for a in args)])


def local_version() -> str:
    return importlib.metadata.version("hpctf")


@dataclass
class Connection:
    """The multiplexed connection to one login host."""

    login: Login
    env: Mapping[str, str]

    def _ssh(self, master: str) -> list[str]:
        return [
            "ssh",
            "-o",
            f"ControlPath={control_dir(self.env) / '%C'}",
            "-o",
            f"ControlMaster={master}",
            "-o",
            f"ControlPersist={CONTROL_PERSIST}",
            *ssh_options(self.login, self.env),
        ]

    def is_open(self) -> bool:
        check = [*self._ssh("no"), "-O", "check", self.login.host]
        return subprocess.run(check, capture_output=True, check=False).returncode == 0

    def open(self) -> None:
        """Open the master connection unless it is up; a new one checks the remote hpctf's
        version (one line when it differs from this one)."""
        if self.is_open():
            return
        # -f: into the background once logged in, so the prompts (on the terminal) come
        # first. Its stdout must not be ours: a pipe held open by it would never close.
        stderr = None if sys.stderr.isatty() else subprocess.PIPE
        proc = subprocess.run(
            [*self._ssh("yes"), "-f", "-N", self.login.host],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            check=False,
        )
        if proc.returncode != 0:
            said = (proc.stderr or b"").decode(errors="replace").strip().splitlines()
            raise EnvironmentProblem(
                f"cannot connect to {self.login.host} with ssh (exit {proc.returncode})"
                + (f": {said[-1]}" if said else "")
            )
        self._check_version()

    def _check_version(self) -> None:
        proc = self.run(["--version"], capture=True)
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"{self.login.host}: `{self.login.hpctf} --version` exited {proc.returncode}: "
                f"{_last_line(proc.stderr)}: install hpctf there or set the site's login.hpctf"
            )
        theirs = proc.stdout.strip().split()[-1] if proc.stdout.strip() else "?"
        ours = local_version()
        if theirs != ours:
            click.echo(
                f"note: hpctf {theirs} on {self.login.host}, {ours} here: the cluster's runs "
                "the commands; install the same version on both to avoid surprises",
                err=True,
            )

    def argv(self, args: Sequence[str], terminal: bool = False) -> list[str]:
        """The local ssh command that runs hpctf ``args`` on the login host; ``terminal``: on
        a terminal of its own there (``-tt``), so that Ctrl-C here stops it there."""
        pty = "-tt" if terminal else "-T"
        return [*self._ssh("no"), pty, self.login.host, remote_command(self.login, args)]

    def run(
        self,
        args: Sequence[str],
        stdin: bytes | None = None,
        capture: bool = False,
        terminal: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run hpctf ``args`` on the login host. Without ``capture`` its stdout and stderr
        stream to ours as they come. Its exit status is the remote command's;
        an EnvironmentProblem when ssh itself failed (exit 255). ``terminal``: see
        :meth:`argv` (only when ours is one: stdin and stdout)."""
        terminal = terminal and sys.stdin.isatty() and sys.stdout.isatty()
        proc = subprocess.run(
            self.argv(args, terminal),
            input=stdin,
            stdin=None if stdin is not None or terminal else subprocess.DEVNULL,
            capture_output=capture,
            check=False,
        )
        if proc.returncode == SSH_FAILED:
            raise EnvironmentProblem(
                f"the connection to {self.login.host} failed (ssh exit 255)"
                + (f": {_last_line(proc.stderr)}" if capture else "")
            )
        return subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            (proc.stdout or b"").decode(errors="replace"),
            (proc.stderr or b"").decode(errors="replace"),
        )

    def close(self) -> None:
        """End the master connection (``ssh -O exit``)."""
        subprocess.run(
            [*self._ssh("no"), "-O", "exit", self.login.host], capture_output=True, check=False
        )


def _last_line(data: bytes | str | None) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no message"


def connect(login: Login, env: Mapping[str, str] | None = None) -> Connection:
    """The open connection to ``login``'s host (opened now if it is not up)."""
    connection = Connection(login, os.environ if env is None else env)
    connection.open()
    return connection
