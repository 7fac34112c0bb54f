"""The Python API's runs on a site behind SSH: :func:`hpctf.submit` with such a site returns
a :class:`RemoteRun`, whose every look is one ``hpctf status --json`` on the cluster over the
open connection. :func:`wait_all` waits on many runs with one status call per poll for all
of them (on the cluster, that is one squeue, and at most one sacct, for all their jobs),
the pause between polls growing to :data:`MAX_POLL`."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.history import RunStatus
from hpctf.core.settings.config import Site
from hpctf.login.remote.forward import on_cluster, ship
from hpctf.login.remote.ssh import Connection
from hpctf.python_api.run_api import Run, RunFailed, has_ended, metrics_frame

MAX_POLL = 120.0
BACKOFF = 1.5


class RemoteRun(Run):
    """A run directory on the cluster (``path`` is the cluster's)."""

    def __init__(self, path: str, connection: Connection, site: Site) -> None:
        self.path = Path(path)
        self.connection, self.site = connection, site

    def __repr__(self) -> str:
        return f"hpctf.Run({str(self.path)!r}, on {self.connection.login.host})"

    def _hpctf(self, *args: str) -> str:
        proc = on_cluster(self.connection, self.site, args, capture=True)
        if proc.returncode == 2:
            raise UserError(_said(proc.stderr))
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"{self.connection.login.host}: hpctf {args[0]} exited {proc.returncode}: "
                f"{_said(proc.stderr)}"
            )
        return str(proc.stdout)

    def status(self) -> dict[str, Any]:
        return statuses([self])[0]

    def wait(
        self, timeout: float | None = None, poll: float = 10.0, check: bool = False
    ) -> RunStatus:
        return wait_all([self], timeout, poll, check)[0]

    def logs(self, rank: int = 0, job: str | None = None) -> str:
        return self._hpctf(
            "logs", str(self.path), "--rank", str(rank), *(["--job", job] if job else [])
        )

    def metrics(self, frame: bool | None = None) -> Any:
        return metrics_frame(json.loads(self._hpctf("_remote-metrics", str(self.path))), frame)

    def cancel(self) -> list[str]:
        return re.findall(r"\b(\d+)\b", self._hpctf("cancel", str(self.path)))

    def resubmit(self, *args: Any, **kwargs: Any) -> Run:
        raise UserError("resubmit a run on a remote site with: hpctf resubmit RUN (HPCTF_SITE set)")


def _said(stderr: str) -> str:
    lines = [line.removeprefix("Error: ") for line in stderr.strip().splitlines()]
    return lines[-1] if lines else "no message"


def statuses(runs: Sequence[RemoteRun]) -> list[dict[str, Any]]:
    """Each run's ``status --json`` document, from one remote call for all of them."""
    if not runs:
        return []
    text = runs[0]._hpctf("status", "--json", *(str(r.path) for r in runs))
    document = json.loads(text)
    found = {str(d.get("run_dir") or d.get("path")): d for d in document.get("runs", [])}
    listed = document.get("runs", [])
    return [
        found.get(str(r.path), listed[i] if i < len(listed) else {}) for i, r in enumerate(runs)
    ]


def wait_all(
    runs: Sequence[RemoteRun], timeout: float | None = None, poll: float = 10.0, check: bool = False
) -> list[RunStatus]:
    """Wait until every run has ended; their final states, in order. One status call per
    poll for all of them; the pause starts at ``poll`` and grows by :data:`BACKOFF` to
    :data:`MAX_POLL`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = poll
    while True:
        documents = statuses(runs)
        if all(has_ended(d) for d in documents):
            states = [RunStatus(d["state"]) for d in documents]
            for run, document, state in zip(runs, documents, states, strict=True):
                if check and state != RunStatus.DONE:
                    raise RunFailed(run.path, state, str(document.get("why") or ""))
            return states
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(runs)} run(s) not ended after {timeout} s")
        left = pause if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(pause, left)))
        pause = min(MAX_POLL, max(pause, poll) * BACKOFF)


def submit(
    experiment: Path, site: str | None, overrides: list[str], env: Mapping[str, str]
) -> RemoteRun | None:
    """:func:`hpctf.submit` on a site behind SSH; None when the site is here."""
    shipped = ship("submit", experiment, site, overrides, [], env, capture=True)
    if shipped is None:
        return None
    answer, connection, remote_site = shipped
    if answer.returncode == 2:
        raise UserError(_said(answer.stderr))
    found = re.search(r"^run directory: (.+)$", answer.stdout, re.M)
    if answer.returncode != 0 or found is None:
        raise EnvironmentProblem(
            f"submit on {connection.login.host} exited {answer.returncode}: {_said(answer.stderr)}"
        )
    return RemoteRun(found.group(1).strip(), connection, remote_site)
