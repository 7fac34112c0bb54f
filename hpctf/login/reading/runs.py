"""A run directory as the commands after submit read it: found under the runs root, read once
(config, journal, the state derived from it), and its metrics.

Where runs are found, without RUN arguments: ``--root DIR``, else ``$HPCTF_RUNS_ROOT`` (which
overrides every site's runs_root at submit), else the runs_root of the site ``--site NAME``,
``$HPCTF_SITE`` or ``local`` (:func:`runs_root_for`); ``hpctf status`` without any of them
looks in every runs root at once (:func:`every_runs_root`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import click

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.printable import printable
from hpctf.core.run.history import RunHistory, RunState, read_history
from hpctf.core.run.metrics_history import metric_records as metric_records
from hpctf.core.run.rundir import RunDir, run_dirs_under
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import ResolvedConfig

FINAL_RUN_STATES = frozenset({"done", "failed", "gave_up", "cancelled", "interrupted"})
ACTIVE_RUN_STATES = frozenset({"queued", "running", "requeued"})
# How much of the end of metrics.jsonl a table reads (the last few logged steps).
METRICS_TAIL_BYTES = 64 << 10


def runs_root_for(root: Path | None, site_name: str | None, env: Mapping[str, str]) -> Path:
    """Where runs live, without RUN arguments (see the module docstring for the order)."""
    if root is not None:
        return root
    from hpctf.core.settings.sites import load_named_site
    from hpctf.login.resolving.resolve import expand_path

    if env.get("HPCTF_RUNS_ROOT"):
        where, value = "HPCTF_RUNS_ROOT", env["HPCTF_RUNS_ROOT"]
    else:
        name = site_name or env.get("HPCTF_SITE") or "local"
        where, value = f"site {name}: runs_root", load_named_site(name, env).runs_root
    try:
        return Path(expand_path(value, env))  # as at submit: ~ and $VARS
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None


def every_runs_root(env: Mapping[str, str]) -> list[Path]:
    """Every runs root hpctf knows of, each once: ``$HPCTF_RUNS_ROOT``, then the runs_root of
    each site on the search path (``hpctf sites``). A site that does not load, or whose
    runs_root names a variable that is not set here, is skipped: ``hpctf sites NAME`` says why."""
    from hpctf.core.settings.sites import available, load_named_site
    from hpctf.login.resolving.resolve import expand_path

    values = [env["HPCTF_RUNS_ROOT"]] if env.get("HPCTF_RUNS_ROOT") else []
    for name in available(env):
        try:
            values.append(load_named_site(name, env).runs_root)
        except UserError:
            continue
    roots: dict[Path, None] = {}
    for value in values:
        try:
            roots[Path(expand_path(value, env)).resolve()] = None
        except ValueError:
            continue
    return list(roots)


@dataclass
class Run:
    """One run directory, read once: its config and its history (the journal, typed, and the
    state derived from it)."""

    run: RunDir
    config: ResolvedConfig
    history: RunHistory

    @classmethod
    def read(cls, path: Path) -> Run:
        """The run at ``path``, or a UserError saying it is not one."""
        run = RunDir(path.resolve())
        config = run.load_config()
        return cls(run, config, read_history(run))

    @property
    def state(self) -> RunState:
        return self.history.state

    @property
    def damaged(self) -> tuple[str, ...]:
        """One line per journal entry left out as damaged (RunDir.read_journal)."""
        return self.history.damaged

    @property
    def name(self) -> str:
        return self.run.path.name

    @property
    def slurm(self) -> bool:
        """Whether the run's jobs are Slurm jobs, for status, logs and cancel to ask about."""
        return launcher_for(self.config.site).slurm

    @property
    def job(self) -> str | None:
        """The run's current job: the last one submitted or started."""
        return self.history.job

    @property
    def created(self) -> str:
        first = self.history.created
        return first.time if first else iso_time(self.run.config_file.stat().st_mtime)

    @property
    def last_event_time(self) -> float:
        last = self.history.last_time
        return 0.0 if last is None else epoch_seconds(last)


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def epoch_seconds(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return 0.0


def find_runs(root: Path) -> list[Run]:
    """The runs under ``root``, newest first; directories that are not runs are skipped."""
    runs = []
    for path in run_dirs_under(root):
        try:
            run = Run.read(path)
        except (UserError, EnvironmentProblem) as exc:
            # One damaged run never hides the others: said in one line on stderr, left out.
            click.echo(printable(f"hpctf: left out: {exc}", keep_lines=False), err=True)
            continue
        if run.damaged:
            click.echo(
                printable(
                    f"hpctf: {run.run.path}: {len(run.damaged)} damaged journal entr"
                    f"{'y' if len(run.damaged) == 1 else 'ies'} left out, the first: "
                    f"{run.damaged[0]}",
                    keep_lines=False,
                ),
                err=True,
            )
        runs.append(run)
    return sorted(runs, key=lambda r: r.created, reverse=True)
