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
    ],
)
def test_due(cadence: Cadence, step: int, next_agreement: int, expected: Due) -> None:
    assert cadence.due(step, next_agreement) == expected


def test_agreement_clock_moves_by_the_agreed_step_time() -> None:
    clock = AgreementClock(check_every=10, warning_seconds=300)
    clock.restart(40)  # resumed at step 40
    assert clock.next == 50
    assert clock.step_seconds(50) >= 0.0
    clock.agreed(50, slowest_step=0.01)  # fast steps: as configured
    assert clock.next == 60
    clock.agreed(60, slowest_step=15.0)  # a quarter of 300 s is 5 steps of 15 s
    assert clock.next == 65
    off_slurm = AgreementClock(check_every=10, warning_seconds=None)
    off_slurm.agreed(7, slowest_step=100.0)
    assert off_slurm.next == 17
