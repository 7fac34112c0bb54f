"""A paced run: the settings that train tests/entries.py's ``slow_steps`` in place of an
experiment's model, each step asleep. One definition for the tests (:func:`tests.conftest.paced`)
and the benchmarks (``Sizes.paced_step_s``); it imports nothing heavy, so the benchmark harness
reads it without pytest, Keras or TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# train.python_path for tests/entries.py: it and the examples it builds on.
ENTRIES_PATH = [str(REPO / p) for p in ("tests", "examples/digits", "examples/custom_loop")]


def paced(step_seconds: float = 0.05) -> list[str]:
    """``KEY=VALUE`` settings that train ``slow_steps``, every step asleep ``step_seconds``. For
    a run whose training only waits for something to happen to it (a signal, a kill, a save, a
    standby, Slurm): at full speed its ranks take both of the test machine's cores from what
    runs beside it for as long as it waits, and a step of the digits model costs about as much
    CPU as a paced one (about 3.5 ms a rank here: 10 ms asleep still kept a core a third busy
    for two ranks)."""
    return [
        "train.entry=entries:slow_steps",
        f"train.python_path={json.dumps(ENTRIES_PATH)}",
        f"train.args={{first_seconds: {step_seconds}, then_seconds: {step_seconds}, "
        "switch_after: 0}",
    ]
