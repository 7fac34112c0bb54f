"""The laptop's side of each command on a site behind SSH (:mod:`hpctf.login.remote.where`).

``validate`` and ``render`` stay here. ``submit`` and ``sweep`` validate here, then ship
(:mod:`hpctf.login.remote.shipping`); ``--dry-run`` stays here. ``status``, ``runs``,
``logs``, ``cancel``, ``resubmit``, ``plot`` and ``doctor`` run on the cluster as given, with
their output streamed back and their exit status kept. Which site: the command's ``--site``,
else ``$HPCTF_SITE`` (RUN arguments are paths on the cluster). The arguments are read by the
command's own click parser here, as on the cluster: one parser.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpctf.core.errors import UserError

if TYPE_CHECKING:  # imported where a site is behind SSH: every command asks this module first
    from hpctf.core.settings.config import Login, Site
    from hpctf.login.remote.ssh import Connection

ON_CLUSTER = frozenset({"status", "runs", "logs", "cancel", "resubmit", "plot", "doctor"})
# Every one of them takes --site (tests/test_remote_units.py checks this against the CLI):
# the laptop's choice (--site or $HPCTF_SITE, which the cluster's shell does not have) is
# passed on as --site.
TAKES_SITE = ON_CLUSTER
SHIPPED = frozenset({"submit", "sweep"})
COMMANDS = ON_CLUSTER | SHIPPED
_HELP = frozenset({"--help", "-h"})


def forwarded(
    args: Sequence[str], env: Mapping[str, str], command_of: Callable[[str], click.Command]
) -> int | None:
    """Run ``hpctf ARGS`` on the cluster when its site is behind SSH and this is not its login
    host; its exit status, or None when the command runs here. ``command_of``: the CLI's
    command of a name (given by the CLI, which this wing does not import), to read a shipped
    command's options as the command itself would."""
    if not args or args[0] not in COMMANDS or _HELP & set(args[1:]):
        return None
    name, rest = args[0], list(args[1:])
    command = command_of(name)
    try:
        # A shipped command's experiment is read here anyway; a cluster command's arguments
        # are checked here too, so that a mistake is said before any connection.
        with command.make_context(name, list(rest), resilient_parsing=name in SHIPPED) as ctx:
            params = dict(ctx.params)
    except click.ClickException:
        return None  # let the command itself say what is wrong
    if name in SHIPPED:
        return _shipped(name, command, params, env)
    site_name = params.get("site_name") or env.get("HPCTF_SITE")
    if not site_name:
        return None
    from hpctf.core.settings.sites import read_site
    from hpctf.login.remote.ssh import connect
    from hpctf.login.remote.where import remote_login

    site = read_site(site_name, env)[0]
    login = remote_login(site, env)
    if login is None:
        return None
    if name == "resubmit" and "--update-code" in rest:
        # The cluster would copy the code it was sent at submit, not this machine's.
        raise UserError(
            "resubmit --update-code from outside the login host would take the code shipped "
            "at submit, not yours: submit again from here (a new run), or resubmit on the "
            "login host after updating the code there"
        )
    connection = connect(login, env)
    if name == "plot":
        return _plot(connection, site, Path(params["run_dir"]), params.get("output"))
    # `logs -f` on a terminal: a terminal there too, so Ctrl-C here ends the follow there.
    follow = name == "logs" and bool(params.get("follow"))
    args = cluster_args(name, rest, site.name)
    return int(on_cluster(connection, site, args, terminal=follow).returncode)


def cluster_args(name: str, rest: Sequence[str], site_name: str) -> list[str]:
    """``hpctf NAME REST`` as the cluster's command takes it: the site chosen here (by
    ``--site`` or ``$HPCTF_SITE``, which the cluster's shell does not have) as ``--site``."""
    kept: list[str] = []
    words = iter(rest)
    for word in words:
        if word == "--":
            kept += [word, *words]
            break
        if word == "--site":
            next(words, None)
        elif not word.startswith("--site="):
            kept.append(word)
    return [name, *(["--site", site_name] if name in TAKES_SITE else []), *kept]


