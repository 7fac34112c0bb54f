"""The journal's schema: no event name written outside :mod:`hpctf.core.run.journal`, older names
read as today's, one job handle (pure; no Slurm, no TensorFlow)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from hpctf.core.run import journal
from hpctf.core.run.history.runstate import run_state
from hpctf.core.run.rundir import RunDir

HPCTF = Path(journal.__file__).resolve().parents[1]
NAMES = journal.EVENTS | set(journal.OLD_NAMES)


def _is_event_field(node: ast.expr) -> bool:
    """``x["event"]`` or ``x.get("event")``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "event"
    )


def _names_in(node: ast.expr) -> list[str]:
    """The event names written as string literals in ``node`` (a constant or a collection)."""
    values = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [
        v.value
        for v in values
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in NAMES
    ]


def event_literals(source: str) -> list[tuple[int, str]]:
    """Where ``source`` names a journal event by a string literal: compared with an entry's
    ``event``, passed as the event to a ``record`` call, as a dict's ``"event"``, or in a
    journal file glob."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_event_field(side) for side in sides):
                found += [(node.lineno, n) for side in sides for n in _names_in(side)]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "record" or name.startswith("record_"):
                found += [(node.lineno, n) for n in _names_in(node.args[0])]
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "event":
                    found += [(node.lineno, n) for n in _names_in(value)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, n) for n in NAMES if node.value.endswith(f"-{n}.json")]
    return found


def test_the_check_finds_event_names_in_each_place_it_looks() -> None:
    source = (
        'a = e["event"] == "started"\n'
        'b = e.get("event") in ("gave_up", "cancelled")\n'
        'run.record("code-updated", sources=[])\n'
        'c = {"event": "node_failed"}\n'
        'd = run.journal.glob("*-created.json")\n'
        'ok = state == "cancelled" or e.get("event") == journal.STARTED\n'
    )
    assert event_literals(source) == [
        (1, "started"),
        (2, "gave_up"),
        (2, "cancelled"),
        (3, "code-updated"),
        (4, "node_failed"),
        (5, "created"),
    ]


def test_no_event_name_is_written_outside_the_journal_module() -> None:
    found = [
        f"{path.relative_to(HPCTF.parent)}:{line}: {name!r}"
        for path in sorted(HPCTF.rglob("*.py"))
        if path != Path(journal.__file__).resolve()
        for line, name in event_literals(path.read_text(encoding="utf-8"))
    ]
    assert not found, "use the names in hpctf.core.run.journal:\n" + "\n".join(found)


def test_a_journal_written_by_an_older_hpctf_reads_as_today(tmp_path: Path) -> None:
    """Event names of older run directories: ``preempted`` (the save on a warning),
    ``node_failed``, ``code-updated``, ``checkpoints-discarded``."""
    run = RunDir(tmp_path)
    run.journal.mkdir()
    old: list[dict[str, Any]] = [
        {"event": "submitted", "job_id": "7"},
        {"event": "code-updated", "sources": ["/src"]},
        {"event": "checkpoints-discarded", "moved_to": "checkpoints-discarded-1"},
        {"event": "started", "job_id": "7", "step": 0},
        {"event": "node_failed", "job_id": "7", "nodes": ["node1"]},
        {"event": "preempted", "job_id": "7", "step": 110, "signal": "USR2"},
        {"event": "started", "job_id": "7", "step": 110},
    ]
    for number, entry in enumerate(old):
        entry["time"] = f"2026-12-01T00:00:{number:02d}+00:00"
        name = f"{number:020d}-1-{entry['event']}.json"
        (run.journal / name).write_text(json.dumps(entry))
    events = run.events()
    assert [e["event"] for e in events] == [
        journal.SUBMITTED,
        journal.CODE_UPDATED,
        journal.CHECKPOINTS_DISCARDED,
        journal.STARTED,
        journal.NODES_DOWN,
        journal.SAVED_ON_WARNING,
        journal.STARTED,
    ]
    state = run_state(events)
    assert state.failed_nodes == ("node1",)
    # Killed after the ranks saved on USR2, the site default's walltime signal then.
    assert [(s.reason, s.end_step) for s in state.starts] == [("timeout", 110), (None, None)]


def test_every_writer_names_an_event_of_the_schema(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    journal.record_started(run, "7", "node1", "TERM", slurm_job_id="8", restart_count=1)
    journal.record_saved_on_warning(run, "7", 100, "TERM")
    journal.record_nodes_down(run, "7", ["node1"], "TERM")
    journal.record_ended(run, "7", 75, "preempted")
    (started, saved, down, ended) = run.events()
    assert started["walltime_signal"] == "TERM" and started["step"] == 0
    assert (started["slurm_job_id"], started["restart_count"]) == ("8", 1)
    assert saved["event"] == journal.SAVED_ON_WARNING and down["nodes"] == ["node1"]
    assert "node_checks_failed" not in ended
    assert {e["event"] for e in run.events()} <= journal.EVENTS


@pytest.mark.parametrize(
    ("env", "handle"),
    [
        ({}, None),
        ({"SLURM_JOB_ID": "42"}, "42"),
        # The last task of an array gets the array's own id: its handle is the task's.
        ({"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}, "40_3"),
        ({"SLURM_JOB_ID": "42", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": ""}, "42"),
    ],
)
def test_job_handle(env: dict[str, str], handle: str | None) -> None:
    assert journal.job_handle(env) == handle
