"""``--site`` of the commands that take a run directory (logs, cancel, resubmit, plot): the
site the run is on. It matters only where that site is behind SSH (a laptop: the command runs
on the login host, :mod:`hpctf.login.remote.forward`); on the login host the run directory
knows its site and the option is not needed, so it is taken and left unused."""

from __future__ import annotations

import click

run_site_option = click.option(
    "--site",
    "site_name",
    metavar="NAME",
    help="The site the run is on, when that site is behind SSH (default: $HPCTF_SITE); "
    "on the login host the run directory says its site.",
)
