"""The run directory: the unit a user holds on to.

Layout (every later command works from this alone)::

    RUN_DIR/
      config.json        the resolved config, frozen at submit
      job.sbatch         the rendered batch script (the latest; older ones as job-<n>.sbatch)
      journal/           the state journal: one small JSON file per event, each written
                         atomically. One file per event (not one shared file rewritten by
                         read-modify-write) because the login node and the batch script both
                         record events, and flock is unreliable on parallel filesystems.
      logs/              slurm-<jobid>.out and rank-<n>.log; .step-exclude: the nodes lost in
                         the running job's allocation, which its batch script's srun leaves out
      checkpoints/       the chief's checkpoints
      metrics.jsonl      one JSON object per logged step (chief only)
      DONE               written by the chief when training completes
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import checkpoint_files, journal, journal_entries, secret_store, snapshot
from hpctf.core.run.bulk_create import in_shares, write_point
from hpctf.core.safe_files import (
    NotARegularFile,
    read_bounded,
    safe_dir,
    sync_filesystem,
    umask,
)
from hpctf.core.safe_files import write_atomic as write_atomic  # its old home
from hpctf.core.secrets import plain_env, secret_env, uri_credentials

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

# Bounds on what a run directory may make a reader read (its files are data anyone who can
# write the directory controls): hpctf's own are a few KB.
MAX_CONFIG_BYTES = 16 << 20
MAX_ENTRY_BYTES = 1 << 20
# Relative to the run directory: job-end writes it, the batch script reads it
# (resources.spare_nodes).
STEP_EXCLUDE = "logs/.step-exclude"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run directory, or a UserError saying ``path`` is not one."""
        run = cls(path.resolve())
        run.load_config()
        return run

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def script(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def journal(self) -> Path:
        return self.path / "journal"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def done(self) -> Path:
        return self.path / "DONE"

    def checkpoint_step(self) -> int:
        """The step of the newest checkpoint whose files are on disk (0 for none), read without
        TensorFlow (:mod:`hpctf.core.run.checkpoint_files`: the ``checkpoint`` state file is only a
        hint, and a damaged one must not read as "no checkpoint")."""
        return checkpoint_files.newest_step(self.checkpoints)

    @property
    def step_exclude(self) -> Path:
        """The nodes (comma-separated) that the batch script's next srun leaves out."""
        return self.path / STEP_EXCLUDE

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def load_config(self) -> ResolvedConfig:
        """The frozen config; a UserError (one line) when it is missing or damaged, an
        EnvironmentProblem when it cannot be read."""
        try:
            data = read_bounded(self.config_file, MAX_CONFIG_BYTES, "the frozen run config")
        except FileNotFoundError:
            raise UserError(
                f"{self.path}: not a run directory (no config.json); "
                "pass the directory that `hpctf submit` printed"
            ) from None
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot read {self.config_file}: {exc.strerror or exc}"
            ) from exc
        from pydantic import ValidationError

        from hpctf.core.settings.config import ResolvedConfig

        try:
            frozen = ResolvedConfig.model_validate_json(data)
        except ValidationError as exc:
            raise UserError(
                f"{self.config_file}: damaged run config: {exc.errors()[0]['msg']}"
            ) from None
        # config.json holds the secrets redacted; secrets.env (0600, the owner's) the values.
        return secret_store.restore(frozen, secret_store.read(self.path))

    def record(self, event: str, *, sync: bool = True, **fields: Any) -> dict[str, Any]:
        """Append one event to the journal (atomic, safe from several writers at once) and
        return it; its writers are :mod:`hpctf.core.run.journal`'s ``record_*`` functions.
        ``sync``: as :func:`hpctf.core.safe_files.write_atomic`'s (a sweep's points: one sync
        for all)."""
        safe_dir(self.journal)
        stamp = journal_entries.next_stamp(os.listdir(self.journal), time.time_ns())
        name = journal_entries.file_name(stamp, os.getpid(), event)
        entry = journal_entries.entry(event, fields)
        write_atomic(self.journal / name, json.dumps(entry), sync=sync)
        return entry

    def events(self) -> list[dict[str, Any]]:
        """All journal entries as read, oldest first; damaged entries are left out
        (:meth:`read_journal` says which). hpctf reads them through
        :func:`hpctf.core.run.history.read_history`, once per command."""
        return self.read_journal()[0]

    def read_journal(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The journal's events, oldest first, and one line per entry left out as damaged
        (:func:`hpctf.core.run.journal_entries.problem`; older event names read as
        today's). The journal is data anyone who can write the run directory
        controls: one bad entry must not break a status, nor a listing of many runs."""
        if not self.journal.is_dir():
            return [], []
        events: list[dict[str, Any]] = []
        damaged: list[str] = []
        for file in sorted(self.journal.glob("*.json")):
            try:
                entry = json.loads(read_bounded(file, MAX_ENTRY_BYTES, "a journal entry"))
            except OSError:
                continue  # gone between the listing and the read
            except NotARegularFile as exc:  # a FIFO planted there must not hang a status
                damaged.append(str(exc))
                continue
            except ValueError:  # not JSON, not UTF-8: our writers never leave partial files
                damaged.append(f"{file}: not a JSON document")
                continue
            problem = journal_entries.problem(entry)
            if problem is None:
                events.append(journal.upgraded(entry))
            else:
                damaged.append(f"{file}: {problem}")
        return events, damaged


def runs_root(config: ResolvedConfig) -> Path:
    """The site's runs_root, as resolved (``~`` and ``$VARS`` were expanded then, once)."""
    return Path(config.site.runs_root).resolve()


def run_dirs_under(root: Path) -> list[Path]:
    """The run directories directly under ``root`` (those holding a config.json), unsorted; []
    when ``root`` does not exist."""
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    return [child for child in children if (child / "config.json").is_file()]


class RunDirTaken(EnvironmentProblem):
    """Another submit took the planned run directory first (two submits in one second): no
    mistake of the user's (exit 3)."""


def plan_run_dir(config: ResolvedConfig) -> RunDir:
    """Choose a new run directory's path (``<runs_root>/<name>-<timestamp>``); creates nothing."""
    base = f"{config.experiment.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return RunDir(free_path(runs_root(config), base, "run directory"))


def free_path(root: Path, base: str, what: str) -> Path:
    """``root/base``, or ``root/base-N`` for the first N that is free (names chosen by the
    second: two submits of one second get two names); creates nothing. A thousand taken is
    the environment's doing (exit 3), not the user's."""
    for attempt in range(1000):
        path = root / (base if attempt == 0 else f"{base}-{attempt}")
        if not path.exists():
            return path
    raise EnvironmentProblem(f"cannot find a free {what} name under {root}")


def create_run_dir(run: RunDir, config: ResolvedConfig, script: str) -> ResolvedConfig:
    """Create the planned run directory: the code snapshot (:mod:`hpctf.core.run.snapshot`), the
    frozen config (its python_path pointing at the snapshot), the batch script. Returns the
    frozen config. On any failure nothing is left behind."""
    _make_dir(run.path)
    try:
        frozen = _fill(run, config, script, lambda: with_snapshot(config, run))
    except BaseException:
        remove_new_run_dir(run)  # nothing half-made is left behind
        raise
    return frozen


def create_run_dirs_sharing_code(
    runs: Sequence[tuple[RunDir, ResolvedConfig, str]], store: Path, workers: int = 4
) -> None:
    """Create many planned run directories (a sweep's points: each with its config and
    script) in one new directory that nothing reads yet, their code one snapshot kept in
    ``store`` (:func:`hpctf.core.run.snapshot.take_shared`: one per distinct python_path, each
    ``RUN_DIR/code`` a link to it). A point holds only what is its own: its directory, empty
    ``logs/`` and ``checkpoints/``, the link, its config (and secrets), its script and its
    journal's ``created`` record.

    Each point is 8 metadata operations (a file: one open, one write, one close): its files
    are new, in a directory no reader knows of until the sweep is recorded, so none needs the
    temporary file, rename and fsync of :func:`write_atomic`; the filesystem is synced once at
    the end. The points are made by ``workers`` threads at once, each over a contiguous share
    (:func:`in_shares`): on a parallel filesystem each operation is a round trip to its
    metadata server, which one thread would wait for in turn. On any failure every directory
    made here is removed and the error raised."""
    snapshots: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Path, list[snapshot.Source]]]
    snapshots = {}
    planned = []
    for run, config, script in runs:
        secrets = tuple(secret_values(config))
        key = (tuple(config.experiment.train.python_path), secrets)
        if key not in snapshots:
            snapshots[key] = snapshot.take_shared(list(key[0]), store, runs_root(config), secrets)
        code, sources = snapshots[key]
        planned.append((run, _pointing_at(config, sources), script, code))
    made: list[RunDir] = []  # list.append is atomic: each thread adds the directory it made
    try:
        in_shares(lambda item: _make_point(*item, made), planned, workers)
        sync_filesystem(store)  # every file made here on disk, in one call
    except BaseException:
        for run in made:
            remove_new_run_dir(run)
        raise


