"""The run's state and the requeue decision, from journal records alone: every reason and
every budget edge (pure; no Slurm, no TensorFlow)."""

from __future__ import annotations

from typing import Any

import pytest

from hpctf.core.errors import PREEMPTED_EXIT, STALLED_EXIT
from hpctf.core.run import journal
from hpctf.core.run.history import RunHistory
from hpctf.core.run.history.decisions import after_end, before_start
from hpctf.core.run.history.ends import REASONS, end_of_start, end_reason
from hpctf.core.run.history.events import typed
from hpctf.core.run.history.runstate import run_state, starts_of
from tests.journal_records import BUDGETS, SUBMITTED, ended, requeued, started


@pytest.mark.parametrize(
    ("code", "done", "warned", "signalled", "cancelled", "reason"),
    [
        (0, True, None, False, False, "done"),
        (PREEMPTED_EXIT, False, "USR2", False, False, "timeout"),
        (PREEMPTED_EXIT, False, "TERM", False, False, "preempted"),
        # srun may report the kill of a rank still exiting after the save: the record decides.
        (137, False, "USR2", True, False, "timeout"),
        (PREEMPTED_EXIT, False, None, False, False, "preempted"),
        (STALLED_EXIT, False, None, False, False, "stalled"),
        (1, False, None, False, False, "failed"),
        (143, False, None, True, False, "node_fail"),
        # srun's 143/137 after --kill-on-bad-exit ended the others: a failure, not a node.
        (143, False, None, False, False, "failed"),
        (137, False, None, False, False, "failed"),
        (143, False, None, True, True, "cancelled"),
        # scancel's SIGTERM made the ranks save as on a preemption: still a cancel, no requeue.
        (PREEMPTED_EXIT, False, "TERM", True, True, "cancelled"),
        (0, False, None, False, False, "done"),
    ],
)
def test_end_reason(
    code: int, done: bool, warned: str | None, signalled: bool, cancelled: bool, reason: str
) -> None:
    assert end_reason(code, done, warned, signalled, cancelled) == reason
    assert reason in REASONS


def test_the_walltime_signal_is_the_sites() -> None:
    assert end_reason(75, False, "TERM", False, False, walltime_signal="TERM") == "preempted"
    assert end_reason(75, False, "USR2", False, False, walltime_signal="USR2") == "timeout"


@pytest.mark.parametrize(
    ("events", "state", "why"),
    [
        ([], "queued", ""),
        ([SUBMITTED], "queued", ""),
        ([SUBMITTED, started()], "running", ""),
        ([SUBMITTED, started(), ended("done", 300, 0)], "done", ""),
        (
            [SUBMITTED, started(), ended("timeout", 100, 75), requeued()],
            "requeued",
            "after timeout",
        ),
        ([SUBMITTED, started(), ended("failed", 0, 1)], "failed", "exit 1"),
        # Saved an agreed step and nothing requeued it (a local run's SIGTERM): resumable.
        (
            [SUBMITTED, started(), ended("preempted", 230, 75)],
            "preempted",
            "saved step 230; hpctf resubmit resumes it",
        ),
        (
            [
                SUBMITTED,
                started(),
                ended("failed", 0),
                {"event": journal.GAVE_UP, "why": "no progress"},
            ],
            "gave_up",
            "no progress",
        ),
        (
            [SUBMITTED, started(), {"event": journal.CANCELLED, "jobs": ["7"]}],
            "cancelled",
            "cancelled by the user",
        ),
        # A resubmit after giving up is queued again, then running.
        (
            [
                SUBMITTED,
                started(),
                ended("failed", 0),
                {"event": journal.GAVE_UP, "why": "x"},
                {"event": journal.SUBMITTED, "job_id": "8"},
            ],
            "queued",
            "",
        ),
        # Slurm restarted the job (no end recorded: the batch shell was killed): running again.
        ([SUBMITTED, started(0), started(100)], "running", ""),
    ],
)
def test_run_state(events: list[dict[str, Any]], state: str, why: str) -> None:
    result = run_state(events)
    assert (result.state, result.why) == (state, why)


def saved(signal: str, step: int = 100) -> dict[str, Any]:
    return {"event": journal.SAVED_ON_WARNING, "job_id": "7", "step": step, "signal": signal}


SIGNALLED = {"event": journal.SIGNALLED, "job_id": "7", "signal": "TERM"}
CANCELLED = {"event": journal.CANCELLED, "jobs": ["7"]}
RESTART = {"event": journal.SAVED_FOR_RESTART, "job_id": "7", "step": 100}


