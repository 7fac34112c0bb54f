"""A crash that made progress, on nodes Slurm calls well, in a job it is not ending and with
time left: job-end starts the workers again in the same allocation (exit 98, and the batch
script runs srun again), with no Slurm requeue, release or scheduling pass to wait for. Fakes
at the subprocess boundary; tests/test_slurm_e2e.py's killed-rank test does it on the real
test cluster, tests/test_node_failures.py the requeue when a node failed."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.errors import RELAUNCH_EXIT
from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS
from tests.fake_slurm import fake_checkpoint, fake_command

ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]"}


@pytest.fixture
def run_dir(runs_root: Path, fake_sbatch: Path) -> Path:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    return path


@pytest.mark.parametrize(
    ("state", "minutes_left", "why_not"),
    [
        ("RUNNING", 60, None),
        ("RUNNING", 2, "s left of its time limit"),  # a requeue brings a new time limit
        ("COMPLETING", 60, "the job is COMPLETING"),  # Slurm is ending it (a preemption)
    ],
    ids=["relaunched", "too-little-time", "slurm-ends-it"],
)
def test_a_crash_that_made_progress_starts_again_in_the_same_allocation(
    run_dir: Path, fake_sbatch: Path, state: str, minutes_left: int, why_not: str | None
) -> None:
    bin_dir = fake_sbatch.parent / "fakebin"
    assert CliRunner().invoke(cli, ["job-start", str(run_dir)], env=ENV).exit_code == 0
    fake_checkpoint(run_dir / "checkpoints", 100)  # the start advanced from step 0
    fake_command(bin_dir, "sinfo", "echo 'node1|allocated'; echo 'node2|allocated'")
    end = (datetime.now() + timedelta(minutes=minutes_left)).isoformat(timespec="seconds")
    scontrol = fake_command(
        bin_dir,
        "scontrol",
        f'[ "$1" = show ] && echo "JobId=4242 JobState={state} EndTime={end} Partition=debug"; :',
    )
    result = CliRunner().invoke(cli, ["job-end", str(run_dir), "--exit-code", "137"], env=ENV)
    events = RunDir(run_dir).events()
    calls = scontrol.read_text().splitlines()
    if why_not is None:
        assert result.exit_code == RELAUNCH_EXIT, result.output
        assert calls == ["show job -o -- 4242"]  # no requeue, no release
        assert "job 4242 starts its workers again in this allocation: failed: requeue 1 of 3" in (
            result.output
        )
        assert [e["event"] for e in events[-3:]] == ["ended", "requeued", "started"]
        assert events[-2]["in_place"] is True and events[-1]["step"] == 100
        status = CliRunner().invoke(cli, ["status", str(run_dir)], env={"SLURM_JOB_ID": ""})
        assert "after failures 1/3" in status.output, status.output
    else:
        assert result.exit_code == 0, result.output
        assert "job 4242 is requeued, not started again here: " in result.output
        assert why_not in result.output
        assert calls == [
            "show job -o -- 4242",
            "requeue -- 4242",
            "update JobId=4242 StartTime=now+5",
        ]
        assert [e["event"] for e in events[-3:]] == ["ended", "requeued", "released"]
        assert "in_place" not in events[-2]
