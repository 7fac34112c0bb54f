"""The index of a runs root: each run's :class:`~hpctf.core.run.listing.RunFacts`, kept so a
listing of 10,000 runs reads one file and ``stat`` s each run directory instead of reading
every run's config, journal, metrics and snapshot.

Layout::

    <runs_root>/.hpctf-index/
      runs.json           {"version": 1, "rows": {run path: row}}, replaced atomically
      pending/<hash>.json one row, written by a command that has just changed that run

A row is ``{"key": ..., "entries": [count, newest], "settled": bool, "facts": {...}}``. The
index is a cache, never the truth: a row is used only while its key, the ``stat`` of the run's
``journal/`` and ``metrics.jsonl`` (:func:`key_of`), is what it was when the row was made;
every change of what a listing shows writes one of them, and the row is made again from the
run directory. A settled row of an ended run (done, failed, gave up) is checked by its
journal's time alone: nothing writes its metrics before a new journal entry. A row made
within :data:`SETTLE_NS` of the newest of those times (a write in the same tick of a coarse
file clock would not show) is checked against the journal's listing too, until a listing
shows it settled.

Writers never rewrite ``runs.json``: the batch script's ``job-start`` and ``job-end`` and
``hpctf cancel`` each write their run's row to ``pending/`` (one file per run, atomically), so
two jobs ending at once lose nothing; a listing merges the pending rows into ``runs.json``
(atomic replace) and removes those it merged. Two listings replacing ``runs.json`` at once, or
a pending row replaced while merged, cost at most a row made again. A damaged or missing index
is made again; a runs root that cannot be written is listed without one.

Whose: the index is trusted (a row says a run's state) and rewritten (merged rows removed), so
it is kept only in a runs root this user owns, in a folder only this user may write
(:func:`private_folder`); a colleague's runs root, or an index folder someone else made or
planted as a link, is listed from the run directories themselves and nothing is written there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.history import RunHistory, RunStatus, read_history
from hpctf.core.run.listing import RunFacts, facts_of, read_facts
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import private_folder, write_atomic

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

INDEX_DIR = ".hpctf-index"
INDEX_FILE = "runs.json"
PENDING_DIR = "pending"
VERSION = 1
# Beyond any coarse file clock's tick and any two writers' clocks on one run directory.
SETTLE_NS = 2 * 10**9
# An index that makes a listing read more than this is left aside (a planted file).
MAX_INDEX_BYTES = 1 << 30
MAX_PENDING_BYTES = 1 << 20  # one run's row


def journal_time(path: str) -> int | None:
    """The first part of :func:`key_of`: the time of the run's journal (-1: none; None: no
    run directory there)."""
    try:
        return os.stat(f"{path}/journal").st_mtime_ns
    except FileNotFoundError:
        return -1  # a run directory whose journal is gone still lists (a state, why)
    except OSError:
        return None


def key_of(path: str) -> list[int] | None:
    """The ``stat`` key of the run directory at ``path`` (None: no run directory there): the
    time of its journal (every change of the run's state, and of its config or code, is a new
    entry; DONE comes with the ``ended`` entry) and the size and time of metrics.jsonl (the
    steps logged). Two ``stat`` calls: a listing of 10,000 runs makes 20,000."""
    journal = journal_time(path)
    if journal is None:
        return None
    try:
        metrics = os.stat(f"{path}/metrics.jsonl")
        return [journal, metrics.st_size, metrics.st_mtime_ns]
    except OSError:
        return [journal, -1, 0]


def entries_of(path: str) -> list[Any]:
    """How many journal entries the run has and the newest one's name: exact, unlike a time."""
    try:
        names = [n for n in os.listdir(f"{path}/journal") if n.endswith(".json")]
    except OSError:
        return [0, ""]
    return [len(names), max(names, default="")]


def settled(key: list[int]) -> bool:
    """Whether every time in ``key`` is far enough in the past to tell any later write."""
    return time.time_ns() - max(key[0], key[2]) > SETTLE_NS


@dataclass
class Row:
    key: list[int]
    entries: list[Any]
    settled: bool
    facts: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "entries": self.entries, "settled": self.settled,
                "facts": self.facts}  # fmt: skip


def make_row(path: Path) -> tuple[Row, RunFacts] | None:
    """The run at ``path`` read in full, with its key taken before (a write while it is read
    makes the key stale, never the facts); None when it is not a run directory. A UserError or
    EnvironmentProblem when it is one that cannot be read."""
    key = key_of(str(path))
    if key is None or not os.path.isfile(f"{path}/config.json"):
        return None
    entries = entries_of(str(path))
    facts = read_facts(path)
    return Row(key, entries, settled(key), plain(facts)), facts


_FIELDS: dict[type, tuple[str, ...]] = {}


def plain(value: Any) -> Any:
    """``value`` (:class:`RunFacts`) as :meth:`RunFacts.to_json` gives it, with every dataclass
    in it a dict as :func:`dataclasses.asdict` makes them (tuples stay tuples, dicts and lists
    are copied) but without its deep copy of every leaf: asdict was a fifth of the time of
    reading a run directory for the index."""
    kind = type(value)
    names = _FIELDS.get(kind)
    if names is None and hasattr(kind, "__dataclass_fields__"):
        names = _FIELDS.setdefault(kind, tuple(f.name for f in fields(value)))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if kind is tuple or kind is list:
        return kind(plain(v) for v in value)
    if kind is dict:
        return {k: plain(v) for k, v in value.items()}
    return value


# Run states after which nothing writes metrics.jsonl until the journal says so (a resubmit's
# ``submitted``): the chief writes DONE after its last step, and a failure is the job-end's
# record, after the job. Not cancelled: the workers of a cancelled job may log a step after.
METRICS_FINAL_STATES = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.GAVE_UP})


