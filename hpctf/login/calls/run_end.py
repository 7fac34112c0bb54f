"""Whether a run will not start again by itself, from its ``status --json`` document: what
:meth:`hpctf.Run.wait`, :func:`hpctf.python_api.remote_run.wait_all` and a sweep's end wait
for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpctf.core.run.history import RunStatus
from hpctf.core.scheduler.slurm import FINAL_STATES


def has_ended(document: Mapping[str, Any]) -> bool:
    """A final state; or preempted (saved and stopped) with no job of Slurm's left that may
    requeue it."""
    state = RunStatus(document["state"])
    if state.final:
        return True
    if state != RunStatus.PREEMPTED:
        return False
    slurm = document.get("slurm")
    return not slurm or slurm.get("state") in FINAL_STATES
