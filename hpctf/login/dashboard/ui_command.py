"""``hpctf ui``: the dashboard, served on this machine's loopback interface until Ctrl-C.

Where its data comes from (:func:`source_for`): the typed calls answered here
(:func:`hpctf.login.calls.table.answer`), or, for a site with ``login:`` seen from elsewhere
(a laptop), the same calls answered on the login host through the one multiplexed SSH
connection (:func:`hpctf.login.remote.calling.remote_call`): no port opened on the cluster,
one round trip per refresh of a page.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

import click

from hpctf.core.errors import EnvironmentProblem
from hpctf.login.calls.models import Request, Result
from hpctf.login.dashboard.server import HOST, Dashboard, Source


def source_for(site_name: str | None, env: Mapping[str, str]) -> tuple[Source, str]:
    """Where the pages' calls are answered, and the words for it: over SSH when the site has
    ``login:`` and this is not its login host; else here."""
    from hpctf.login.calls.table import answer

    if site_name:
        from hpctf.core.settings.sites import read_site
        from hpctf.login.remote.where import remote_login

        site = read_site(site_name, env)[0]
        login = remote_login(site, env)
        if login is not None:
            from hpctf.login.remote.calling import remote_call
            from hpctf.login.remote.ssh import connect

            connection = connect(login, env)

            def over_ssh(request: Request) -> Result:
                return remote_call(connection, site, request)

            return over_ssh, f"runs on {login.host}, read over SSH"
    return answer, "runs on this machine"


@click.command()
@click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="Whose runs_root to show (default: $HPCTF_SITE, else local); a site with login: "
    "from elsewhere: read on its login host over SSH.",
)
@click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Show the runs here instead (default: $HPCTF_RUNS_ROOT, else the site's runs_root).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The loopback port to serve on (0: any free one).",
)
def ui(site_name: str | None, root: Path | None, port: int) -> None:
    """Serve a read-only dashboard of your runs, sweeps and searches on 127.0.0.1 until
    Ctrl-C: runs with Slurm's word and why a job is pending, a run's curves, history, log and
    config, a sweep's or search's trials. Open the URL it prints (its token is required).

    With a site that has login: (from a laptop), the page runs here and reads through the
    same SSH connection as the other commands: one round trip per refresh, no port opened
    on the cluster."""
    site_name = site_name or os.environ.get("HPCTF_SITE")
    source, where = source_for(site_name, os.environ)
    defaults = {"site": site_name, "root": None if root is None else str(root)}
    try:
        server = Dashboard(source, port, defaults)
    except OSError as exc:  # the port taken, or no loopback interface
        raise EnvironmentProblem(
            f"cannot listen on {HOST}:{port}: {exc.strerror or exc}"
            + ("; choose another --port, or 0 for any free one" if port else "")
        ) from exc
    click.echo(f"hpctf ui: {where}; open {server.url}")
    click.echo("hpctf ui: Ctrl-C stops it", err=True)
    # SIGTERM (kill, a session's end) stops it as Ctrl-C does, even where it was started with
    # SIGTERM ignored (inherited across exec).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        click.echo("hpctf ui: stopped", err=True)
    finally:
        server.server_close()


COMMANDS = (ui,)
