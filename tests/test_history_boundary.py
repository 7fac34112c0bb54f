"""The journal is read and interpreted in one place, :mod:`hpctf.core.run.history`: no other
module of hpctf filters events by name (an entry's ``event`` field, the event-name constants of
:mod:`hpctf.core.run.journal`, a journal file glob), reads the journal's raw entries, or looks
at the typed events themselves; they take a :class:`~hpctf.core.run.history.RunHistory`."""

from __future__ import annotations

import ast
from pathlib import Path

from hpctf.core.run import journal

HPCTF = Path(journal.__file__).resolve().parents[2]
HISTORY = HPCTF / "core" / "run" / "history"
# journal.py names the events and writes them; rundir.py stores and reads the raw entries.
ALLOWED = {HPCTF / "core" / "run" / "journal.py"}
RAW_READER = HPCTF / "core" / "run" / "rundir.py"
EVENT_CONSTANTS = {
    name
    for name, value in vars(journal).items()
    if name.isupper() and isinstance(value, str) and value in journal.EVENTS
}
NAMING = EVENT_CONSTANTS | {"EVENTS", "OLD_NAMES", "files_of"}


def _is_event_field(node: ast.AST) -> bool:
    """``x["event"]``, ``x.get("event")``, ``x.pop("event")``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "pop")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "event"
    )


def filtering(source: str, raw_reader: bool = False) -> list[tuple[int, str]]:
    """Where ``source`` looks at journal events by name, or reads or types them itself."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if _is_event_field(node):
            found.append((node.lineno, "an entry's 'event' field"))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "journal"
            and node.attr in NAMING
        ):
            found.append((node.lineno, f"journal.{node.attr}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("events", "read_journal")
            and not node.args
            and not raw_reader
        ):
            found.append((node.lineno, f".{node.func.attr}(): the raw entries"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "hpctf.core.run.history."
        ):
            found.append((node.lineno, f"from {node.module}: the package's inside"))
    return sorted(found, key=lambda f: f[0])


def test_the_check_finds_each_kind_of_filtering() -> None:
    source = (
        'a = [e for e in events if e["event"] == "x"]\n'
        'b = e.get("event")\n'
        "c = kind == journal.STARTED\n"
        "d = run.journal.glob(journal.files_of(journal.CREATED))\n"
        "e = run.events()\n"
        "f, g = run.read_journal()\n"
        "from hpctf.core.run.history.events import Started\n"
        "ok = journal.record_started(run, '7', None, 'USR2') or read_history(run).state\n"
        "from hpctf.core.run.history import RunHistory\n"
    )
    assert filtering(source) == [
        (1, "an entry's 'event' field"),
        (2, "an entry's 'event' field"),
        (3, "journal.STARTED"),
        (4, "journal.files_of"),
        (4, "journal.CREATED"),
        (5, ".events(): the raw entries"),
        (6, ".read_journal(): the raw entries"),
        (7, "from hpctf.core.run.history.events: the package's inside"),
    ]
    assert len(EVENT_CONSTANTS) == len(journal.EVENTS)


def test_no_module_outside_the_history_filters_events_by_name() -> None:
    found = [
        f"{path.relative_to(HPCTF.parent)}:{line}: {what}"
        for path in sorted(HPCTF.rglob("*.py"))
        if path not in ALLOWED and HISTORY not in path.parents
        for line, what in filtering(path.read_text(encoding="utf-8"), path == RAW_READER)
    ]
    assert not found, (
        "read a run's journal with hpctf.core.run.history.read_history and ask the RunHistory:\n"
        + "\n".join(found)
    )
