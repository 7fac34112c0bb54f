"""hpctf.compute.process.startup_clock: the worker's one line about where its start went."""

from __future__ import annotations

import logging
import os
import time

import pytest

from hpctf.compute.process import startup_clock

STAT = "4242 (a) (b) S 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1234 0 0\n"


def test_process_age_counts_from_the_kernels_start_time() -> None:
    assert startup_clock.process_age(STAT, 20.0, 100) == pytest.approx(20.0 - 12.34)
    # A clock of another namespace (or garbage) gives no answer rather than a wrong one.
    assert startup_clock.process_age(STAT, 10.0, 100) is None
    assert startup_clock.process_age(STAT, 12.34 + 90_000, 100) is None
    assert startup_clock.process_age("4242 (x) S 1", 20.0, 100) is None


def test_this_process_started_before_now_and_after_boot() -> None:
    with open("/proc/self/stat", encoding="ascii") as handle:
        age = startup_clock.process_age(
            handle.read(), time.clock_gettime(time.CLOCK_BOOTTIME), os.sysconf("SC_CLK_TCK")
        )
    assert age is not None and 0 < age < time.monotonic() + 1


def test_summary_reads_back_phase_by_phase() -> None:
    marks = [("python+hpctf", 100.5), ("tensorflow import", 103.75), ("first step", 104.0)]
    line = startup_clock.summary(7, 100.0, marks, 2.5)
    assert line == (
        "first step 7 after 4.00 s (2.50 s CPU): python+hpctf 0.50 s, tensorflow import 3.25 s, "
        "first step 0.25 s"
    )
    found = startup_clock.parse(f"12:00:01 rank 0: warmup\n12:00:02 rank 0: {line}\nstep 8\n")
    assert found == {
        "step": 7,
        "total_s": 4.0,
        "cpu_s": 2.5,
        "phases": {"python+hpctf": 0.5, "tensorflow import": 3.25, "first step": 0.25},
    }
    assert startup_clock.parse("12:00:01 rank 0: step 50/300 loss 0.1\n") is None


def test_first_step_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(startup_clock, "_marks", [])
    monkeypatch.setattr(startup_clock, "_stopped", False)
    startup_clock.mark("join")
    with caplog.at_level(logging.INFO, logger="hpctf.worker"):
        startup_clock.first_step(11)
        startup_clock.mark("late")  # after the line: not kept
        startup_clock.first_step(12)
    (said,) = [r.getMessage() for r in caplog.records]
    found = startup_clock.parse(said)
    assert found is not None and found["step"] == 11
    assert list(found["phases"]) == ["join", "first step"]
    # Counted from this process's start: the interpreter and pytest's start are in it.
    assert found["total_s"] >= found["phases"]["join"] > 0
    assert 0 < found["cpu_s"] <= sum(os.times()[:2]) + 0.005  # rounded to 0.01 s
