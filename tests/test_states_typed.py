"""Run states, end reasons and trial states are types decided once, in the run's history
(hpctf/core/run/history/states.py): every other module compares members, never words. A word
compared outside the history is a second decision waiting to drift (a state renamed there
and not here, a state added and not handled)."""

from __future__ import annotations

import ast
import json
from dataclasses import asdict

from hpctf.core.run.history import EndReason, RunStatus, TrialStatus
from hpctf.core.run.history.runstate import RunState, run_state
from tests.conftest import REPO

HISTORY = REPO / "hpctf" / "core" / "run" / "history"
WORDS = {member.value for kind in (RunStatus, EndReason, TrialStatus) for member in kind}


def _words(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [w for element in node.elts for w in _words(element)]
    return []


def words_compared(source: str) -> list[tuple[int, str]]:
    """(line, code) of each comparison in ``source`` of something named a state or a reason
    with a state's or a reason's word."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            "state" in ast.unparse(side).lower() or "reason" in ast.unparse(side).lower()
            for side in sides
            if not isinstance(side, ast.Constant)
        )
        if named and WORDS & {w for side in sides for w in _words(side)}:
            found.append((node.lineno, ast.unparse(node)))
    return found


# Where a set of the same words means something else: notify's events are the user's words in
# the experiment (a Literal), mapped from run states in hpctf/core/run/notifications.py.
OTHER_WORDS = {"hpctf/core/settings/notify.py"}
STATE_WORDS = {member.value for member in RunStatus}


def state_sets(source: str) -> list[tuple[int, str]]:
    """(line, code) of each set, tuple or list in ``source`` of two or more run states'
    words: a second copy of the history's FINAL_STATES or ACTIVE_STATES."""
    return [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Set | ast.Tuple | ast.List)
        and len(STATE_WORDS & set(_words(node))) >= 2
    ]


def test_the_check_finds_a_state_compared_as_a_word() -> None:
    assert words_compared("if run.state.state == 'done': pass") == [
        (1, "run.state.state == 'done'")
    ]
    assert words_compared("ok = last.reason in ('failed', 'stalled')") != []
    assert words_compared("ok = state == RunStatus.DONE") == []
    assert words_compared("ok = status == 'done'") == []  # not a run's state
    assert state_sets("FINAL = frozenset({'done', 'failed'})") == [(1, "{'done', 'failed'}")]
    assert state_sets("FINAL = frozenset({RunStatus.DONE, RunStatus.FAILED})") == []


def test_no_state_or_reason_is_compared_as_a_word_outside_the_history() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {code}"
        for path in sorted((REPO / "hpctf").rglob("*.py"))
        if not path.is_relative_to(HISTORY)
        for line, code in words_compared(path.read_text(encoding="utf-8"))
    ]
    assert not found, "compare RunStatus / EndReason / TrialStatus members:\n" + "\n".join(found)


def test_no_set_of_run_states_is_written_out_outside_the_history() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {code}"
        for path in sorted((REPO / "hpctf").rglob("*.py"))
        if not path.is_relative_to(HISTORY)
        and str(path.relative_to(REPO)) not in OTHER_WORDS
        for line, code in state_sets(path.read_text(encoding="utf-8"))
    ]
    assert not found, "use FINAL_STATES / ACTIVE_STATES of the history:\n" + "\n".join(found)


def test_the_history_decides_members_and_they_read_back_from_words() -> None:
    """The state and every start's reason are members; a JSON round trip (the run index, a
    status document) gives the same members back."""
    events = [
        {"event": "submitted", "job_id": "7", "time": "2026-01-01T00:00:00"},
        {"event": "started", "job_id": "7", "step": 0, "time": "2026-01-01T00:00:01"},
        {"event": "ended", "job_id": "7", "reason": "preempted", "exit_code": 143,
         "step": 10, "time": "2026-01-01T00:00:02"},
    ]  # fmt: skip
    state = run_state(events)
    assert state.state is RunStatus.PREEMPTED and state.state == "preempted"
    assert state.starts[0].reason is EndReason.PREEMPTED
    again = RunState.from_json(json.loads(json.dumps(asdict(state))))
    assert again == state and again.state is RunStatus.PREEMPTED
    assert f"{state.state}" == "preempted" and json.dumps(state.state) == '"preempted"'


def test_a_reason_no_hpctf_wrote_reads_as_a_failure_never_a_success() -> None:
    events = [
        {"event": "started", "job_id": "7", "step": 0, "time": "2026-01-01T00:00:01"},
        {"event": "ended", "job_id": "7", "reason": "vanished", "exit_code": 0, "step": 1,
         "time": "2026-01-01T00:00:02"},
    ]  # fmt: skip
    state = run_state(events)
    assert state.starts[0].reason is EndReason.FAILED
    assert state.state is RunStatus.FAILED


def test_every_run_state_maps_to_a_trial_state() -> None:
    assert TrialStatus.of_run(RunStatus.GAVE_UP) is TrialStatus.FAILED
    assert TrialStatus.of_run(RunStatus.QUEUED) is TrialStatus.PENDING
    assert {TrialStatus.of_run(s) for s in RunStatus} <= set(TrialStatus)