@pytest.mark.parametrize(
    ("since", "code", "done", "walltime", "reason"),
    [
        ([], 0, True, "USR2", "done"),
        ([], 0, False, "USR2", "done"),  # a script that exits 0 without DONE
        ([saved("USR2")], PREEMPTED_EXIT, False, "USR2", "timeout"),
        ([saved("TERM")], PREEMPTED_EXIT, False, "USR2", "preempted"),
        # A site whose walltime warning is SIGTERM cannot tell the two: a preemption.
        ([saved("TERM")], PREEMPTED_EXIT, False, "TERM", "preempted"),
        ([saved("USR2"), SIGNALLED], 137, False, "USR2", "timeout"),
        ([], STALLED_EXIT, False, "USR2", "stalled"),
        ([SIGNALLED], 143, False, "USR2", "node_fail"),
        ([], 143, False, "USR2", "failed"),
        ([SIGNALLED, CANCELLED], 143, False, "USR2", "cancelled"),
        ([saved("TERM"), SIGNALLED, CANCELLED], PREEMPTED_EXIT, False, "USR2", "cancelled"),
        # No exit code: the batch shell was killed before job-end (Slurm requeued the job).
        ([], None, False, "USR2", "node_fail"),
        ([SIGNALLED], None, False, "USR2", "node_fail"),
        ([saved("TERM")], None, False, "USR2", "preempted"),
        ([saved("USR2")], None, False, "USR2", "timeout"),
        ([saved("USR2")], None, False, "TERM", "preempted"),
        # The chief's last record decides which warning the ranks saved on.
        ([saved("TERM"), saved("USR2")], None, False, "USR2", "timeout"),
        # train.restart_every_steps: the chief's record, then exit 75 (or no exit code)
        ([RESTART], PREEMPTED_EXIT, False, "USR2", "restart"),
        ([RESTART], None, False, "USR2", "restart"),
        ([RESTART, SIGNALLED, CANCELLED], PREEMPTED_EXIT, False, "USR2", "cancelled"),
        ([RESTART], 1, False, "USR2", "failed"),  # a crash after the save is a crash
    ],
)
def test_end_of_start(
    since: list[dict[str, Any]], code: int | None, done: bool, walltime: str, reason: str
) -> None:
    assert end_of_start(typed(since), code, done, walltime) == reason


def test_a_killed_start_is_closed_with_its_own_walltime_signal() -> None:
    """The start records the site's walltime signal: a start killed after saving on SIGTERM at
    a site that warns of the time limit with SIGTERM ended preempted, at USR2 sites timeout."""
    term = {**started(0), "walltime_signal": "TERM"}
    assert starts_of([term, saved("TERM"), started(100)])[0].reason == "preempted"
    usr2 = {**started(0), "walltime_signal": "USR2"}
    assert starts_of([usr2, saved("USR2"), started(100)])[0].reason == "timeout"


def test_starts_carry_their_times_and_the_jobs_fold_from_them() -> None:
    def at(event: dict[str, Any], second: int) -> dict[str, Any]:
        return {**event, "time": f"2026-12-01T00:00:{second:02d}+00:00"}

    events = [
        at(SUBMITTED, 0),
        at(started(0), 1),
        at(ended("failed", 50), 2),
        at(requeued(), 3),
        at(started(50), 4),
        at(SIGNALLED, 5),
        at({"event": journal.SUBMITTED, "job_id": "8"}, 6),
        at(started(0, job="8"), 7),
        at({"event": journal.GAVE_UP, "job_id": "8", "why": "x"}, 8),
    ]
    first, second, third = starts_of(events)
    assert (first.started_at[-8:-6], first.ended_at, first.requeued) == (
        "01",
        "2026-12-01T00:00:02+00:00",
        True,
    )
    assert (second.ended_at, second.last_at[-8:-6], second.signalled) == (None, "06", True)
    assert third.refused and not second.refused
    assert [(j.job_id, j.starts, j.ended) for j in RunHistory.of(events).jobs] == [
        ("7", 2, False),
        ("8", 1, False),
    ]
    assert RunHistory.of([*events, CANCELLED]).open_jobs == ["8"]
    assert starts_of(events[:6], close_last=True)[-1].reason == "node_fail"


def test_a_start_without_an_end_that_was_restarted_ended_as_node_fail() -> None:
    starts = starts_of([started(0), started(100), ended("done", 300, 0)])
    assert [s.reason for s in starts] == ["node_fail", "done"]
    assert run_state([started(0), started(100)]).failure_requeues == 1


