"""Where a worker's time goes from its process's start to its first trained step.

The worker marks the end of each phase as it reaches it (:func:`mark`: one clock reading); at
the first step the session calls :func:`first_step`, which logs one line and stops the clock::

    first step 1 after 9.84 s (3.91 s CPU): python+hpctf 0.62 s, config 0.01 s, ...

Each figure is the time since the mark before it (the first: since the process started, which
the kernel keeps in /proc/self/stat, so the interpreter's own start is counted too). A phase
that did not run (no evaluation, a custom loop without hpctf's model build) has no mark and
its time goes to the next one. The CPU seconds (user and system, every thread of the process)
move much less with the machine's load than the wall time does.
``benchmarks/bench_first_step.py`` reads the line back with :func:`parse`; the plain baseline
there prints the same form.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import TypedDict

log = logging.getLogger("hpctf.worker")


class FirstStep(TypedDict):
    """The line, read back: the step, the seconds from the process's start, the process's
    CPU seconds until then, each phase's seconds."""

    step: int
    total_s: float
    cpu_s: float
    phases: dict[str, float]


_marks: list[tuple[str, float]] = []
_stopped = False
_started: float | None = None  # a warm standby's task: the start of the task it became

_LINE_RE = re.compile(r"first step (\d+) after ([0-9.]+) s \(([0-9.]+) s CPU\): (.*)$", re.M)
_PHASE_RE = re.compile(r"(.+) ([0-9.]+) s")


def process_age(stat: str, boot_seconds: float, ticks_per_second: float) -> float | None:
    """Seconds since the process of ``stat`` (a /proc/PID/stat line) started, given the
    seconds since boot now (CLOCK_BOOTTIME, the clock ``starttime`` counts in); None when the
    line cannot be read or the answer is impossible (a clock from another namespace)."""
    # The command name (field 2) may hold spaces and parentheses: count from the last ")".
    fields = stat.rpartition(")")[2].split()
    try:
        started = int(fields[19]) / ticks_per_second  # field 22, starttime
    except (IndexError, ValueError):
        return None
    age = boot_seconds - started
    return age if 0 <= age < 86_400 else None


def restart(started: float, phase: str) -> None:
    """Count from ``started`` (``time.time()``'s clock), not this process's start: a warm
    standby (:mod:`hpctf.compute.start.standby`) that became a task counts from the task's
    start, and the time until now is ``phase``."""
    global _started
    _marks.clear()
    _started = started
    mark(phase)


def process_started() -> float:
    """When this process started (``time.time()``'s clock), for :func:`restart`."""
    return _process_started()


def _process_started() -> float:
    """This process's start on ``time.time()``'s clock (a standby's: its task's,
    :func:`restart`); without /proc, the import of this module (the interpreter's start and
    hpctf's import then count as nothing)."""
    if _started is not None:
        return _started
    now = time.time()
    try:
        with open("/proc/self/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        age = process_age(stat, time.clock_gettime(time.CLOCK_BOOTTIME), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):  # no /proc, no CLOCK_BOOTTIME (not Linux)
        age = None
    return now - (age or 0.0)


def mark(phase: str) -> None:
    """The phase ``phase`` ends now (its time: since the mark before it)."""
    if not _stopped:
        _marks.append((phase, time.time()))


def first_step(step: int) -> None:
    """Log the line for the first step trained in this process, ``step``; later calls return
    at once."""
    global _stopped
    if _stopped:
        return
    mark("first step")
    _stopped = True
    times = os.times()
    log.info("%s", summary(step, _process_started(), _marks, times.user + times.system))


def summary(step: int, started: float, marks: list[tuple[str, float]], cpu: float) -> str:
    """The line: seconds from ``started`` to the last mark and ``cpu`` seconds, then each
    phase's share."""
    parts, before = [], started
    for phase, when in marks:
        parts.append(f"{phase} {max(when - before, 0.0):.2f} s")
        before = when
    total = (marks[-1][1] if marks else started) - started
    return f"first step {step} after {total:.2f} s ({cpu:.2f} s CPU): {', '.join(parts)}"


def parse(text: str) -> FirstStep | None:
    """The first such line in ``text`` (a rank log), or None when there is none."""
    found = _LINE_RE.search(text)
    if found is None:
        return None
    phases = {}
    for part in found.group(4).split(", "):
        if shown := _PHASE_RE.fullmatch(part.strip()):
            phases[shown.group(1)] = float(shown.group(2))
    return FirstStep(
        step=int(found.group(1)),
        total_s=float(found.group(2)),
        cpu_s=float(found.group(3)),
        phases=phases,
    )