def _plot(connection: Connection, site: Site, run_dir: Path, output: Path | None) -> int:
    """``hpctf plot``: drawn on the cluster, the PNG written here (default ./NAME-loss.png)."""
    from hpctf.core.safe_files import write_atomic
    from hpctf.login.remote.site_file import site_document

    document = json.dumps(site_document(site), sort_keys=True)
    proc = subprocess.run(
        connection.argv(["_remote", document, "_remote-plot", str(run_dir)]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        check=False,
    )
    if proc.returncode != 0:
        return proc.returncode
    target = output or Path(f"{run_dir.name}-loss.png")
    write_atomic(target, proc.stdout)
    click.echo(f"wrote {target}")
    return 0


def on_cluster(
    connection: Connection,
    site: Site,
    args: Sequence[str],
    capture: bool = False,
    terminal: bool = False,
) -> Any:
    """``hpctf ARGS`` on the cluster, with the laptop's ``site`` known there."""
    from hpctf.login.remote.site_file import site_document

    document = json.dumps(site_document(site), sort_keys=True)
    return connection.run(["_remote", document, *args], capture=capture, terminal=terminal)


def _shipped(
    name: str, command: click.Command, params: dict[str, Any], env: Mapping[str, str]
) -> int | None:
    if params.get("dry_run"):
        return None
    options = _other_options(command, params, {"experiment", "site_name", "overrides", "dry_run"})
    shipped = ship(name, Path(params["experiment"]), params.get("site_name"),
                   list(params.get("overrides") or ()), options, env)  # fmt: skip
    if shipped is None:
        return None
    answer, connection, site = shipped
    if answer.returncode == 0 and env.get("HPCTF_SITE") != site.name:
        click.echo(
            f"note: the run lives on {connection.login.host}; to watch and steer it from here "
            f"(status, logs, cancel, resubmit, plot): export HPCTF_SITE={site.name}",
            err=True,
        )
    return int(answer.returncode)


def ship(
    name: str,
    experiment: Path,
    site_name: str | None,
    overrides: list[str],
    options: list[str],
    env: Mapping[str, str],
    capture: bool = False,
) -> tuple[subprocess.CompletedProcess[str], Connection, Site] | None:
    """``submit`` or ``sweep`` of ``experiment`` on its site when that is behind SSH (the
    cluster's answer, the connection, the site); None when the site is here."""
    from hpctf.core.settings.sites import read_site
    from hpctf.login.remote.shipping import submit_remote
    from hpctf.login.remote.ssh import connect
    from hpctf.login.remote.where import remote_login
    from hpctf.login.resolving.advice import advice, search_as_one_run
    from hpctf.login.resolving.loader import load_config

    config = load_config(experiment, site_name, overrides, env).config
    login = remote_login(config.site, env)
    if login is None:
        return None
    site = read_site(site_name or config.site.name, env)[0]
    for line in [*advice(config), search_as_one_run(config, experiment)]:
        if line:
            click.echo(f"warning: {line}", err=True)
    connection = connect(login, env)
    answer = submit_remote(
        connection, name, config, site, experiment, overrides, options, env, capture=capture
    )
    return answer, connection, site


def _other_options(command: click.Command, params: Mapping[str, Any], taken: set[str]) -> list[str]:
    """The command's options other than ``taken``, as arguments again (for the cluster)."""
    args: list[str] = []
    for param in command.params:
        value = params.get(param.name or "")
        if param.name in taken or not isinstance(param, click.Option) or value is None:
            continue
        flag = max(param.opts, key=len)
        if param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            for item in value:
                args += [flag, *(map(str, item) if isinstance(item, tuple) else [str(item)])]
        elif isinstance(value, tuple):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args


def site_login(site: Site) -> Login | None:
    from hpctf.login.remote.where import remote_login

    return remote_login(site, os.environ)