def test_a_start_killed_after_its_ranks_saved_ended_at_that_step() -> None:
    """Slurm preempted the job: the chief recorded the agreed save, then the batch shell was
    killed before job-end ran, and Slurm requeued the job itself."""
    saved = {"event": journal.SAVED_ON_WARNING, "job_id": "7", "step": 110, "signal": "TERM"}
    starts = starts_of([started(0), saved, started(110), ended("done", 300, 0)])
    assert [(s.reason, s.end_step) for s in starts] == [("preempted", 110), ("done", 300)]
    state = run_state([started(0), saved, started(110)])
    assert (state.preemption_requeues, state.failure_requeues) == (1, 0)
    walltime = {**saved, "signal": "USR2"}
    assert starts_of([started(0), walltime, started(110)])[0].reason == "timeout"


def history(*ends: tuple[str, int, int]) -> list[dict[str, Any]]:
    """Starts that each resume from the previous end's step and end as given."""
    events: list[dict[str, Any]] = [SUBMITTED]
    step = 0
    for index, (reason, end_step, code) in enumerate(ends):
        if index:
            events.append(requeued())
        events += [started(step), ended(reason, end_step, code)]
        step = end_step
    return events


@pytest.mark.parametrize(
    ("ends", "go", "gave_up"),
    [
        ([("done", 300, 0)], False, False),
        ([("cancelled", 100, 143)], False, False),
        # Preemption budget 2: the 1st and 2nd warned ends are requeued, the 3rd gives up.
        ([("timeout", 100, 75)], True, False),
        ([("timeout", 100, 75), ("preempted", 200, 75)], True, False),
        ([("timeout", 100, 75), ("timeout", 200, 75), ("timeout", 300, 75)], False, True),
        # A warned end without progress is still a warned end.
        ([("preempted", 0, 75)], True, False),
        # Failures: requeued only with progress, within their own budget.
        ([("failed", 0, 1)], False, True),
        ([("stalled", 0, 124)], False, True),
        ([("failed", 100, 1)], True, False),
        ([("stalled", 100, 124)], True, False),
        ([("failed", 100, 1), ("failed", 200, 1)], True, False),
        ([("failed", 100, 1), ("failed", 200, 1), ("failed", 300, 1)], False, True),
        ([("failed", 100, 1), ("failed", 100, 1)], False, True),  # second start: no progress
        # Killed from outside: Slurm requeues it itself (or not); hpctf does not requeue it
        # again, the next start checks the budget (test_before_start).
        ([("node_fail", 0, 143)], False, False),
        # The budgets are separate.
        ([("timeout", 100, 75), ("timeout", 200, 75), ("failed", 300, 1)], True, False),
        # Planned restarts use no budget: past both budgets, still requeued.
        ([("restart", 100 * n, 75) for n in range(1, 6)], True, False),
        ([("timeout", 100, 75), ("timeout", 200, 75), ("restart", 300, 75)], True, False),
        ([("restart", 100, 75), ("timeout", 200, 75), ("timeout", 300, 75)], True, False),
        ([("failed", 100, 1), ("failed", 200, 1), ("timeout", 300, 75)], True, False),
    ],
)
def test_after_end(ends: list[tuple[str, int, int]], go: bool, gave_up: bool) -> None:
    decision = after_end(run_state(history(*ends)), BUDGETS)
    assert (decision.go, decision.gave_up) == (go, gave_up), decision.why


def test_slurm_ending_the_job_is_not_requeued_twice() -> None:
    """A preemption by a higher-priority partition signals the batch shell too: the ranks
    saved, but Slurm requeues the job itself."""
    events = history(("preempted", 100, 75))
    assert after_end(run_state(events), BUDGETS).go
    signalled = {"event": journal.SIGNALLED, "job_id": "7", "signal": "TERM"}
    decision = after_end(run_state([*events[:-1], signalled, events[-1]]), BUDGETS)
    assert (decision.go, decision.gave_up) == (False, False)


def test_after_end_says_why() -> None:
    decision = after_end(run_state(history(("failed", 0, 1))), BUDGETS)
    assert decision.why.startswith("failed without progress (checkpoint step 0 -> 0)")
    decision = after_end(run_state(history(("timeout", 100, 75))), BUDGETS)
    assert decision.why == "timeout: requeue 1 of 2"
    decision = after_end(run_state(history(("restart", 100, 75), ("restart", 200, 75))), BUDGETS)
    assert decision.why == "restart 2 (train.restart_every_steps): no budget used"
    state = run_state(history(("restart", 100, 75)))  # the requeue did not happen
    assert (state.state, state.preemption_requeues, state.failure_requeues) == ("preempted", 0, 0)
    assert state.why == "saved step 100 to restart; hpctf resubmit resumes it"