def create_shared_base(path: Path, config: ResolvedConfig, store: Path) -> ResolvedConfig:
    """A search's base (``path``: a new directory that is no run): the code snapshot once in
    ``store`` (:func:`hpctf.core.run.snapshot.take_shared`), ``path/code`` a link to it, and
    the config frozen there pointing into it (secrets apart, as a run's). Returns that config;
    each trial's run is made from it by :func:`create_point`."""
    _make_dir(path)
    secrets = secret_values(config)
    try:
        code, sources = snapshot.take_shared(
            list(config.experiment.train.python_path), store, runs_root(config), secrets
        )
        snapshot.link(path, code)
        frozen = _pointing_at(config, sources)
        secret_store.write_frozen(path, frozen)
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise EnvironmentProblem(f"cannot create {path}: {exc.strerror}") from exc
    return frozen


def create_point(run: RunDir, frozen: ResolvedConfig, script: str, code: Path) -> None:
    """One run directory whose code is the shared snapshot ``code`` (``frozen``'s python_path
    already points into it): a search's trial, made by its array task. On any failure nothing
    is left behind."""
    made: list[RunDir] = []
    try:
        _make_point(run, frozen, script, code, made)
        sync_filesystem(run.path)
    except BaseException:
        for each in made:
            remove_new_run_dir(each)
        raise


