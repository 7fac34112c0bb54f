"""``hpctf.keras.callbacks()`` for a ``train.script`` fit script: what can be checked without
TensorFlow (the real fit runs on the Slurm test cluster, tests/test_slurm_keras_fit.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hpctf.keras
from hpctf.login.reading.run_report import script_text


def test_hpctf_keras_imports_no_tensorflow() -> None:
    code = "import sys, hpctf.keras; print('tensorflow' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_outside_hpctf_the_script_runs_without_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCTF_RUN_DIR", raising=False)
    assert hpctf.keras.callbacks() == []


@pytest.mark.parametrize(
    ("step", "per_epoch", "initial", "position"),
    [(0, 20, 0, (0, 0)), (40, 20, 0, (2, 0)), (45, 20, 0, (2, 5)), (45, 20, 1, (3, 5))],
)
def test_fit_resumes_at_the_epoch_and_the_step_inside_it(
    step: int, per_epoch: int, initial: int, position: tuple[int, int]
) -> None:
    from hpctf.compute.script.fit import resume_position  # imports TensorFlow

    assert resume_position(step, per_epoch, initial) == position


def test_status_says_whether_hpctf_can_resume_a_script() -> None:
    plain = script_text("/r/code/0-x/train.py", {"total_steps": None}, 0)
    assert "hpctf cannot resume it mid-run" in plain
    fit = script_text("/r/code/0-x/train.py", {"total_steps": 60}, 0)
    assert "hpctf.keras.callbacks(): resumes from its newest checkpoint" in fit
    assert "resumes" in script_text("/r/code/0-x/train.py", {"total_steps": None}, 40)
