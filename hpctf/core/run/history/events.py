"""The journal's entries as typed events: one frozen dataclass per event name of
:mod:`hpctf.core.run.journal`, parsed once from the entries a run directory holds.

The journal is data anyone who can write the run directory controls, and older hpctf wrote
fewer fields: every field is read leniently (a missing or mistyped value becomes the field's
empty value, never an exception), and an event name this hpctf does not know becomes
:class:`Unknown` (its job id still counts). Only this package looks at an entry's event name
(a test says so): every other reader takes a :class:`hpctf.core.run.history.RunHistory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctf.core.run import journal


@dataclass(frozen=True)
class Event:
    """What every entry has: the writer's clock (ISO 8601; "" when missing) and the job it
    names (None: none)."""

    time: str = ""
    job_id: str | None = None


@dataclass(frozen=True)
class Created(Event):
    experiment: str = ""
    site: str = ""
    run_dir: str = ""


@dataclass(frozen=True)
class Submitted(Event):
    exclude: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None


@dataclass(frozen=True)
class CodeUpdated(Event):
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointsDiscarded(Event):
    moved_to: str = ""


@dataclass(frozen=True)
class Extended(Event):
    changes: dict[str, Any] = field(default_factory=dict)
    previous_done: Any = None


@dataclass(frozen=True)
class Started(Event):
    step: int = 0
    nodes: str | None = None
    walltime_signal: str | None = None
    hpctf: str | None = None
    slurm_job_id: str | None = None
    restart_count: int | None = None


@dataclass(frozen=True)
class Signalled(Event):
    signal: str = ""


@dataclass(frozen=True)
class NodesDown(Event):
    nodes: tuple[str, ...] = ()
    signal: str = ""


@dataclass(frozen=True)
class Excluded(Event):
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SavedOnWarning(Event):
    step: int | None = None
    signal: str | None = None


@dataclass(frozen=True)
class SavedForRestart(Event):
    step: int | None = None


@dataclass(frozen=True)
class Pruned(Event):
    """A search's pruner stopped the trial after its ``evaluation``-th evaluation, where
    ``metric`` was ``value``; every rank saved ``step``."""

    step: int | None = None
    evaluation: int | None = None
    metric: str = ""
    value: float | None = None


@dataclass(frozen=True)
class EnvironmentFailed(Event):
    why: str = ""


@dataclass(frozen=True)
class UserCodeFailed(Event):
    node: str = ""
    rank: int | None = None
    error: str = ""
    at: str | None = None
    line: str = ""


@dataclass(frozen=True)
class PeerLost(Event):
    node: str = ""
    rank: int | None = None
    line: str = ""


@dataclass(frozen=True)
class NodeCheckFailed(Event):
    node: str | None = None
    rank: int | None = None
    check: str | None = None
    detail: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Ended(Event):
    exit_code: int | None = None
    reason: str = ""
    step: int | None = None
    source: str | None = None
    slurm_state: str | None = None


@dataclass(frozen=True)
class Requeued(Event):
    why: str = ""


@dataclass(frozen=True)
class Released(Event):
    after_s: float | None = None


@dataclass(frozen=True)
class GaveUp(Event):
    why: str = ""


@dataclass(frozen=True)
class Cancelled(Event):
    jobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotStarted(Event):
    owner: str = ""


@dataclass(frozen=True)
class Notified(Event):
    """``notify:``'s message of event ``notice`` about the ``start``-th start went out."""

    notice: str = ""
    start: int = 0
    via: str = ""


@dataclass(frozen=True)
class Unknown(Event):
    """An entry whose event name this hpctf does not know (a newer hpctf's)."""

    name: str = ""


KINDS: dict[str, type[Event]] = {
    journal.CREATED: Created,
    journal.SUBMITTED: Submitted,
    journal.CODE_UPDATED: CodeUpdated,
    journal.CHECKPOINTS_DISCARDED: CheckpointsDiscarded,
    journal.EXTENDED: Extended,
    journal.STARTED: Started,
    journal.SIGNALLED: Signalled,
    journal.NODES_DOWN: NodesDown,
    journal.EXCLUDED: Excluded,
    journal.SAVED_ON_WARNING: SavedOnWarning,
    journal.SAVED_FOR_RESTART: SavedForRestart,
    journal.PRUNED: Pruned,
    journal.ENVIRONMENT_FAILED: EnvironmentFailed,
    journal.USER_CODE_FAILED: UserCodeFailed,
    journal.NODE_CHECK_FAILED: NodeCheckFailed,
    journal.PEER_LOST: PeerLost,
    journal.ENDED: Ended,
    journal.REQUEUED: Requeued,
    journal.RELEASED: Released,
    journal.GAVE_UP: GaveUp,
    journal.CANCELLED: Cancelled,
    journal.NOT_STARTED: NotStarted,
    journal.NOTIFIED: Notified,
}
assert set(KINDS) == journal.EVENTS, "every event of the journal has its type"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _maybe_text(value: Any) -> str | None:
    return None if value is None else str(value)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


# How each annotated field type is read from an entry's value, leniently.
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": _text,
    "str | None": _maybe_text,
    "int": lambda v: _whole(v) or 0,
    "int | None": _whole,
    "float | None": _number,
    "tuple[str, ...]": _texts,
    "dict[str, Any]": _mapping,
    "Any": lambda v: v,
}
_FIELDS: dict[type[Event], tuple[tuple[str, Callable[[Any], Any]], ...]] = {
    kind: tuple((f.name, _READERS[str(f.type)]) for f in dataclasses.fields(kind))
    for kind in (*KINDS.values(), Unknown)
}


def parse(entry: Mapping[str, Any]) -> Event:
    """One journal entry (as :meth:`hpctf.core.run.rundir.RunDir.read_journal` reads it, an
    older name already upgraded) as its typed event."""
    name = entry.get("event")
    kind = KINDS.get(name, Unknown) if isinstance(name, str) else Unknown
    values = {key: read(entry.get(key)) for key, read in _FIELDS[kind]}
    if kind is Unknown:
        values["name"] = _text(name)
    return kind(**values)


def typed(entries: Iterable[Mapping[str, Any] | Event]) -> tuple[Event, ...]:
    """``entries`` as typed events: those already typed as they are, the rest parsed."""
    return tuple(e if isinstance(e, Event) else parse(e) for e in entries)
