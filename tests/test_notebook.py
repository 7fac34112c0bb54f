"""examples/notebook/notebook.py, run as a script against the real 2-node test cluster
(issue #20): one digits run submitted, waited for and read as rows, a 4-point sweep and its
best point, all through the Python API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

NOTEBOOK = REPO / "examples" / "notebook" / "notebook.py"


def test_the_notebook_example_submits_waits_reads_and_sweeps_on_the_cluster(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
           "HPCTF_SITE": "local-slurm", "NOTEBOOK_STEPS": "40"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "state: done" in out
    assert re.search(r"^rows: \d+ first loss: \(10, [\d.]+\) last loss: \(40, ", out, re.M), out
    assert "states: {0: 'done', 1: 'done', 2: 'done', 3: 'done'}" in out, out
    # The best point is the one whose DONE holds the highest accuracy.
    best = re.search(r"^best point: (\d) \{.*\} -> (\S+)$", out, re.M)
    assert best, out
    sweep = Path(best.group(2)).parent
    points = json.loads((sweep / "sweep.json").read_text())["points"]
    accuracy = {
        p["index"]: json.loads((Path(p["run_dir"]) / "DONE").read_text())["eval"]["accuracy"]
        for p in points
    }
    assert int(best.group(1)) == max(accuracy, key=lambda i: accuracy[i]), accuracy
    assert {p["values"]["train.args.learning_rate"] for p in points} == {
        "0.001", "0.003", "0.01", "0.03"
    }  # fmt: skip
