"""A run directory as the commands after submit read it: one run read once (config and
history, :class:`RunRecord`), many as a listing shows them (:func:`find_runs`: their facts, through
the runs root's index).

Where runs are found, without RUN arguments: ``--root DIR``, else ``$HPCTF_RUNS_ROOT`` (which
overrides every site's runs_root at submit), else the runs_root of the site ``--site NAME``,
``$HPCTF_SITE`` or ``local`` (:func:`runs_root_for`); ``hpctf status`` without any of them
looks in every runs root at once (:func:`every_runs_root`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.printable import printable
from hpctf.core.run.history import ACTIVE_STATES, FINAL_STATES, RunHistory, RunState, read_history
from hpctf.core.run.listing import METRICS_TAIL_BYTES as METRICS_TAIL_BYTES
from hpctf.core.run.listing import RunFacts, facts_of, iso_time
from hpctf.core.run.listing import epoch_seconds as epoch_seconds
from hpctf.core.run.metrics_history import metric_records as metric_records
from hpctf.core.run.run_index import Index
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.login.reading import background_index

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

# The history's sets (hpctf.core.run.history.states), under the names the watchers know.
FINAL_RUN_STATES = FINAL_STATES
ACTIVE_RUN_STATES = ACTIVE_STATES


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
class RunRecord:
    """One run directory, read once: its config and its history (the journal, typed, and the
    state derived from it)."""

    run: RunDir
    config: ResolvedConfig
    history: RunHistory

    @classmethod
    def read(cls, path: Path) -> RunRecord:
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

    @cached_property
    def facts(self) -> RunFacts:
        """The run as a listing shows it (:mod:`hpctf.core.run.listing`)."""
        return facts_of(self.run, self.config, self.history)


def find_runs(root: Path) -> list[RunFacts]:
    """The runs under ``root`` as a listing shows them (:mod:`hpctf.core.run.listing`), newest
    first, from the runs root's index (:mod:`hpctf.core.run.run_index`): each run directory
    read again only where it changed; directories that are not runs are skipped."""
    return scan_runs(root).runs


# How many run directories a lazy listing (``hpctf status`` without RUN) reads in full, those
# whose journals changed last; the index has every other run from its row, or the background
# indexer reads it (:mod:`hpctf.login.reading.background_index`). Reading one run costs about
# 0.5 ms: 10,000 runs the index has never seen took 5-7 s where 200 take 0.1 s.
READ_AT_MOST = 200


@dataclass
class Scan:
    """A listing of one runs root: the runs read (newest first), and the run directories left
    unread by a lazy listing: how many, and the time (epoch seconds) of the newest journal
    among them: every run whose journal changed after it is in ``runs``."""

    root: Path
    runs: list[RunFacts]
    unread: int = 0
    unread_since: float | None = None
    indexing: bool = False  # whether the background indexer reads them now


def scan_runs(root: Path, read_at_most: int | None = None) -> Scan:
    """The runs under ``root``, as :func:`find_runs`; with ``read_at_most``, lazily: the runs
    whose index row is current, and at most that many of the others, read in full, those
    whose journals changed last first; the others are counted (:class:`Scan`) and read by a
    background indexer, so that the next listing finds them in the index."""
    root = root.resolve()
    index = Index(root)
    try:
        children = [Path(e.path) for e in os.scandir(root) if e.is_dir() and e.name[:1] != "."]
    except OSError:
        return Scan(root, [])
    left: list[tuple[int, Path]] = []
    if read_at_most is None:
        runs = listed(index, children)
    else:
        runs, left = _lazily(index, children, read_at_most)
    index.save(keep=(str(p) for p in children))
    scan = Scan(root, sorted(runs, key=lambda r: r.created, reverse=True), len(left))
    if left:
        scan.unread_since = max(time for time, _ in left) / 1e9
        scan.indexing = background_index.start(root)
    return scan


def unread_note(scan: Scan) -> str:
    """One line for the runs a lazy listing left unread: how many, since when nothing of
    theirs changed, and how to see them."""
    since = "" if scan.unread_since is None or scan.unread_since <= 0 else (
        f", none changed since {iso_time(scan.unread_since)}"
    )  # fmt: skip
    then = (
        ": the index reads them in the background for the next listing"
        if scan.indexing
        else " (no background indexer could start: an index is kept only where it is yours)"
    )
    return (
        f"hpctf: and {scan.unread:,} more run{'' if scan.unread == 1 else 's'} under "
        f"{scan.root}{since}, not read yet{then}; hpctf status --all reads them now"
    )


def _lazily(
    index: Index, children: list[Path], read_at_most: int
) -> tuple[list[RunFacts], list[tuple[int, Path]]]:
    """The runs whose rows are current, and the ``read_at_most`` of the other run
    directories whose journals changed last, read; the rest (journal time, path) unread."""
    runs: list[RunFacts] = []
    stale: list[tuple[int, Path]] = []
    for path in children:
        found = index.cached(path)
        if isinstance(found, RunFacts):
            runs.append(found)
        elif found is not None and os.path.isfile(f"{path}/config.json"):  # a run: unread
            stale.append((found, path))
    stale.sort(key=lambda item: item[0], reverse=True)
    runs += listed(index, (path for _, path in stale[:read_at_most]))
    return runs, stale[read_at_most:]


def listed(index: Index, paths: Iterable[Path]) -> list[RunFacts]:
    """The facts of the runs at ``paths`` (resolved), through ``index``; one line on stderr
    for each that cannot be read or has damaged journal entries, left out or shown."""
    runs = []
    for path in paths:
        try:
            facts = index.facts(path)
        except (UserError, EnvironmentProblem) as exc:
            # One damaged run never hides the others: said in one line on stderr, left out.
            click.echo(printable(f"hpctf: left out: {exc}", keep_lines=False), err=True)
            continue
        if facts is None:
            continue
        if facts.damaged:
            click.echo(
                printable(
                    f"hpctf: {facts.path}: {len(facts.damaged)} damaged journal entr"
                    f"{'y' if len(facts.damaged) == 1 else 'ies'} left out, the first: "
                    f"{facts.damaged[0]}",
                    keep_lines=False,
                ),
                err=True,
            )
        runs.append(facts)
    return runs
