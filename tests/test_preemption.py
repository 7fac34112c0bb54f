"""The preemption watch in one process: its handlers' lifecycle, the agreement's bit packing
over a fake gather, and the agreement's cadence (``check_interval``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from hpctf.compute.loop.preemption import (
    WATCHED_SIGNALS,
    PreemptionWatch,
    SignalRecorder,
    check_interval,
    early_signal,
    handling,
)


def fake_gather(*others: int) -> tuple[Callable[[int], list[int]], list[int]]:
    """A gather over this rank and ranks whose packed values are ``others``; the second item
    collects what this rank sent."""
    sent: list[int] = []

    def gather(value: int) -> list[int]:
        sent.append(value)
        return [value, *others]

    return gather, sent


def packed(signum: int, step_seconds: float) -> int:
    """What another rank's watch sends (through a real watch, not a copy of the packing)."""
    gather, sent = fake_gather()
    watch = PreemptionWatch(gather)
    watch._signalled = signum  # what its handler would have set
    watch.agree(step_seconds)
    return sent[0]


def test_handling_restores_the_original_handlers_whatever_ends_the_block() -> None:
    before = {signum: signal.getsignal(signum) for signum in WATCHED_SIGNALS}
    got: list[int] = []
    with pytest.raises(RuntimeError), handling(lambda signum, frame: got.append(signum)):
        os.kill(os.getpid(), signal.SIGUSR2)
        raise RuntimeError("the block fails")
    assert got == [signal.SIGUSR2]
    assert {signum: signal.getsignal(signum) for signum in WATCHED_SIGNALS} == before


def test_watch_takes_a_real_signal_and_gives_the_handlers_back() -> None:
    recorder = SignalRecorder()
    with handling(recorder):
        gather, _ = fake_gather()
        with PreemptionWatch(gather) as watch:
            assert watch.signalled == 0
            os.kill(os.getpid(), signal.SIGTERM)
            assert watch.signalled == signal.SIGTERM
            assert watch.agree(0.5) == (signal.SIGTERM, 0.5, False)
        assert recorder.received == 0  # the watch had it, not the recorder
        assert signal.getsignal(signal.SIGTERM) is recorder
        os.kill(os.getpid(), signal.SIGUSR2)  # after the watch: the recorder's again
        assert early_signal() == signal.SIGUSR2


def test_a_signal_before_the_watch_is_saved_at_the_first_agreement() -> None:
    recorder = SignalRecorder()
    with handling(recorder):
        os.kill(os.getpid(), signal.SIGUSR2)
        assert early_signal() == signal.SIGUSR2
        gather, _ = fake_gather()
        with PreemptionWatch(gather) as watch:
            assert watch.agree(0.1)[0] == signal.SIGUSR2
    assert early_signal() == 0  # no recorder installed any more


def test_agreement_any_rank_signal_wins_and_term_beats_usr2() -> None:
    gather, sent = fake_gather(packed(0, 0.2), packed(signal.SIGUSR2, 0.3))
    assert PreemptionWatch(gather).agree(0.1) == (signal.SIGUSR2, 0.3, False)
    assert sent == [packed(0, 0.1)]
    gather, _ = fake_gather(packed(signal.SIGTERM, 0.1), packed(signal.SIGUSR2, 0.1))
    assert PreemptionWatch(gather).agree(0.1)[0] == signal.SIGTERM
    gather, _ = fake_gather(packed(0, 2.0))
    assert PreemptionWatch(gather).agree(0.000_001) == (0, 2.0, False)


def test_agreement_any_rank_vote_saves_and_keeps_the_other_answers_apart() -> None:
    """checkpoint.every_seconds: one rank's vote is a save on every rank; its bit spills into
    neither the signal nor the step time."""
    gather, sent = fake_gather(packed(signal.SIGUSR2, 0.3))
    watch = PreemptionWatch(gather)
    assert watch.agree(0.1, save_vote=True) == (signal.SIGUSR2, 0.3, True)
    assert sent[0] >> 56 == 1 and sent[0] & ((1 << 56) - 1) == packed(0, 0.1)
    gather, _ = fake_gather(sent[0], packed(0, 0.2))
    assert PreemptionWatch(gather).agree(0.1) == (0, 0.2, True)
    gather, _ = fake_gather(packed(signal.SIGTERM, 0.2))
    assert PreemptionWatch(gather).agree(0.1) == (signal.SIGTERM, 0.2, False)


def test_agreement_step_time_is_microseconds_clamped_to_its_bits() -> None:
    # Negative (a clock step) reads 0; beyond the 40 bits (12.7 days) reads as the most, and
    # never spills into the signal's bits.
    assert packed(0, -1.0) == 0
    assert packed(0, 1.234_567_8) == 1_234_568
    huge = packed(0, 10**9)
    assert huge == (1 << 40) - 1
    gather, _ = fake_gather(huge)
    signum, slowest, _ = PreemptionWatch(gather).agree(0.0)
    assert signum == 0 and slowest == pytest.approx(((1 << 40) - 1) / 1e6)
    assert packed(signal.SIGTERM, 10**9) >> 40 == signal.SIGTERM


@pytest.mark.parametrize(
    ("configured", "slowest", "warning", "expected"),
    [
        (10, 0.01, None, 10),  # no warning (local): as configured
        (10, 0.01, 0, 10),
        (10, 0.0, 300, 10),  # no step time measured yet
        (10, 0.01, 300, 10),  # fast steps: as configured, never more
        (100, 1.0, 300, 37),  # an eighth of 300 s at 1 s per step: two of them, a quarter
        (100, 15.0, 300, 2),
        (100, 200.0, 300, 1),  # a step longer than the quarter: every step, never 0
    ],
)
def test_check_interval(
    configured: int, slowest: float, warning: int | None, expected: int
) -> None:
    assert check_interval(configured, slowest, warning) == expected


@pytest.mark.parametrize(
    ("slowest", "warning", "save_seconds", "expected"),
    [
        (0.003, None, 300, 10),  # fast steps: as configured
        (1.0, None, 300, 10),  # a tenth of 300 s is 30 steps: the configured 10 comes first
        (0.2, None, 5, 2),  # checkpoint.every_seconds 5: a tenth is 2 steps of 0.2 s
        (1.0, 80, 50, 5),  # the save's bound is the tighter (warning's: 10)
        (1.0, 80, 300, 10),  # the warning's is
        (9.0, None, 5, 1),  # a step longer than the tenth: every step, never 0
        (0.0, None, 5, 10),  # no step time measured yet
    ],
)
def test_check_interval_bounds_the_time_between_agreements_by_a_tenth_of_the_save_interval(
    slowest: float, warning: int | None, save_seconds: int, expected: int
) -> None:
    assert check_interval(10, slowest, warning, save_seconds) == expected
