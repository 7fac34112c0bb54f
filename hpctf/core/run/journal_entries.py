"""One entry of the run's journal as it is stored (:mod:`hpctf.core.run.journal` names the
events and writes them): its file's name, which sorts in the order entries were written
(:func:`file_name`, :func:`next_stamp`), its fields stamped with the writer's clock and
redacted (:func:`entry`), and the shape a reader checks (:func:`problem`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from hpctf.core.secrets import redact_data


def file_name(stamp_ns: int, pid: int, event: str) -> str:
    """The name of one entry's file: sorted by name, the journal is in the order it was
    written (:func:`next_stamp`)."""
    return f"{stamp_ns:020d}-{pid}-{event}.json"


def next_stamp(names: Sequence[str], now_ns: int) -> int:
    """The ordering number of a new entry, given the names in the journal now: the clock's
    ``now_ns``, or one past the newest entry's number when that is later. So an entry always
    sorts after every entry written before it, whatever the clocks say: a clock stepped back,
    or the login node's and a compute node's clocks a minute apart (an ``ended`` record
    named 23 s before its ``started`` made a finished run read as running). The entry's
    ``time`` field keeps the writer's clock: a time is data, never the order.

    A name more than :data:`AHEAD_NS` ahead of this clock is not followed: one planted as
    ``99999999999999999999-...`` would otherwise push every later entry past 20 digits."""
    stamps = (int(n[:20]) for n in names if n[:20].isdigit() and n[20:21] == "-")
    newest = max((s for s in stamps if s <= now_ns + AHEAD_NS), default=0)
    return max(now_ns, newest + 1)


# Clocks of one cluster disagree by seconds; an hour is beyond any clock step seen.
AHEAD_NS = 3600 * 10**9


# A job id in the journal: a Slurm job, an array task (<job>_<task>) or a local launcher's pid.
_JOURNAL_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")


def problem(entry: object) -> str | None:
    """What is wrong with one parsed journal entry, or None when it has the shape hpctf's
    writers give it: an object with a string ``event`` and ``time``, a ``job_id`` of Slurm's
    forms, whole numbers for ``step`` and ``exit_code``."""
    if not isinstance(entry, dict):
        return f"not an object but {type(entry).__name__}"
    for key in ("event", "time"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"no {key!r} string"
    job_id = entry.get("job_id")
    if job_id is not None and not _JOURNAL_JOB_ID.fullmatch(str(job_id)):
        return f"job_id {str(job_id)[:60]!r} is not a job id"
    for key in ("step", "exit_code"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{key} {str(value)[:60]!r} is not a whole number"
    return None


def entry(event: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """One journal entry: the event, the writer's clock, its fields, every text in them
    redacted of the secrets this process knows (the journal is readable by whoever may read
    the run: a user exception's line may quote a token)."""
    return {
        "event": event,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **redact_data(dict(fields)),
    }
