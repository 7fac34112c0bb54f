"""The Python API on a local site behaves like Python: Ctrl-C raises KeyboardInterrupt after
the workers' save; worker output stays in the rank logs unless ``echo=True``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS, checkpoint_steps

pytestmark = pytest.mark.tf

SCRIPT = """
import sys
import hpctf
settings = {{"train.steps": 100000, "train.log_every_steps": 1,
            "checkpoint.every_steps": 100000}}
run = hpctf.submit({experiment!r}, site="local", set=settings)
print("the next statement ran")
"""


def test_ctrl_c_during_submit_saves_then_raises_keyboard_interrupt(
    runs_root: Path, tmp_path: Path
) -> None:
    caller = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(experiment=str(DIGITS))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and caller.poll() is None, "no training"
        logs = list(runs_root.glob("*/logs/rank-0.log"))
        if logs and "step 20/" in logs[0].read_text():
            break
        time.sleep(0.1)
    caller.send_signal(signal.SIGINT)
    out, err = caller.communicate(timeout=90)
    (run_dir,) = runs_root.iterdir()
    ends = [e for e in RunDir(run_dir).events() if e["event"] == "ended"]
    assert [e["reason"] for e in ends] == ["cancelled"], ends
    saved = ends[0]["step"]
    assert isinstance(saved, int) and saved >= 20 and checkpoint_steps(run_dir)[-1] == saved
    # Python ends on an uncaught KeyboardInterrupt by SIGINT itself (the shell's 130).
    assert caller.returncode == -signal.SIGINT, (out, err)
    assert err.rstrip().splitlines()[-1] == (
        f"KeyboardInterrupt: cancelled at checkpoint step {saved}; resume with: "
        f"hpctf resubmit {run_dir}"
    ), err
    assert "Traceback (most recent call last)" in err
    assert "the next statement ran" not in out
    # No worker output on the caller's stdout: it is in the rank logs.
    assert "rank 0:" not in out and "rank 0: step 20/" in (run_dir / "logs/rank-0.log").read_text()
    assert f"run directory: {run_dir}" in out


def test_echo_true_prints_rank_0_and_metrics_have_one_row_per_step(
    runs_root: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import hpctf

    settings = {"train.steps": 20, "train.log_every_steps": 10, "train.eval_every_steps": 10}
    run = hpctf.submit(DIGITS, site="local", set=settings, echo=True)
    out = capfd.readouterr().out
    assert "rank 0: step 20/20 loss" in out, out
    rows = run.metrics(frame=False)
    assert [r["step"] for r in rows] == [10, 20]
    assert all("loss" in r and "accuracy" in r["eval"] for r in rows), json.dumps(rows)
