"""The Python API's runs on a site behind SSH: :func:`hpctf.submit` with such a site returns
a :class:`RemoteRun`, whose every method is one typed call (:mod:`hpctf.login.calls`) on the
cluster over the open connection. :func:`wait_all` waits on many runs with one status call
per poll for all of them (on the cluster, that is one squeue for all their jobs), the pause
between polls growing to :data:`MAX_POLL`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.settings.config import Site
from hpctf.login.calls.models import (
    Request,
    Result,
    Started,
    SweepStarted,
)
from hpctf.login.remote.calling import remote_call
from hpctf.login.remote.forward import ship
from hpctf.login.remote.ssh import Connection
from hpctf.python_api.run_api import Run, Settings
from hpctf.python_api.sweep_api import Sweep


class RemoteRun(Run):
    """A run directory on the cluster (``path`` is the cluster's): every method is one typed
    call over the open connection (:func:`hpctf.login.remote.calling.remote_call`)."""

    def __init__(self, path: str, connection: Connection, site: Site) -> None:
        self.path = Path(path)
        self.connection, self.site = connection, site

    def __repr__(self) -> str:
        return f"hpctf.Run({str(self.path)!r}, on {self.connection.login.host})"

    def _answer(self, request: Request) -> Result:
        return remote_call(self.connection, self.site, request)

    def resubmit(
        self,
        set: Settings = None,
        exclude: str | None = None,
        update_code: bool = False,
        from_scratch: bool = False,
        retry_failed_nodes: bool = False,
        echo: bool = False,
    ) -> Run:
        """``hpctf resubmit RUN`` on the cluster; ``update_code`` is refused from here (the
        cluster would take the code shipped at submit, not this machine's)."""
        if update_code:
            raise UserError(
                "resubmit(update_code=True) from outside the login host would take the code "
                "shipped at submit, not yours: submit again from here (a new run)"
            )
        request = self._resubmit_request(set, exclude, False, from_scratch, retry_failed_nodes)
        self._answer(request)
        return self


class RemoteSweep(Sweep):
    """A sweep directory on the cluster: every method is one typed call over the open
    connection; its points are :class:`RemoteRun` s."""

    def __init__(self, path: str, connection: Connection, site: Site) -> None:
        self.path = Path(path)
        self.connection, self.site = connection, site

    def __repr__(self) -> str:
        return f"hpctf.Sweep({str(self.path)!r}, on {self.connection.login.host})"

    def _answer(self, request: Request) -> Result:
        return remote_call(self.connection, self.site, request)

    def _run(self, path: str) -> Run:
        return RemoteRun(path, self.connection, self.site)


def submit(
    experiment: Path, site: str | None, overrides: list[str], env: Mapping[str, str]
) -> RemoteRun | None:
    """:func:`hpctf.submit` on a site behind SSH; None when the site is here."""
    shipped = _shipped("submit", Started, experiment, site, overrides, [], env)
    if shipped is None:
        return None
    started, connection, remote_site = shipped
    return RemoteRun(started.run_dir, connection, remote_site)


def sweep(
    experiment: Path,
    site: str | None,
    overrides: list[str],
    options: list[str],
    env: Mapping[str, str],
) -> RemoteSweep | None:
    """:func:`hpctf.sweep` on a site behind SSH (``options``: ``hpctf sweep``'s, as its
    arguments); None when the site is here."""
    shipped = _shipped("sweep", SweepStarted, experiment, site, overrides, options, env)
    if shipped is None:
        return None
    started, connection, remote_site = shipped
    return RemoteSweep(started.sweep_dir, connection, remote_site)


Answered = TypeVar("Answered", Started, SweepStarted)


def _shipped(
    name: str,
    answer_type: type[Answered],
    experiment: Path,
    site: str | None,
    overrides: list[str],
    options: list[str],
    env: Mapping[str, str],
) -> tuple[Answered, Connection, Site] | None:
    """``submit`` or ``sweep`` shipped to the cluster, its typed answer read; None when the
    site is here. The cluster's one line is a UserError here when it was the user's."""
    shipped = ship(name, experiment, site, overrides, options, env, capture=True)
    if shipped is None:
        return None
    answer, connection, remote_site = shipped
    if answer.returncode == 2:
        raise UserError(_said(answer.stderr))
    try:
        return answer_type.model_validate_json(answer.stdout), connection, remote_site
    except ValidationError:
        raise EnvironmentProblem(
            f"{name} on {connection.login.host} exited {answer.returncode}: {_said(answer.stderr)}"
        ) from None


def _said(stderr: str) -> str:
    lines = [line.removeprefix("Error: ") for line in stderr.strip().splitlines()]
    return lines[-1] if lines else "no message"
