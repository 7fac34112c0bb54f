"""A search's array agents, without Slurm: which trial each task trains next, what it tells the
study, and that a stopped task resumes its own trial (the same run directory), never a new
one. The runs' ends are journal records, written as job-start and job-end write them; the
study is a real Optuna journal in a temporary sweep directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.batch.search_agent import ArrayTask, next_run
from hpctf.cli import cli
from hpctf.core.errors import UserError
from hpctf.core.run import journal
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.search import search_dir
from hpctf.core.search.study import (
    JOURNAL_FILE,
    build_pruner,
    grid_size,
    grid_values,
    open_study,
    trial_budget,
)
from hpctf.core.search.trial_config import with_params
from hpctf.core.search.trial_ref import read_trial_ref
from hpctf.core.settings.search import Pruner, Search
from tests.conftest import DIGITS
from tests.fake_slurm import FakeSlurm, squeue_line
from tests.search_trials import SPACE, end_run, make_search

optuna = pytest.importorskip("optuna")


def said() -> tuple[list[str], object]:
    lines: list[str] = []
    return lines, lines.append


def test_each_task_takes_a_trial_of_its_own_with_its_run_directory(tmp_path: Path) -> None:
    sweep = make_search(tmp_path)
    lines, say = said()
    first = next_run(ArrayTask(sweep, 0, "77_0", "77"), False, say)  # type: ignore[arg-type]
    second = next_run(ArrayTask(sweep, 1, "77_1", "77"), False, say)  # type: ignore[arg-type]
    assert first is not None and second is not None and first != second
    assert first.name == "digits-trial-0000" and second.name == "digits-trial-0001"
    ref = read_trial_ref(first)
    assert ref is not None and ref.number == 0 and ref.journal == str(sweep / JOURNAL_FILE)
    config = RunDir(first).load_config()
    assert config.experiment.train.args["hidden"] == ref.params["train.args.hidden"]
    assert config.experiment.train.args["learning_rate"] == ref.params["train.args.learning_rate"]
    assert config.experiment.sweep is None  # a trial is a plain run
    assert (first / "code").resolve() == (sweep / "search" / "code").resolve()
    submitted = read_history(RunDir(first)).submissions
    assert [s.job_id for s in submitted] == ["77_0"]
    assert search_dir.read_agent(sweep, 1).number == 1
    assert search_dir.trial_run_dirs(sweep) == [first, second]
    assert "task 0 takes trial 0" in lines[0]


def test_an_ended_trial_is_told_and_a_stopped_one_resumed_as_itself(tmp_path: Path) -> None:
    sweep = make_search(tmp_path, trials=4)
    _, say = said()
    t0, t1 = ArrayTask(sweep, 0, "77_0", "77"), ArrayTask(sweep, 1, "77_1", "77")
    run0, run1 = next_run(t0, False, say), next_run(t1, False, say)  # type: ignore[arg-type]
    assert run0 is not None and run1 is not None

    # Task 0's run is done: the study is told COMPLETE with its last eval.loss; a new trial.
    end_run(run0, "77_0", "done", loss=0.25)
    run2 = next_run(t0, True, say)  # type: ignore[arg-type]
    assert run2 is not None and run2.name.endswith("trial-0002")
    # Task 1's run was preempted and job-end requeued its job: the task ends...
    end_run(run1, "77_1", "preempted")
    journal.record_requeued(RunDir(run1), "77_1", "preempted")
    assert next_run(t1, True, say) is None  # type: ignore[arg-type]
    # ...and its restart resumes the same trial's run directory, not a new trial.
    assert next_run(t1, False, say) == run1  # type: ignore[arg-type]
    assert [s.job_id for s in read_history(RunDir(run1)).submissions] == ["77_1"]
    # A new array's task (hpctf resubmit SWEEP) resumes it too, and records its submission.
    assert next_run(ArrayTask(sweep, 1, "88_1", "88"), False, say) == run1  # type: ignore[arg-type]
    assert [s.job_id for s in read_history(RunDir(run1)).submissions] == ["77_1", "88_1"]

    # A failed run is told FAIL and spends the budget: 4 trials asked, then nothing more.
    end_run(run2, "77_0", "failed")
    run3 = next_run(t0, True, say)  # type: ignore[arg-type]
    assert run3 is not None and run3.name.endswith("trial-0003")
    end_run(run3, "77_0", "done", loss=0.5)
    assert next_run(t0, True, say) is None  # type: ignore[arg-type]

    study = open_study(sweep / JOURNAL_FILE, search_dir.STUDY_NAME, Pruner())
    states = {t.number: (t.state.name, t.value) for t in study.get_trials()}
    assert states == {0: ("COMPLETE", 0.25), 1: ("RUNNING", None), 2: ("FAIL", None),
                      3: ("COMPLETE", 0.5)}  # fmt: skip
    assert search_dir.read_agent(sweep, 0).finished == [0, 2, 3]


@pytest.mark.parametrize("signalled", [True, False])
def test_a_trial_whose_job_slurm_ended_is_resumed_not_failed(
    tmp_path: Path, signalled: bool
) -> None:
    """A preemption whose save did not finish, a lost node, ``scontrol requeue``: the batch
    shell got SIGTERM (or the start ended without a word, node_fail) and the run reads
    failed, but Slurm requeues the task: the trial is not over, its restart resumes it."""
    sweep = make_search(tmp_path, trials=4)
    _, say = said()
    task = ArrayTask(sweep, 0, "77_0", "77")
    run = next_run(task, False, say)  # type: ignore[arg-type]
    assert run is not None
    journal.record_started(RunDir(run), "77_0", nodes="node1", walltime_signal="USR2")
    if signalled:
        journal.record_signalled(RunDir(run), "77_0", "TERM")
    journal.record_ended(RunDir(run), "77_0", 1 if signalled else 137,
                         "failed" if signalled else "node_fail")  # fmt: skip
    assert read_history(RunDir(run)).state.state == "failed"
    assert next_run(task, True, say) is None  # type: ignore[arg-type]
    assert next_run(task, False, say) == run  # type: ignore[arg-type]
    study = open_study(sweep / JOURNAL_FILE, search_dir.STUDY_NAME, Pruner())
    assert [t.state.name for t in study.get_trials()] == ["RUNNING"]
    # A failure of its own (no signal, an exit code) is the trial's end: FAIL, the next one.
    journal.record_started(RunDir(run), "77_0", nodes="node1", walltime_signal="USR2")
    journal.record_ended(RunDir(run), "77_0", 1, "failed")
    following = next_run(task, True, say)  # type: ignore[arg-type]
    assert following is not None and following.name.endswith("trial-0001")


def test_a_trial_asked_by_a_task_killed_before_recording_it_is_adopted(tmp_path: Path) -> None:
    """Killed between the study's ask and its agent file: the trial is RUNNING and held by
    nobody. The next agent to ask runs it (the budget is not spent on a ghost); one whose
    parameters were not all drawn is failed; none is adopted while a record is damaged."""
    sweep = make_search(tmp_path, trials=3)
    _, say = said()
    study = open_study(sweep / JOURNAL_FILE, search_dir.STUDY_NAME, Pruner())
    distributions = {
        "train.args.learning_rate": optuna.distributions.FloatDistribution(0.001, 0.1, log=True),
        "train.args.hidden": optuna.distributions.CategoricalDistribution([8, 16, 32]),
    }
    ghost = study.ask(distributions)  # task 5's ask; it died before its agent file
    half = study.ask({"train.args.hidden": distributions["train.args.hidden"]})  # mid-draw
    (sweep / search_dir.AGENTS_DIR).mkdir(exist_ok=True)
    damaged = search_dir.agent_file(sweep, 9)
    damaged.write_text("{not json")
    assert search_dir.held_trials(sweep) is None
    run = next_run(ArrayTask(sweep, 0, "77_0", "77"), False, say)  # type: ignore[arg-type]
    assert run is not None and run.name.endswith("trial-0002")  # nothing adopted: a new trial
    damaged.unlink()
    adopted = next_run(ArrayTask(sweep, 1, "77_1", "77"), False, say)  # type: ignore[arg-type]
    assert adopted is not None and adopted.name.endswith(f"trial-{ghost.number:04d}")
    ref = read_trial_ref(adopted)
    assert ref is not None and ref.params == ghost.params
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {ghost.number: "RUNNING", half.number: "FAIL", 2: "RUNNING"}
    assert search_dir.held_trials(sweep) == {ghost.number, 2}
    # The budget (3) is spent: a third task has nothing to ask.
    assert next_run(ArrayTask(sweep, 2, "77_2", "77"), False, say) is None  # type: ignore[arg-type]


def test_a_damaged_or_edited_agent_record_is_one_line_and_removes_nothing(
    tmp_path: Path,
) -> None:
    sweep = make_search(tmp_path, trials=2)
    _, say = said()
    task = ArrayTask(sweep, 0, "77_0", "77")
    run = next_run(task, False, say)  # type: ignore[arg-type]
    assert run is not None
    record = search_dir.agent_file(sweep, 0)
    data = json.loads(record.read_text())
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "results.h5").write_text("hours of work")
    record.write_text(json.dumps({**data, "run_dir": str(victim)}))  # no trial.json there
    result = CliRunner().invoke(cli, ["search-next", str(sweep)],
                                env={"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0",
                                     "SLURM_JOB_ID": "78"})  # fmt: skip
    assert result.exit_code == 3, result.output
    assert f"trial 0's run directory is {run}, not {victim}" in result.output
    assert "Traceback" not in result.output and (victim / "results.h5").exists()
    record.write_text('{"task": 0, "number": "zero"}')
    result = CliRunner().invoke(cli, ["search-next", str(sweep)],
                                env={"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0",
                                     "SLURM_JOB_ID": "78"})  # fmt: skip
    assert result.exit_code == 3, result.output
    assert f"{record}: damaged" in result.output and "Traceback" not in result.output


def test_a_study_journal_damaged_in_the_middle_is_one_line_exit_3(
    tmp_path: Path, fake_slurm: FakeSlurm
) -> None:
    """An append cut short (a full disk, a quota) and others after it: every read of the
    study fails in Optuna; the agent and status say which file, exit 3, no traceback."""
    sweep = make_search(tmp_path, trials=3)
    _, say = said()
    assert next_run(ArrayTask(sweep, 0, "77_0", "77"), False, say) is not None  # type: ignore[arg-type]
    journal_file = sweep / JOURNAL_FILE
    lines = journal_file.read_bytes().splitlines(keepends=True)
    journal_file.write_bytes(b"".join(lines[:-1]) + lines[-1][:7] + b"\n" + lines[-1])
    env = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "79"}
    for args in (["search-next", str(sweep)], ["status", str(sweep)]):
        result = CliRunner().invoke(cli, args, env=env)
        assert result.exit_code == 3, result.output
        assert f"{journal_file}: damaged" in result.output, result.output
        assert "Traceback" not in result.output


def test_wait_on_a_search_ends_by_the_study_even_for_trials_without_a_run(
    tmp_path: Path, fake_slurm: FakeSlurm
) -> None:
    """hpctf.Sweep.wait(): over once the budget is asked and nothing runs in the study, also
    when a trial never had a run directory (refused parameters, a killed task's ask)."""
    import hpctf

    sweep = make_search(tmp_path, trials=2)
    _, say = said()
    task = ArrayTask(sweep, 0, "77_0", "77")
    run = next_run(task, False, say)  # type: ignore[arg-type]
    assert run is not None
    study = open_study(sweep / JOURNAL_FILE, search_dir.STUDY_NAME, Pruner())
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # no run directory, ever
    with pytest.raises(TimeoutError):
        hpctf.Sweep(sweep).wait(timeout=0.2, poll=0.05)  # trial 0 still runs
    end_run(run, "77_0", "done", loss=0.5)
    assert next_run(task, True, say) is None  # type: ignore[arg-type]
    assert hpctf.Sweep(sweep).wait(timeout=5, poll=0.05) == {0: "done"}


def test_a_task_stopped_before_its_trial_run_existed_makes_it_on_restart(tmp_path: Path) -> None:
    sweep = make_search(tmp_path)
    _, say = said()
    task = ArrayTask(sweep, 0, "77_0", "77")
    run = next_run(task, False, say)  # type: ignore[arg-type]
    assert run is not None
    # As if the task was killed between recording its trial and making the run directory.
    for child in sorted(run.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
    run.rmdir()
    assert next_run(task, False, say) == run  # type: ignore[arg-type]
    assert read_trial_ref(run) is not None and RunDir(run).config_file.is_file()
    study = open_study(sweep / JOURNAL_FILE, search_dir.STUDY_NAME, Pruner())
    assert len(study.get_trials()) == 1  # the same trial, not a new one


def test_the_grid_sampler_takes_every_choice_once(tmp_path: Path) -> None:
    space = {"train.args.hidden": {"type": "int", "low": 8, "high": 24, "step": 8},
             "train.args.learning_rate": {"type": "float", "low": 0.1, "high": 0.3,
                                          "step": 0.1}}  # fmt: skip
    search = Search.model_validate({"parameters": space, "sampler": "grid", "trials": 100,
        "objective": {"metric": "eval.loss", "direction": "minimize"}})  # fmt: skip
    assert grid_values(search.parameters["train.args.learning_rate"]) == [0.1, 0.2, 0.3]
    assert grid_size(search) == 9 and trial_budget(search) == 9


def test_the_pruner_is_the_one_the_search_names() -> None:
    assert type(build_pruner(Pruner(kind="asha"))).__name__ == "SuccessiveHalvingPruner"
    assert type(build_pruner(Pruner(kind="hyperband", max_evals=9))).__name__ == "HyperbandPruner"
    assert type(build_pruner(Pruner())).__name__ == "NopPruner"


def test_a_trial_may_not_set_what_the_array_script_holds(tmp_path: Path) -> None:
    sweep = make_search(tmp_path)
    base = RunDir(sweep / "search").load_config()
    with pytest.raises(UserError, match=r"resources\.nodes: a search's parameter may not set"):
        with_params(base, {"resources.nodes": 2})
    assert with_params(base, {"checkpoint.every_steps": 7}).experiment.checkpoint.every_steps == 7


def test_sweep_status_cancel_and_resubmit_of_a_search(
    tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the CLI, Slurm faked at the subprocess boundary: one array of min(parallel,
    trials, MaxArraySize) agents; status names the trials and the budget; cancel cancels the
    array and records it in the trial that had a job; resubmit submits the array again once
    no task of it is left in Slurm, and refuses while one is."""
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(tmp_path / "runs"))
    fake_slurm.answer("scontrol", "MaxArraySize            = 3\n")
    path = tmp_path / "experiment.yaml"
    text = DIGITS.read_text().replace("train:\n", f"train:\n  python_path: [{DIGITS.parent}]\n", 1)
    search = {"parameters": SPACE, "trials": 5, "parallel": 4,
              "objective": {"metric": "eval.loss", "direction": "minimize"}}  # fmt: skip
    path.write_text(text + "sweep: " + json.dumps(search) + "\n")
    result = CliRunner().invoke(cli, ["sweep", str(path), "--site", "local-slurm",
                                      "--set", "resources.nodes=1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "submitted job array 4242: 3 agent(s)" in result.output  # MaxArraySize < parallel
    sweep = Path(re.search(r"sweep directory: (\S+)", result.output).group(1))  # type: ignore[union-attr]
    (sbatch,) = fake_slurm.calls("sbatch")
    assert sbatch.endswith(f"{sweep}/array-0.sbatch")
    assert "#SBATCH --array=0-2" in (sweep / "array-0.sbatch").read_text()
    run = next_run(ArrayTask(sweep, 0, "4242_0", "4242"), False, lambda _: None)
    assert run is not None

    fake_slurm.answer("squeue", squeue_line("4242_0", "RUNNING"))
    status = CliRunner().invoke(cli, ["status", str(sweep), "--json"])
    assert status.exit_code == 0, status.output
    document = json.loads(status.output[status.output.index("{") :])
    assert document["budget"] == {"asked": 1, "trials": 5} and document["best"] is None
    assert [(t["trial"], t["run_dir"]) for t in document["trials"]] == [(0, str(run))]

    refused = CliRunner().invoke(cli, ["resubmit", str(sweep)])
    assert refused.exit_code == 2 and "job array 4242" in refused.output
    assert len(fake_slurm.calls("sbatch")) == 1

    cancelled = CliRunner().invoke(cli, ["cancel", str(sweep)])
    assert cancelled.exit_code == 0, cancelled.output
    assert fake_slurm.calls("scancel")[-1].endswith("4242")
    assert read_history(RunDir(run)).state.state == "cancelled"

    fake_slurm.answer("squeue", squeue_line("4242_0", "CANCELLED"))
    again = CliRunner().invoke(cli, ["resubmit", str(sweep)])
    assert again.exit_code == 0, again.output
    assert len(fake_slurm.calls("sbatch")) == 2
    assert len(json.loads((sweep / "sweep.json").read_text())["arrays"]) == 2
    third = CliRunner().invoke(cli, ["resubmit", str(sweep)])  # the search's one script, again
    assert third.exit_code == 0, third.output
    scripts = [call.split()[-1] for call in fake_slurm.calls("sbatch")]
    assert scripts == [str(sweep / "array-0.sbatch")] * 3
    refused = CliRunner().invoke(cli, ["resubmit", str(run)])  # a trial: resubmit its sweep
    assert refused.exit_code == 2 and f"trial 0 of the search in {sweep}" in refused.output
    # Its trial.json damaged, or gone: still refused (its script is the array's agents).
    (run / "trial.json").write_text("{")
    refused = CliRunner().invoke(cli, ["resubmit", str(run)])
    assert refused.exit_code == 3 and "trial.json: damaged" in refused.output, refused.output
    (run / "trial.json").unlink()
    refused = CliRunner().invoke(cli, ["resubmit", str(run)])
    assert refused.exit_code == 2 and "a search's trial without its trial.json" in refused.output
    assert len(fake_slurm.calls("sbatch")) == 3
