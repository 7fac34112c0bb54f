"""Whether a site's commands run here or on its login host, over SSH.

A site with ``login: {host: ...}`` is reached over SSH from anywhere but that host. hpctf
knows it runs on the login host when ``HPCTF_ON_LOGIN=1`` is set (the commands hpctf runs
over SSH set it themselves; an admin may set it in the cluster's profile), or when this
machine's host name is the login host's (as given, or as ``ssh -G`` resolves an alias).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping

from hpctf.core.settings.config import Login, Site

ON_LOGIN = "HPCTF_ON_LOGIN"


def remote_login(site: Site, env: Mapping[str, str]) -> Login | None:
    """The site's login host when this process must reach it over SSH; else None."""
    login = site.login
    if login is None or env.get(ON_LOGIN) == "1":
        return None
    return None if _is_this_host(login, env) else login


def _names_here() -> set[str]:
    names = {socket.gethostname(), socket.getfqdn()}
    return {n.lower() for n in names} | {n.split(".")[0].lower() for n in names}


def _is_this_host(login: Login, env: Mapping[str, str]) -> bool:
    here = _names_here()
    host = login.host.rpartition("@")[2].lower()
    if host in here:
        return True
    resolved = _ssh_hostname(login, env)
    return resolved is not None and (resolved in here or resolved.split(".")[0] in here)


def _ssh_hostname(login: Login, env: Mapping[str, str]) -> str | None:
    """The HostName ssh would connect to for the login host (an alias resolved by
    ``~/.ssh/config``), or None when ssh cannot say."""
    from hpctf.login.remote.ssh import ssh_options

    try:
        proc = subprocess.run(
            ["ssh", "-G", *ssh_options(login, env), login.host],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname":
            return value.strip().lower()
    return None
