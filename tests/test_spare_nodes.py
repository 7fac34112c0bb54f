"""Spare nodes (``resources.spare_nodes``, issue #44 item 1): the job asks Slurm for N+K nodes
with --no-kill, srun runs on N of them, and job-end decides, once, what a lost node means: a
spare left starts the workers again in the same allocation without the node (exit 98 and the
batch script's --exclude), none left falls back to the requeue, the same node is counted once,
and two losses in a row without progress stop the run naming the cause. Pure decisions, the
rendered script, and job-end with Slurm faked at the subprocess boundary;
tests/test_spare_nodes_slurm.py loses a node of the real test cluster."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.errors import RELAUNCH_EXIT
from hpctf.core.run import journal
from hpctf.core.run.history import RestartCause, lost_in_allocation, spare_refusal
from hpctf.core.run.history.decisions import after_end
from hpctf.core.run.history.runstate import run_state
from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS
from tests.fake_slurm import fake_checkpoint, fake_command
from tests.journal_records import BUDGETS, ended

ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_RESTART_COUNT": "0"}


def started(step: int, restart: int = 0, job: str = "7") -> dict[str, Any]:
    return {"event": journal.STARTED, "job_id": job, "step": step, "restart_count": restart}


def down(*nodes: str, job: str = "7") -> dict[str, Any]:
    return {"event": journal.NODES_DOWN, "job_id": job, "nodes": list(nodes), "signal": ""}


def test_the_nodes_lost_in_an_allocation_are_counted_once_and_a_requeue_starts_afresh() -> None:
    state = run_state([started(0), down("n2"), ended("failed", 10, 3), started(10), down("n2")])
    assert state.starts[0].cause is RestartCause.NODE_LOST
    assert lost_in_allocation(state.starts) == ("n2",)  # the same node twice: once
    assert spare_refusal(("n2",), 1) is None
    assert "no spare node left (2 lost in this allocation: n2,n3" in str(
        spare_refusal(("n2", "n3"), 1)
    )
    # Slurm requeued the job (its restart count grew): a new allocation, nothing lost in it.
    requeued = run_state([started(0), down("n2"), ended("node_fail", 10, 0), started(10, 1)])
    assert lost_in_allocation(requeued.starts) == ()
    assert lost_in_allocation(run_state([]).starts) == ()


def test_two_lost_nodes_in_a_row_without_progress_stop_the_run_naming_the_cause() -> None:
    once = [started(10), down("n2"), ended("failed", 10, 3)]
    assert after_end(run_state(once), BUDGETS).go  # not the code's fault: tried again
    decision = after_end(run_state([*once, started(10), down("n3"), ended("failed", 10, 3)]),
                         BUDGETS)  # fmt: skip
    assert not decision.go and decision.gave_up
    assert "failed (node_lost) twice in a row without progress (checkpoint step 10)" in (
        decision.why
    )


def test_the_script_asks_for_the_spares_and_runs_the_step_on_n_of_them(
    runs_root: Path, fake_sbatch: Path
) -> None:
    sets = ["--set", "resources.spare_nodes=2", "--set", "resources.tasks_per_node=2"]
    result = CliRunner().invoke(cli, ["render", str(DIGITS), "--site", "local-slurm", *sets])
    assert result.exit_code == 0, result.output
    script = result.output
    assert "#SBATCH --nodes=4\n#SBATCH --no-kill\n" in script
    assert '  --overlap --ntasks=4 ${exclude:+"--exclude=$exclude"} \\\n  --nodes=2 ' in script
    assert "exclude=$(cat \"$RUN_DIR\"/'logs/.step-exclude' 2>/dev/null)" in script
    # bash reads it: an empty list is no --exclude at all, a list one word.
    words = 'set -- ${exclude:+"--exclude=$exclude"}; echo "$#:$*"'
    for value, said in (("", "0:\n"), ("node2,node5", "1:--exclude=node2,node5\n")):
        out = subprocess.run(["bash", "-c", f"exclude={value}; {words}"], capture_output=True,
                             text=True, check=True)  # fmt: skip
        assert out.stdout == said


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--site", "local"], "resources.spare_nodes: needs a Slurm site"),
        (["--site", "local-slurm", "--set", "resources.spare_nodes=-1"], "greater than or equal"),
        (["--site", "local-slurm", "--set", "resources.extra_sbatch=['--no-kill']"],
         "set resources.spare_nodes"),
    ],
    ids=["local-site", "negative", "no-kill-by-hand"],
)  # fmt: skip
def test_spare_nodes_are_refused_where_they_cannot_work_in_one_line(
    runs_root: Path, extra: list[str], why: str
) -> None:
    sets = [] if "--set" in extra else ["--set", "resources.spare_nodes=1"]
    result = CliRunner().invoke(cli, ["validate", str(DIGITS), *extra, *sets])
    assert result.exit_code == 2, result.output
    assert why in result.output and len(result.output.strip().splitlines()) == 1, result.output


@pytest.fixture
def run_dir(runs_root: Path, fake_sbatch: Path) -> Path:
    sets = ["--set", "resources.spare_nodes=1"]
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", *sets])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    return path


def _job_end(
    bin_dir: Path, run_dir: Path, down_nodes: str, step: int, dead: str = "none"
) -> tuple[int, str, Path]:
    """job-end after srun ended with exit 3 (the survivors left), Slurm saying ``down_nodes``
    are down, the job RUNNING for an hour more, a probe step failing where it names node
    ``dead``; its exit code, output and scontrol's calls."""
    fake_checkpoint(run_dir / "checkpoints", step)
    fake_command(bin_dir, "srun", f'case "$*" in *--nodelist=*{dead}*) exit 1 ;; esac')
    lines = "; ".join(f"echo '{n}|{'down*' if n in down_nodes else 'mixed'}'"
                      for n in ("node1", "node2", "node3"))  # fmt: skip
    fake_command(bin_dir, "sinfo", lines)
    end = (datetime.now() + timedelta(hours=1)).isoformat(timespec="seconds")
    show = f'echo "JobId=4242 JobState=RUNNING EndTime={end}"'
    scontrol = fake_command(bin_dir, "scontrol", f'[ "$1" = show ] && {show}; :')
    result = CliRunner().invoke(cli, ["job-end", str(run_dir), "--exit-code", "3"], env=ENV)
    return result.exit_code, result.output, scontrol


