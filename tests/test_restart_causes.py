"""Restarts typed by cause (issue #44, item 3): the history decides once why a run starts
again (:attr:`hpctf.core.run.history.runstate.Start.cause`), which budget it counts against,
and stops a run that makes no progress across two restarts in a row for the same outside
cause (a lost node, a lost peer) with one line naming it, instead of looping. Pure: journals
as entries, hpctf's own event names."""

from __future__ import annotations

from typing import Any

import pytest

from hpctf.core.run import journal
from hpctf.core.run.history import RestartCause
from hpctf.core.run.history.decisions import after_end, before_start
from hpctf.core.run.history.runstate import run_state
from hpctf.core.run.history.states import CAUSE_BUDGETS
from tests.journal_records import BUDGETS, ended, started


def peer_lost(job: str = "7", rank: int = 0) -> dict[str, Any]:
    line = f"rank {1 - rank} (n2:9000 on node n2) stopped answering"
    return {"event": journal.PEER_LOST, "job_id": job, "node": "n1", "rank": rank, "line": line}


USER_CODE = {"event": journal.USER_CODE_FAILED, "job_id": "7", "rank": 0, "line": "x.py:3: boom"}
DISK_FULL = {"event": journal.ENVIRONMENT_FAILED, "job_id": "7", "why": "disk full"}

# (case, the start's records, the cause decided, the budget it counts against)
CASES = [
    ("preempted", [ended("preempted", 10, 75)], RestartCause.PREEMPTION, "preemption"),
    ("walltime", [ended("timeout", 10, 75)], RestartCause.WALLTIME, "preemption"),
    ("planned", [ended("restart", 10, 75)], RestartCause.PLANNED, None),
    ("crash", [ended("failed", 10, 137)], RestartCause.WORKER_CRASHED, "failure"),
    ("stall", [ended("stalled", 10, 124)], RestartCause.STALL, "failure"),
    ("node lost", [ended("node_fail", 10, 0)], RestartCause.NODE_LOST, "failure"),
    ("peer lost", [peer_lost(), ended("failed", 10, 3)], RestartCause.PEER_LOST, "failure"),
    ("user code", [USER_CODE, ended("failed", 10, 65)], RestartCause.USER_CODE, None),
    ("full disk", [DISK_FULL, ended("failed", 10, 3)], RestartCause.ENVIRONMENT, None),
]


@pytest.mark.parametrize(("records", "cause", "budget"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_each_end_has_one_cause_and_one_budget(
    records: list[dict[str, Any]], cause: RestartCause, budget: str | None
) -> None:
    state = run_state([started(0), *records])
    assert state.starts[-1].cause is cause
    assert CAUSE_BUDGETS[cause] == budget
    assert {c for c in RestartCause} == set(CAUSE_BUDGETS)


def test_a_finished_or_running_start_has_no_cause() -> None:
    assert run_state([started(0)]).starts[-1].cause is None
    assert run_state([started(0), ended("done", 10, 0)]).starts[-1].cause is None
    assert run_state([started(0), ended("cancelled", 10, 143)]).starts[-1].cause is None


@pytest.mark.parametrize(
    "lost", [[ended("node_fail", 10, 0)], [peer_lost(), ended("failed", 10, 3)]],
    ids=["node", "peer"],
)  # fmt: skip
def test_an_outside_loss_without_progress_is_tried_again_once_then_stops_naming_it(
    lost: list[dict[str, Any]],
) -> None:
    """A lost node or peer is not the code's fault: a start that made no progress is tried
    again; the same loss again at the same checkpoint step stops the run in one line."""
    once = run_state([started(10), *lost])
    assert before_start(once, BUDGETS).go
    twice = run_state([started(10), *lost, started(10), *lost])
    # A lost peer: hpctf's own requeue decides; a lost node: Slurm requeued the job, and its
    # next start is refused.
    decision = after_end(twice, BUDGETS) if lost[0]["event"] == journal.PEER_LOST else None
    if decision is not None:
        assert after_end(once, BUDGETS).go
    else:
        decision = before_start(twice, BUDGETS)
    assert not decision.go and decision.gave_up
    cause = twice.starts[-1].cause
    assert f"({cause}) twice in a row without progress (checkpoint step 10)" in decision.why
    assert "\n" not in decision.why


def test_an_outside_loss_after_progress_is_tried_again_within_the_failure_budget() -> None:
    lost = ended("node_fail", 20, 0)
    state = run_state([started(10), ended("node_fail", 10, 0), started(10), lost])
    assert before_start(state, BUDGETS).go  # the second start advanced: not in a row
    over = run_state([started(10), lost, started(20), ended("node_fail", 30, 0)] * 2)
    assert not before_start(over, BUDGETS).go  # past the failure budget, as before


def test_a_crash_at_the_same_step_is_not_tried_again_and_names_it() -> None:
    state = run_state([started(10), ended("failed", 10, 137)])
    decision = after_end(state, BUDGETS)
    assert not decision.go and decision.gave_up and "without progress" in decision.why
    assert state.starts[-1].cause is RestartCause.WORKER_CRASHED
