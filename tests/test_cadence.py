"""What a finished step calls for (:class:`hpctf.compute.loop.cadence.Cadence`), as a table."""

from __future__ import annotations

import pytest

from hpctf.compute.loop.cadence import AgreementClock, Cadence, Due

# log every 10, save every 50, 120 steps in all
RUN = Cadence(log_every=10, save_every=50, total=120)


@pytest.mark.parametrize(
    ("cadence", "step", "next_agreement", "expected"),
    [
        (RUN, 1, 10, Due(log=False, save=False, agree=False)),
        (RUN, 10, 10, Due(log=True, save=False, agree=True)),
        (RUN, 10, 20, Due(log=True, save=False, agree=False)),
        (RUN, 50, 20, Due(log=True, save=True, agree=True)),  # an agreement late: at once
        (RUN, 55, 60, Due(log=False, save=False, agree=False)),
        (RUN, 100, 110, Due(log=True, save=True, agree=False)),
        (RUN, 119, 130, Due(log=False, save=False, agree=False)),
        # the last step: everything, whatever the intervals say
        (RUN, 120, 130, Due(log=True, save=True, agree=True)),
        (Cadence(7, 33, 101), 101, 200, Due(log=True, save=True, agree=True)),
        # the last step unknown: only the intervals
        (Cadence(10, 50, None), 120, 130, Due(log=True, save=False, agree=False)),
        # train.restart_every_steps 30: its multiples are saved and restart, but the last
        (Cadence(10, 50, 120, 30), 30, 40, Due(True, save=True, agree=False, restart=True)),
        (Cadence(10, 50, 120, 30), 50, 40, Due(True, save=True, agree=True)),
        (Cadence(10, 50, 120, 30), 119, 130, Due(False, save=False, agree=False)),
        (Cadence(10, 50, 120, 30), 120, 130, Due(True, save=True, agree=True)),
        (Cadence(10, 50, None, 30), 90, 130, Due(True, save=True, agree=False, restart=True)),
        # checkpoint.every_steps off (saves by time, decided at the agreement): the last only
        (Cadence(10, None, 120), 100, 130, Due(log=True, save=False, agree=False)),
        (Cadence(10, None, 120), 120, 130, Due(log=True, save=True, agree=True)),
    ],
)
def test_due(cadence: Cadence, step: int, next_agreement: int, expected: Due) -> None:
    assert cadence.due(step, next_agreement) == expected


@pytest.mark.parametrize(
    ("cadence", "step", "next_agreement", "expected"),
    [
        (RUN, 0, 10, 10),  # the first agreement comes before the first log
        (RUN, 10, 20, 20),
        (RUN, 0, 30, 10),  # the first log before the agreement
        (RUN, 45, 60, 50),  # a save
        (RUN, 50, 40, 51),  # an agreement late: the very next step
        (RUN, 115, 130, 120),  # the last step, whatever the intervals say
        (Cadence(7, 33, 101), 98, 200, 99),  # a save at 3 x 33
        (Cadence(7, 33, 101), 99, 200, 101),
        (Cadence(10, 50, None), 120, 200, 130),  # the last step unknown: only the intervals
        (Cadence(10, 50, 1000, restart_every=25), 20, 40, 25),  # a planned restart
        (Cadence(10, None, 1000), 20, 25, 25),  # by time only: the agreement, not a save step
        (Cadence(100, None, 1000), 995, 2000, 1000),
    ],
)
def test_next_due_is_the_first_step_due_calls_for(
    cadence: Cadence, step: int, next_agreement: int, expected: int
) -> None:
    found = cadence.next_due(step, next_agreement)
    assert found == expected
    # what the loop relies on: nothing is due in between, something is due there
    assert not any(
        any(vars(cadence.due(s, next_agreement)).values()) for s in range(step + 1, found)
    )
    assert any(vars(cadence.due(found, next_agreement)).values())


def test_agreement_clock_moves_by_the_agreed_step_time() -> None:
    clock = AgreementClock(check_every=10, warning_seconds=300)
    clock.restart(40)  # resumed at step 40
    assert clock.next == 50
    assert clock.step_seconds(50) >= 0.0
    clock.agreed(50, slowest_step=0.01)  # fast steps: as configured
    assert clock.next == 60
    clock.agreed(60, slowest_step=15.0)  # an eighth of 300 s is 2 steps of 15 s
    assert clock.next == 62
    off_slurm = AgreementClock(check_every=10, warning_seconds=None)
    off_slurm.agreed(7, slowest_step=100.0)
    assert off_slurm.next == 17


@pytest.mark.parametrize(
    ("save", "step", "warning", "said"),
    [
        (None, 1.0, 300, False),  # nothing saved yet
        (10.0, 1.0, None, False),  # no warning (local)
        (10.0, 1.0, 300, False),  # 31 s of 300
        (99.0, 4.0, 300, True),  # 301 s of 300
    ],
)
def test_a_warning_shorter_than_three_saves_and_a_step_is_said(
    save: float | None, step: float, warning: int | None, said: bool
) -> None:
    from hpctf.compute.loop.cadence import save_outlasts_warning

    text = save_outlasts_warning(save, step, warning)
    assert bool(text) == said
    if said:
        assert text.startswith("a checkpoint takes 99.0 s and a step 4.00 s")
        assert "preemption.warning_seconds (300)" in text


def test_a_rank_votes_for_a_save_once_most_of_every_seconds_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """checkpoint.every_seconds 100: the vote from 80 s after the last save (or the start),
    the agreements a tenth of it apart at most, so a vote seen one agreement late still saves
    within 100 s."""
    from hpctf.compute.loop import cadence

    now = [1000.0]
    monkeypatch.setattr(cadence.time, "perf_counter", lambda: now[0])
    clock = AgreementClock(check_every=10, warning_seconds=None, save_seconds=100)
    clock.restart(0)
    now[0] += 79.0
    assert not clock.save_vote()
    now[0] += 1.0
    assert clock.save_vote()
    clock.saved()
    assert not clock.save_vote()
    clock.agreed(50, slowest_step=2.0)  # a tenth of 100 s: 5 steps of 2 s
    assert clock.next == 55
    assert not AgreementClock(10, None, None).save_vote()  # every_seconds off