def test_job_end_uses_a_spare_then_counts_the_same_node_once_then_requeues_with_none_left(
    run_dir: Path, fake_sbatch: Path
) -> None:
    bin_dir = fake_sbatch.parent / "fakebin"
    run = RunDir(run_dir)
    assert CliRunner().invoke(cli, ["job-start", str(run_dir)], env=ENV).exit_code == 0

    # node2 lost, a spare left: the workers start again here, node2 left out.
    code, output, _ = _job_end(bin_dir, run_dir, "node2", 100)
    assert code == RELAUNCH_EXIT, output
    assert "hpctf: job 4242 lost node(s) node2 (Slurm: down or drained)" in output
    assert "node2 lost: spare 1 of 1 used; failed: requeue 1 of 3" in output
    assert run.step_exclude.read_text() == "node2"
    events = run.events()
    assert [e["event"] for e in events[-4:]] == ["ended", "nodes_down", "requeued", "started"]
    assert events[-1]["nodes"] == "node1,node3" and events[-2]["in_place"] is True

    # A crash on the nodes left, node2 still down: not a new loss, nor a refusal; one probe
    # step on the nodes left, which starts.
    code, output, _ = _job_end(bin_dir, run_dir, "node2", 200)
    assert code == RELAUNCH_EXIT, output
    assert "lost node" not in output and run.step_exclude.read_text() == "node2"
    assert [e["event"] for e in run.events()].count("nodes_down") == 1
    probes = (bin_dir / "srun.calls").read_text().splitlines()
    assert probes == ["--jobid=4242 --overlap --quiet --nodes=2 --ntasks=2 --ntasks-per-node=1 "
                      "--nodelist=node1,node3 true"]  # fmt: skip

    # node3 lost too: no spare left, the job is requeued and kept off both.
    code, output, scontrol = _job_end(bin_dir, run_dir, "node2 node3", 300)
    assert code == 0, output
    assert "not started again here: no spare node left (2 lost in this allocation" in output
    calls = scontrol.read_text().splitlines()
    assert calls[-3:] == [
        "requeue -- 4242",
        "update JobId=4242 ExcNodeList=node2,node3",
        "update JobId=4242 StartTime=now+5",
    ]
    status = CliRunner().invoke(cli, ["status", str(run_dir)], env={"SLURM_JOB_ID": ""})
    assert "(exit 3, cause node_lost node2)" in status.output, status.output
    assert "(exit 3, cause node_lost node3)" in status.output, status.output


def test_a_node_slurm_still_calls_well_where_no_step_starts_is_lost_all_the_same(
    run_dir: Path, fake_sbatch: Path
) -> None:
    """srun ended at once (the lost node's slurmstepd reported its tasks' deaths first), and
    Slurm has not noticed yet (SlurmdTimeout): the probe step on all the nodes fails, the one
    per node finds which."""
    bin_dir = fake_sbatch.parent / "fakebin"
    assert CliRunner().invoke(cli, ["job-start", str(run_dir)], env=ENV).exit_code == 0
    code, output, _ = _job_end(bin_dir, run_dir, "", 100, dead="node2")
    assert code == RELAUNCH_EXIT, output
    assert "lost node(s) node2 (no step starts there; Slurm has not said so yet)" in output
    assert RunDir(run_dir).step_exclude.read_text() == "node2"
    probes = sorted(p.split("--nodelist=")[1] for p in
                    (bin_dir / "srun.calls").read_text().splitlines())  # fmt: skip
    assert probes == ["node1 true", "node1,node2,node3 true", "node2 true", "node3 true"]
    (down,) = [e for e in RunDir(run_dir).events() if e["event"] == journal.NODES_DOWN]
    assert down["nodes"] == ["node2"] and down["signal"] == "probe"
