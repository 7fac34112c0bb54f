"""A node that fails under a job: found from Slurm's node states by the batch shell's SIGTERM
trap (``hpctf job-signal``), recorded in the journal, and left out of every later start (the
requeued job's ExcNodeList, ``hpctf resubmit``'s --exclude). Fakes at the subprocess boundary;
tests/test_slurm_faults.py does the same on the real test cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from tests.conftest import DIGITS
from tests.fake_slurm import fake_checkpoint, fake_command

# sinfo --Node lists a node once per partition; "*" means not responding.
SINFO = """node1|allocated
node1|allocated
node2|down*
node2|down*
node3|drained
node4|draining
node5|mixed
node6|idle*
node7|fail
"""


def test_unusable_nodes_are_the_down_drained_failing_and_silent_ones(
    fake_sbatch: Path,
) -> None:
    calls = fake_command(fake_sbatch.parent / "fakebin", "sinfo", f"cat <<'EOF'\n{SINFO}EOF")
    assert slurm.unusable_nodes("node[1-7]") == ["node2", "node3", "node4", "node6", "node7"]
    assert calls.read_text() == "--noheader --Node --nodes=node[1-7] --format=%N|%T\n"


@pytest.fixture
def run_dir(runs_root: Path, fake_sbatch: Path) -> Path:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    return path


def job_signal(run_dir: Path) -> tuple[int, str]:
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-7]"}
    result = CliRunner().invoke(cli, ["job-signal", str(run_dir), "TERM"], env=env)
    return result.exit_code, result.output


def test_the_trap_records_a_failed_node_and_keeps_the_requeued_job_off_it(
    run_dir: Path, fake_sbatch: Path
) -> None:
    bin_dir = fake_sbatch.parent / "fakebin"
    fake_command(bin_dir, "sinfo", "echo 'node1|allocated'; echo 'node2|down'")
    scontrol = fake_command(
        bin_dir, "scontrol", "[ \"$1\" = show ] && echo 'KillWait                = 5 sec'; exit 0"
    )
    code, output = job_signal(run_dir)
    assert code == 0, output
    assert "job 4242 will not start on failed node(s) node2" in output
    # Then Slurm's hold on the requeued job is cut to KillWait (its processes are gone by
    # then) + 6 s: Slurm keeps a start time still in the future when the requeue completes.
    assert scontrol.read_text().splitlines() == [
        "update JobId=4242 ExcNodeList=node2",
        "show config",
        "update JobId=4242 StartTime=now+11",
    ]
    events = RunDir(run_dir).events()
    assert [e["event"] for e in events][-4:] == [
        journal.SIGNALLED,
        journal.NODES_DOWN,
        journal.EXCLUDED,
        journal.RELEASED,
    ]
    assert events[-3]["nodes"] == ["node2"] and events[-2]["nodes"] == ["node2"]

    # A second failure under a later start: the job is kept off both.
    fake_command(bin_dir, "sinfo", "echo 'node1|down*'")
    assert job_signal(run_dir)[0] == 0
    assert scontrol.read_text().splitlines()[-3] == "update JobId=4242 ExcNodeList=node2,node1"


def test_the_trap_says_so_when_the_job_cannot_be_kept_off_a_node(
    run_dir: Path, fake_sbatch: Path
) -> None:
    """Cancelled or ended for good, the job is no longer pending: Slurm refuses the update.
    The node is still recorded (resubmit leaves it out); the trap itself never fails."""
    bin_dir = fake_sbatch.parent / "fakebin"
    fake_command(bin_dir, "sinfo", "echo 'node3|drained'")
    fake_command(
        bin_dir, "scontrol", "echo 'Job is no longer pending execution for job 4242' >&2; exit 1"
    )
    code, output = job_signal(run_dir)
    assert code == 0
    assert "hpctf: job 4242 keeps its nodes: scontrol failed (exit 1): Job is no longer" in output
    kinds = [e["event"] for e in RunDir(run_dir).events()]
    assert kinds[-2:] == [journal.SIGNALLED, journal.NODES_DOWN]

    # Healthy nodes: nothing but the signal is recorded; Slurm unreachable: a line, no failure.
    fake_command(bin_dir, "sinfo", "echo 'node1|allocated'")
    assert job_signal(run_dir)[0] == 0
    fake_command(bin_dir, "sinfo", "echo 'slurm_load_partitions: Unable to contact' >&2; exit 1")
    code, output = job_signal(run_dir)
    assert code == 0 and "cannot tell whether a node of job 4242 failed" in output
    kinds = [e["event"] for e in RunDir(run_dir).events()]
    assert kinds[-3:] == [journal.NODES_DOWN, journal.SIGNALLED, journal.SIGNALLED]


def test_resubmit_leaves_out_the_nodes_that_failed_unless_told_otherwise(
    run_dir: Path, fake_sbatch: Path
) -> None:
    fake_command(fake_sbatch.parent / "fakebin", "scontrol", "echo 'JobId=4242 JobState=FAILED'")
    run = RunDir(run_dir)
    journal.record_nodes_down(run, "4242", ["node2"], "TERM")
    journal.record_nodes_down(run, "4242", ["node3", "node2"], "TERM")
    result = CliRunner().invoke(cli, ["resubmit", str(run_dir), "--exclude", "node7"])
    assert result.exit_code == 0, result.output
    assert "note: leaving out node2,node3, which failed under earlier jobs" in result.output
    last = fake_sbatch.read_text().splitlines()[-1]
    assert " --exclude=node7,node2,node3 " in last, last
    submitted = RunDir(run_dir).events()[-1]
    assert submitted["event"] == "submitted" and submitted["exclude"] == "node7,node2,node3"

    again = CliRunner().invoke(cli, ["resubmit", str(run_dir), "--retry-failed-nodes"])
    assert again.exit_code == 0, again.output
    assert "leaving out" not in again.output
    assert "--exclude" not in fake_sbatch.read_text().splitlines()[-1]


def test_job_end_finds_the_job_requeued_by_slurm_already_and_does_what_the_trap_would(
    run_dir: Path, fake_sbatch: Path
) -> None:
    """srun ended (a rank failed with its node), then Slurm requeued the job itself while the
    batch shell ignored SIGTERM (job-end runs with it ignored): job-end's own requeue is
    refused as pending; it records the failed node, keeps the job off it and releases it."""
    bin_dir = fake_sbatch.parent / "fakebin"
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]"}
    assert CliRunner().invoke(cli, ["job-start", str(run_dir)], env=env).exit_code == 0
    fake_checkpoint(run_dir / "checkpoints", 100)
    fake_command(bin_dir, "sinfo", "echo 'node1|allocated'; echo 'node2|down*'")
    scontrol = fake_command(
        bin_dir,
        "scontrol",
        '[ "$1" = requeue ] && { echo "Job is pending execution for job 4242" >&2; exit 1; }; :',
    )
    result = CliRunner().invoke(cli, ["job-end", str(run_dir), "--exit-code", "1"], env=env)
    assert result.exit_code == 0, result.output
    assert "hpctf: job 4242 was requeued by Slurm already" in result.output
    assert scontrol.read_text().splitlines() == [
        "requeue -- 4242",
        "update JobId=4242 ExcNodeList=node2",
        "update JobId=4242 StartTime=now+5",
    ]
    kinds = [e["event"] for e in RunDir(run_dir).events()]
    assert kinds[-4:] == [journal.ENDED, journal.NODES_DOWN, journal.EXCLUDED, journal.RELEASED]