def _metrics_final(row: Row) -> bool:
    """Whether ``row`` is of a run whose metrics.jsonl cannot have changed while its journal
    did not: a settled row of an ended run (:data:`METRICS_FINAL_STATES`), whose key is then
    checked by its journal's time alone (one ``stat`` a run, not two: `hpctf status SWEEP` of
    a finished sweep reads half the directory blocks from a cold page cache)."""
    state = row.facts.get("state")
    return (
        row.settled is True
        and len(row.key) == 3
        and isinstance(state, dict)
        and state.get("state") in METRICS_FINAL_STATES
    )


def _row(data: Any) -> Row | None:
    try:
        row = Row(data["key"], data["entries"], data["settled"], data["facts"])
    except (KeyError, TypeError):
        return None
    ok = isinstance(row.key, list) and isinstance(row.entries, list) and isinstance(row.facts, dict)
    return row if ok else None


class Index:
    """One runs root's index: read once, rows made where stale, saved once if changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / INDEX_DIR
        self.rows: dict[str, Row] = {}
        self.merged: list[Path] = []  # pending rows read, removed once saved
        self.changed = False
        self._load()

    def _load(self) -> None:
        if not private_folder(self.folder, create=False):
            self.changed = True  # none of ours here: made (where it may be) from the runs
            return
        try:
            with (self.folder / INDEX_FILE).open("rb") as handle:
                data = json.loads(handle.read(MAX_INDEX_BYTES))
            if data.get("version") == VERSION:
                for path, value in data["rows"].items():
                    if (row := _row(value)) is not None:
                        self.rows[path] = row
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            self.changed = True  # missing or damaged: made again from the run directories
        if private_folder(self.folder / PENDING_DIR, create=False):
            with contextlib.suppress(OSError):
                for pending in os.scandir(self.folder / PENDING_DIR):
                    self._merge(Path(pending.path))

    def _merge(self, pending: Path) -> None:
        try:
            with pending.open("rb") as handle:
                data = json.loads(handle.read(MAX_PENDING_BYTES))
            row = _row(data)
            path = str(data["path"])
        except (OSError, ValueError, KeyError, TypeError):
            row, path = None, ""
        if row is not None:
            self.rows[path] = row
        self.merged.append(pending)
        self.changed = True

    def cached(self, path: Path) -> RunFacts | int | None:
        """The facts of the run at ``path`` (a resolved path) from its row while the row is
        current; else the time of its journal in ns (-1: none; what a lazy listing reads
        newest first: a journal changes with every record), or None when nothing is there."""
        name = str(path)
        row = self.rows.get(name)
        if row is not None and _metrics_final(row):
            # One stat: its journal's time (the metrics of an ended run no longer change).
            journal = journal_time(name)
            key = row.key if journal == row.key[0] else key_of(name)
        else:
            key = key_of(name)
        if key is None:
            return None
        if row is not None and row.key == key and self._current(path, row):
            try:
                return RunFacts.from_json(row.facts)
            except (KeyError, TypeError, ValueError):
                pass  # a row of another shape: made again
        return key[0]

    def facts(self, path: Path) -> RunFacts | None:
        """The facts of the run at ``path`` (a resolved path), from its row while the row is
        current, else read from the directory (and the row made again). None: not a run."""
        found = self.cached(path)
        if isinstance(found, RunFacts):
            return found
        name = str(path)
        made = None if found is None else make_row(path)
        if made is None:
            if self.rows.pop(name, None) is not None:
                self.changed = True
            return None
        self.rows[name], facts = made
        self.changed = True
        return facts

    def _current(self, path: Path, row: Row) -> bool:
        if row.settled is True:
            return True
        if entries_of(str(path)) != row.entries:
            return False
        if settled(row.key):
            row.settled = True
            self.changed = True
        return True

    def save(self, keep: Iterable[str] | None = None) -> None:
        """Write the index if it changed (rows of runs gone are dropped when ``keep`` names
        every run there is); a runs root that cannot be written keeps no index."""
        if keep is not None:
            wanted = set(keep)
            for name in [n for n in self.rows if n not in wanted]:
                del self.rows[name]
                self.changed = True
        if not self.changed:
            return
        document = {"version": VERSION, "rows": {n: r.to_json() for n, r in self.rows.items()}}
        if not private_folder(self.folder, create=True):
            return  # a runs root that is not ours, or not writable: listed without an index
        try:
            write_atomic(self.folder / INDEX_FILE, json.dumps(document, separators=(",", ":")))
        except (OSError, EnvironmentProblem):
            return
        for pending in self.merged:
            with contextlib.suppress(OSError):
                pending.unlink()


def note(run: RunDir, config: ResolvedConfig, history: RunHistory) -> None:
    """A command changed ``run``: write its row to its runs root's pending rows (the run
    directory's parent), so the next listing need not read it again. ``history`` is the run's
    as the command knows it after its writes; when the journal holds more entries than that
    (another writer, or records the command did not add to it) it is read again here. Never
    fails the command: an index is a cache."""
    path = str(run.path)
    try:
        key = key_of(path)
        entries = entries_of(path)
        if key is None:
            return
        if entries[0] != len(history.events) + len(history.damaged):
            history = read_history(run)
        facts = facts_of(run, config, history)
        index = run.path.parent / INDEX_DIR
        folder = index / PENDING_DIR
        if not (private_folder(index, create=True) and private_folder(folder, create=True)):
            return
        name = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()
        row = Row(key, entries, False, facts.to_json())
        write_atomic(folder / f"{name}.json", json.dumps({"path": path, **row.to_json()}))
    except (OSError, UserError, EnvironmentProblem):
        return
