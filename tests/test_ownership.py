"""One owner per run directory (hpctf.core.run.ownership): atomic claims by generation, stale
owners replaced, a resubmit's claim handed to its job; job-start and resubmit use them. Slurm
faked at the subprocess boundary; tests/test_slurm_e2e.py runs the real thing."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.errors import NOT_STARTING_EXIT
from hpctf.core.run import journal, ownership
from hpctf.core.run.history.runstate import run_state
from hpctf.core.run.ownership import Claim, claim_of
from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS
from tests.fake_slurm import fake_command


def job(job_id: str) -> Claim:
    return claim_of("job", job_id)


def test_the_first_claim_wins_a_live_owner_stays_and_a_stale_one_is_replaced(
    tmp_path: Path,
) -> None:
    assert ownership.take(tmp_path, job("7"), alive=lambda c: True) is None
    assert ownership.current(tmp_path)[0] == 1
    assert ownership.take(tmp_path, job("7"), alive=lambda c: True) is None  # a restart of 7
    owner = ownership.take(tmp_path, job("8"), alive=lambda c: True)
    assert owner is not None and owner.describe() == "job 7"
    assert ownership.take(tmp_path, job("8"), alive=lambda c: c.job_id != "7") is None
    generation, now = ownership.current(tmp_path)
    assert (generation, now and now.job_id) == (2, "8")


def test_of_many_claims_at_one_instant_exactly_one_wins(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    results: dict[int, Claim | None] = {}

    def contend(i: int) -> None:
        barrier.wait()
        results[i] = ownership.take(tmp_path, job(str(100 + i)), alive=lambda c: True)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, owner in results.items() if owner is None]
    assert len(winners) == 1
    assert {owner.job_id for owner in results.values() if owner} == {str(100 + winners[0])}
    assert [p.name for p in (tmp_path / "owner").iterdir()] == ["000001.json"]


def test_a_resubmits_claim_is_waited_for_and_handed_to_its_job(tmp_path: Path) -> None:
    submit = claim_of("submit")
    assert ownership.take(tmp_path, submit, alive=ownership.process_alive) is None
    # Another resubmit is refused at once; the job waits while the claim is a resubmit's.
    other = Claim("submit", "elsewhere", 1, 0, submit.time)
    refused = ownership.take(tmp_path, other, alive=ownership.process_alive)
    assert refused is not None and refused.describe().startswith("hpctf resubmit (pid ")
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            ownership.hand_over(tmp_path, submit, "41")

    assert ownership.take(tmp_path, job("41"), ownership.process_alive, sleep=sleep) is None
    assert len(waits) == 3 and ownership.current(tmp_path)[0] == 2
    # A resubmit that submitted nothing leaves no owner behind.
    assert ownership.take(tmp_path, submit, alive=lambda c: False) is None
    ownership.give_up(tmp_path, submit)
    assert ownership.current(tmp_path)[0] == 2


@pytest.mark.parametrize(
    "text",
    ["", "[]", "garbage{", '{"kind": "job", "job_id": "--user=root", "host": "h", "pid": 1, '
     '"uid": 0, "time": 0}'],
)  # fmt: skip
def test_a_damaged_claim_names_no_owner(tmp_path: Path, text: str) -> None:
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "000001.json").write_text(text)
    assert ownership.current(tmp_path)[1] is None
    assert ownership.take(tmp_path, job("9"), alive=lambda c: True) is None
    assert ownership.current(tmp_path)[0] == 2


@pytest.fixture
def run_dir(runs_root: Path, fake_sbatch: Path) -> Path:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    return path


def job_start(run_dir: Path, job_id: str) -> tuple[int, str]:
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "node1", "SLURM_RESTART_COUNT": "0"}
    result = CliRunner().invoke(cli, ["job-start", str(run_dir)], env=env)
    return result.exit_code, result.output


def test_a_second_job_on_a_run_ends_at_once_naming_the_owner(
    run_dir: Path, fake_sbatch: Path
) -> None:
    bin_dir = fake_sbatch.parent / "fakebin"
    scontrol = fake_command(bin_dir, "scontrol", "echo 'JobId=4242 JobState=RUNNING'")
    assert job_start(run_dir, "4242")[0] == 0
    assert job_start(run_dir, "4242")[0] == 0  # its start after a requeue: still the owner
    code, output = job_start(run_dir, "4243")
    assert code == NOT_STARTING_EXIT
    assert output.splitlines()[0].startswith("===== hpctf: job 4243 start (restart 0) on node1 ")
    assert output.splitlines()[1] == f"hpctf: job 4243 ends at once: job 4242 owns {run_dir}"
    assert scontrol.read_text().splitlines() == ["show job -o -- 4242"]
    events = RunDir(run_dir).events()
    assert [e["job_id"] for e in events if e["event"] == journal.STARTED] == ["4242", "4242"]
    assert events[-1]["event"] == journal.NOT_STARTED and events[-1]["owner"] == "job 4242"
    assert run_state(events).state == "running"  # not a failure of the run, nor queued
    shown = CliRunner().invoke(cli, ["status", str(run_dir)])
    assert shown.exit_code == 0 and "\nrun: running;" in f"\n{shown.output}", shown.output

    # Once Slurm says the owner ended, the next job takes the run over.
    fake_command(bin_dir, "scontrol", "echo 'JobId=4242 JobState=PREEMPTED'")
    assert job_start(run_dir, "4244")[0] == 0
    assert json.loads((run_dir / "owner" / "000002.json").read_text())["job_id"] == "4244"


def test_a_job_of_a_complete_run_ends_at_once_without_a_start(run_dir: Path) -> None:
    (run_dir / "DONE").write_text("{}")
    RunDir(run_dir).record("started", job_id="4242", step=0)
    RunDir(run_dir).record("ended", job_id="4242", reason="done", exit_code=0, step=300)
    fake_bin = run_dir.parent.parent / "fakebin"
    fake_command(fake_bin, "scontrol", "echo 'JobId=4242 JobState=COMPLETED'")
    code, output = job_start(run_dir, "4250")
    assert code == NOT_STARTING_EXIT
    assert "hpctf: job 4250 ends at once: the run is complete" in output
    assert not [e for e in RunDir(run_dir).events() if e.get("job_id") == "4250"]


def test_resubmit_claims_the_run_and_hands_it_to_its_job(run_dir: Path, fake_sbatch: Path) -> None:
    fake_command(fake_sbatch.parent / "fakebin", "scontrol", "echo 'JobId=4242 JobState=FAILED'")
    result = CliRunner().invoke(cli, ["resubmit", str(run_dir)])
    assert result.exit_code == 0, result.output
    generation, owner = ownership.current(run_dir)
    assert generation == 2 and owner is not None and owner.describe() == "job 4242"
    # While another resubmit is on its way, a second one is refused in one line.
    ownership.take(run_dir, Claim("submit", "login2", 77, 0, owner.time + 1e9), lambda c: False)
    again = CliRunner().invoke(cli, ["resubmit", str(run_dir)])
    assert again.exit_code == 2
    assert f"Error: hpctf resubmit (pid 77 on login2) owns {run_dir}; wait for it" in again.output


def test_a_job_a_live_resubmit_is_submitting_is_recorded_once_by_it(
    run_dir: Path, fake_sbatch: Path
) -> None:
    """Two resubmits at one instant: the second reads the journal while the first's sbatch has
    its job in Slurm's queue but not yet in the journal. The second must not take that job for
    one a killed submit left (and write it in the journal a second time), before or after the
    first hands its claim over to it."""
    from hpctf.core.run.history import read_history
    from hpctf.core.run.run_identity import slurm_comment
    from hpctf.login.submitting.launchers import job_launcher

    run = RunDir(run_dir)
    run.record("started", job_id="4242", step=0)
    run.record("ended", job_id="4242", reason="failed", exit_code=1, step=0)  # resubmittable
    bin_dir = fake_sbatch.parent / "fakebin"
    fake_command(bin_dir, "squeue", f"echo '4300|{slurm_comment(run_dir)}'")
    launcher = job_launcher(run.load_config().site)
    before = read_history(run)  # the second resubmit's read, before the first's record

    first = claim_of("submit")  # the first resubmit, alive (this process), at its sbatch
    assert ownership.take(run_dir, first, ownership.alive) is None
    assert launcher.adopt_unrecorded(run, before) is before

    journal.record_submitted(run, "4300")  # the first records its job, then hands over
    ownership.hand_over(run_dir, first, "4300")
    adopted = launcher.adopt_unrecorded(run, before)
    assert [job.job_id for job in adopted.jobs] == ["4242", "4300"]
    submitted = [e["job_id"] for e in run.events() if e["event"] == journal.SUBMITTED]
    assert submitted == ["4242", "4300"]


def test_a_start_that_died_with_its_node_is_closed_at_the_next_start_from_sacct(
    run_dir: Path, fake_sbatch: Path
) -> None:
    """The batch shell died with its node: no end recorded. Slurm requeued the same job; its
    next job-start records the end from sacct's record of the earlier run (7b of issue #19)."""
    bin_dir = fake_sbatch.parent / "fakebin"
    fake_command(bin_dir, "scontrol", "echo 'JobId=4242 JobState=RUNNING'")
    assert job_start(run_dir, "4242")[0] == 0
    runs = "4242|NODE_FAIL|None|1:0|a|b|00:01:00|node1\n4242|RUNNING|None|0:0|c|d|00:00:01|node2"
    sacct = fake_command(bin_dir, "sacct", f"echo '{runs}'")
    code, output = job_start(run_dir, "4242")
    assert code == 0, output
    assert "hpctf: job 4242's start ended node_fail (Slurm: NODE_FAIL)" in output
    assert "--duplicates" in sacct.read_text() and "--jobs=4242" in sacct.read_text()
    events = RunDir(run_dir).events()
    assert [e["event"] for e in events][-3:] == ["started", "ended", "started"]
    assert events[-2]["source"] == "sacct" and events[-2]["exit_code"] == 1
    state = run_state(events)
    assert [s.reason for s in state.starts] == ["node_fail", None] and state.failure_requeues == 1

    # A new job after one that failed hard, with the ranks' save recorded: preempted.
    journal.record_saved_on_warning(RunDir(run_dir), "4242", 100, "TERM")
    fake_command(bin_dir, "sacct", "echo '4242|PREEMPTED|None|0:15|a|b|00:01:00|node2'")
    fake_command(bin_dir, "scontrol", "echo 'JobId=4242 JobState=PREEMPTED'")
    assert job_start(run_dir, "4300")[0] == 0
    assert [s.reason for s in run_state(RunDir(run_dir).events()).starts][1] == "preempted"


def test_a_local_run_owned_by_a_live_launcher_is_not_resubmitted(
    tmp_path: Path, runs_root: Path
) -> None:
    made = CliRunner().invoke(
        cli, ["render", str(DIGITS), "--site", "local", "-o", str(tmp_path / "job.sbatch")]
    )
    assert made.exit_code == 0, made.output
    (run_dir,) = runs_root.iterdir()
    launcher = Claim("local", socket.gethostname(), os.getppid(), os.getuid(), time.time())
    assert ownership.take(run_dir, launcher, ownership.alive) is None
    result = CliRunner().invoke(cli, ["resubmit", str(run_dir)])
    assert result.exit_code == 2
    assert f"Error: a local run (pid {os.getppid()} on {launcher.host}) owns {run_dir}" in (
        result.output
    )