@pytest.mark.parametrize(
    ("events", "go", "gave_up"),
    [
        ([SUBMITTED], True, False),
        # Slurm restarts the job after node failures (no end recorded: the shell was killed):
        # with a budget of 2, the 2nd and 3rd starts go on, a 4th does not.
        ([SUBMITTED, started(0)], True, False),
        ([SUBMITTED, started(0), started(0)], True, False),
        ([SUBMITTED, started(0), started(0), started(0)], False, True),
        # Counted whoever requeued: two failures requeued by hpctf, then a Slurm restart.
        ([*history(("failed", 100, 1), ("failed", 200, 1)), started(200)], False, True),
        # The preemption budget, as Slurm's own PreemptMode=REQUEUE spends it.
        (
            [*history(("preempted", 100, 75), ("preempted", 200, 75), ("preempted", 300, 75))],
            False,
            True,
        ),
        ([*history(("preempted", 100, 75), ("preempted", 200, 75))], True, False),
        # Planned restarts count against neither budget.
        ([*history(*[("restart", 100 * n, 75) for n in range(1, 6)])], True, False),
        # A run that gave up does not start again when Slurm restarts it ...
        (
            [*history(("failed", 0, 1)), {"event": journal.GAVE_UP, "why": "no progress"}],
            False,
            True,
        ),
        # ... but does after hpctf resubmit.
        (
            [*history(("failed", 0, 1)), {"event": journal.GAVE_UP, "why": "x"}, SUBMITTED],
            True,
            False,
        ),
        ([*history(("done", 300, 0))], False, False),
    ],
)
def test_before_start(events: list[dict[str, Any]], go: bool, gave_up: bool) -> None:
    decision = before_start(run_state(events), BUDGETS)
    assert (decision.go, decision.gave_up) == (go, gave_up), decision.why


def nodes_down(*nodes: str, job: str = "7") -> dict[str, Any]:
    return {"event": journal.NODES_DOWN, "job_id": job, "nodes": list(nodes)}


@pytest.mark.parametrize(
    ("events", "nodes"),
    [
        ([SUBMITTED, started(0)], ()),
        # Recorded by the batch shell's trap while Slurm requeued the job after a node failure;
        # the ranks saved on the SIGTERM, so the start ended preempted, not node_fail.
        ([SUBMITTED, started(0), nodes_down("node1"), started(100)], ("node1",)),
        # Every failure of the run, first first, each node once, across jobs and resubmits.
        (
            [
                SUBMITTED,
                started(0),
                nodes_down("node3", "node1"),
                started(100),
                nodes_down("node1"),
                {"event": journal.SUBMITTED, "job_id": "8"},
                started(200, job="8"),
                nodes_down("node2", job="8"),
            ],
            ("node3", "node1", "node2"),
        ),
    ],
)
def test_failed_nodes(events: list[dict[str, Any]], nodes: tuple[str, ...]) -> None:
    assert run_state(events).failed_nodes == nodes


def test_a_node_failure_is_not_a_failure_of_the_run() -> None:
    """The node is left out of later starts; the start itself ended as its ranks saw it."""
    saved = {"event": journal.SAVED_ON_WARNING, "job_id": "7", "step": 100, "signal": "TERM"}
    state = run_state([SUBMITTED, started(0), nodes_down("node1"), saved, started(100)])
    assert [s.reason for s in state.starts] == ["preempted", None]
    assert (state.state, state.failure_requeues, state.preemption_requeues) == ("running", 0, 1)


@pytest.mark.parametrize(
    ("advanced", "requeued_without_it"),
    [(True, True), (False, False)],
)
def test_a_start_the_environment_stopped_is_not_requeued(
    advanced: bool, requeued_without_it: bool
) -> None:
    """A full disk at save time: the chief recorded environment_failed and exited 3. With or
    without progress, a requeue would fail at the next save: the run gives up, saying why."""
    why = "cannot save the checkpoint of step 200 in /r/checkpoints: No space left on device"
    step = 100 if advanced else 0
    plain = [SUBMITTED, started(0), ended("failed", step, 3)]
    stopped = [SUBMITTED, started(0), {"event": journal.ENVIRONMENT_FAILED, "why": why}, plain[-1]]
    assert after_end(run_state(plain), BUDGETS).go is requeued_without_it
    decision = after_end(run_state(stopped), BUDGETS)
    assert (decision.go, decision.gave_up) == (False, True)
    assert decision.why == f"failed: {why}"
    assert run_state(stopped).starts[0].environment == why
    # Recorded before the start: it belongs to no start, and stops none.
    early = [SUBMITTED, {"event": journal.ENVIRONMENT_FAILED, "why": why}, started(0), plain[-1]]
    assert run_state(early).starts[0].environment is None