def _make_point(
    run: RunDir, frozen: ResolvedConfig, script: str, code: Path, made: list[RunDir]
) -> None:
    """One point of :func:`create_run_dirs_sharing_code` (added to ``made`` once its directory
    is claimed)."""
    _make_dir(run.path, parents=False)
    made.append(run)
    write_point(run, frozen, script, code)


def _make_dir(path: Path, parents: bool = True) -> None:
    """The mkdir that claims a planned run directory (``parents``: making its runs root)."""
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise RunDirTaken(f"{path} already exists; submit again for a new run directory") from None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create run directory {path}: {exc.strerror}") from exc


def _fill(
    run: RunDir, config: ResolvedConfig, script: str, code: Callable[[], ResolvedConfig]
) -> ResolvedConfig:
    """A new run directory's contents: ``code()`` puts the code and the frozen config there
    and returns that config; then the script and the journal's ``created`` record."""
    try:
        run.logs.mkdir()
        run.checkpoints.mkdir()
        frozen = code()
        write_atomic(run.script, script, mode=0o777 & ~umask())  # as the umask allows
        journal.record_created(run, config.experiment_file, config.site.name)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create run directory {run.path}: {exc.strerror}") from exc
    return frozen


def with_snapshot(
    config: ResolvedConfig, run: RunDir, sources: list[str] | None = None
) -> ResolvedConfig:
    """Copy the code into ``run`` (from ``sources``, default the config's python_path) and
    write the config, its python_path pointing at the copies; returns that config."""
    copied = snapshot.take(
        sources if sources is not None else config.experiment.train.python_path,
        run.path,
        runs_root(config),
        secrets=secret_values(config),
    )
    frozen = _pointing_at(config, copied)
    secret_store.write_frozen(run.path, frozen)  # config.json redacted, secrets.env 0600
    return frozen


def _pointing_at(config: ResolvedConfig, copied: list[snapshot.Source]) -> ResolvedConfig:
    """``config`` with its python_path (and ``train.script``) in the snapshot ``copied``."""
    update: dict[str, Any] = {"python_path": [s.copy for s in copied]}
    if config.experiment.train.script is not None:
        update["script"] = snapshot.copy_of(config.experiment.train.script, copied)
    train = config.experiment.train.model_copy(update=update)
    return config.model_copy(
        update={"experiment": config.experiment.model_copy(update={"train": train})}
    )


def secret_values(config: ResolvedConfig) -> list[str]:
    """The secrets in ``config`` (:mod:`hpctf.core.secrets`): its env's secret values, its
    webhooks, and the credentials in its tracking URI and env values."""
    env = {**config.site.env, **config.experiment.env}
    mlflow = config.experiment.tracking.mlflow
    uri = (mlflow.tracking_uri if mlflow else None) or ""
    webhooks = [n.webhook for n in (config.experiment.notify, config.site.notify) if n]
    found = [*secret_env(env).values(), *uri_credentials(uri), *(w for w in webhooks if w)]
    for value in plain_env(env).values():
        found += uri_credentials(value)
    return found


def remove_new_run_dir(run: RunDir) -> None:
    """Remove a run directory this process has just created and nothing has run in."""
    shutil.rmtree(run.path, ignore_errors=True)
