"""Journal records for tests, written as hpctf's own writers name them
(:mod:`hpctf.core.run.journal`):
entries for the pure run-state tests, and ``write_events`` to put them into a run directory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctf.core.run import journal
from hpctf.core.run.history.decisions import Budgets
from hpctf.core.run.rundir import RunDir

BUDGETS = Budgets(preemption=2, failure=2)


def started(step: int = 0, job: str = "7") -> dict[str, Any]:
    return {"event": journal.STARTED, "job_id": job, "step": step}


def ended(reason: str, step: int, code: int = 1, job: str = "7") -> dict[str, Any]:
    return {
        "event": journal.ENDED,
        "job_id": job,
        "reason": reason,
        "step": step,
        "exit_code": code,
    }


def requeued(job: str = "7") -> dict[str, Any]:
    return {"event": journal.REQUEUED, "job_id": job}


SUBMITTED = {"event": journal.SUBMITTED, "job_id": "7"}


def write_events(path: Path, *events: Mapping[str, Any]) -> None:
    """Append events to a run's journal, each with its own time (default: now)."""
    run = RunDir(path)
    for event in events:
        fields = dict(event)
        kind = str(fields.pop("event"))
        when = fields.pop("time", None)
        run.record(kind, **fields)
        if when is not None:  # rewrite the time of the record just written
            last = sorted(run.journal.glob("*.json"))[-1]
            data = json.loads(last.read_text())
            data["time"] = when
            last.write_text(json.dumps(data))
