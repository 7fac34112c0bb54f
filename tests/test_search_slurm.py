"""A search on the real 2-node test cluster (#33's proof): a tiny Task whose objective has a
known optimum (:mod:`tests.search_task`), 24 trials, 4 at once, TPE with ASHA, one trial
preempted mid-run. Every trial is a run of its own; the preempted one resumes as itself (the
same run directory and trial number, from its checkpoint); pruned trials end ``pruned`` and
their task takes the next trial; ``status SWEEP --json`` and ``Sweep.best()`` agree. One
search serves every assertion."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpctf.core.run.rundir import RunDir
from hpctf.core.search.search_dir import agents, read_agent, trial_run_dirs
from hpctf.core.search.trial_ref import read_trial_ref
from tests.conftest import ENTRIES_PATH, HPCTF, REPO
from tests.search_task import penalty
from tests.slurm_jobs import logs_of

pytestmark = [pytest.mark.slurm, pytest.mark.tf]
TRIALS, PARALLEL, STEPS = 24, 4, 40
# On Slurm 24.11 (the second cluster, #45): the same array, requeue and agents with half the
# trials, each one a start of TensorFlow on the shared 2-core test machine. #33's proof is the
# 22.05 run's 24.
TRIALS_ON_THE_SECOND_SLURM = 12

EXPERIMENT = """\
name: tiny
resources: {{nodes: 1, tasks_per_node: 1, time: "00:10:00"}}
train:
  entry: search_task:build
  python_path: {path}
  args: {{step_seconds: 0.1}}
  steps: {steps}
  global_batch_size: 8
  log_every_steps: 5
  eval_every_steps: 5
  save_model: false
checkpoint: {{every_steps: 10}}
sweep:
  parameters:
    train.args.x: {{type: float, low: 0.0, high: 1.0, step: 0.05}}
    train.args.depth: {{type: int, low: 0, high: 3}}
  objective: {{metric: eval.objective, direction: minimize}}
  trials: {trials}
  parallel: {parallel}
  sampler: tpe
  seed: 1
  pruner: {{kind: asha, min_evals: 1, reduction_factor: 3}}
"""


def hpctf(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def events(run_dir: Path) -> list[str]:
    return [e["event"] for e in RunDir(run_dir).events()]


def until(condition: object, deadline: float, what: object) -> None:
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.3)


def agent_logs(sweep: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in (sweep / "logs").iterdir())


def first_checkpointed(sweep: Path) -> Path | None:
    """A trial run that has saved its first checkpoint and is still training."""
    for run in trial_run_dirs(sweep):
        saved = (run / "checkpoints").exists() and any((run / "checkpoints").glob("ckpt-10*"))
        if saved and not (run / "DONE").exists() and "pruned" not in events(run):
            return run
    return None


@pytest.mark.both_slurms
def test_a_search_runs_its_trials_on_one_array_of_agents(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    trials = TRIALS_ON_THE_SECOND_SLURM if slurm_cluster.get("HPCTF_SLURM_ROOT") else TRIALS
    experiment = tmp_path / "search.yaml"
    experiment.write_text(EXPERIMENT.format(path=json.dumps(ENTRIES_PATH), steps=STEPS,
                                            trials=trials, parallel=PARALLEL))  # fmt: skip
    began = time.monotonic()
    out = hpctf(env, "sweep", str(experiment), "--site", "local-slurm")
    (array,) = re.findall(r"^submitted job array (\d+): 4 agent\(s\)$", out, re.M)
    sweep = Path(re.search(r"^sweep directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 600

    # Preempt one trial mid-run: the walltime warning to its array task, as Slurm's --signal
    # would send it. Its rank saves, exits 75, job-end requeues the task alone.
    until(lambda: first_checkpointed(sweep) is not None, deadline, lambda: agent_logs(sweep))
    victim = first_checkpointed(sweep)
    assert victim is not None
    ref = read_trial_ref(victim)
    assert ref is not None
    handle = [e["job_id"] for e in RunDir(victim).events() if e["event"] == "started"][-1]
    subprocess.run(["scancel", "--signal=USR2", handle], env=env, check=True)
    until(lambda: "requeued" in events(victim) or "pruned" in events(victim)
          or (victim / "DONE").exists(), deadline, lambda: logs_of(victim))  # fmt: skip
    preempted = "requeued" in events(victim)

    # The search ends: every array task gone once the budget is spent and every trial ended.
    def finished() -> bool:
        squeue = subprocess.run(["squeue", f"--jobs={array}", "--array", "--noheader"],
                                env=env, capture_output=True, text=True, check=False)  # fmt: skip
        return squeue.returncode == 0 and not squeue.stdout.strip()

    until(finished, deadline, lambda: agent_logs(sweep))
    took = time.monotonic() - began

    runs = trial_run_dirs(sweep)
    numbers = [read_trial_ref(run).number for run in runs]  # type: ignore[union-attr]
    assert numbers == list(range(trials)), numbers  # every trial a run of its own, each once
    assert len({run.resolve() for run in runs}) == trials

    document = json.loads(hpctf(env, "status", str(sweep), "--json"))
    assert document["budget"] == {"asked": trials, "trials": trials}
    states = {d["trial"]: d["state"] for d in document["trials"]}
    assert set(states.values()) <= {"done", "pruned"}, (states, agent_logs(sweep))
    pruned = [n for n, s in states.items() if s == "pruned"]
    assert pruned, states  # ASHA stopped some trials early...
    for number in pruned:  # ...each ended pruned in its run, saved, not failed
        run = runs[number]
        assert "pruned" in events(run) and not (run / "DONE").exists()
        assert RunDir(run).checkpoint_step() < STEPS
    # ...and freed its task: every trial was told by the task that ran it, and some task went
    # on from a pruned trial to the next one.
    finished = [agent.finished for agent in agents(sweep)]
    assert sorted(n for told in finished for n in told) == list(range(trials)), finished
    assert any(n in pruned for told in finished for n in told[:-1]), finished

    # The preempted trial resumed as itself: the same run directory and trial number, its
    # step continued from the checkpoint it saved on the warning.
    if preempted:
        log = (victim / "logs" / "rank-0.log").read_text()
        saved = int(log.split("preempted: saved step ")[1].split(";")[0])
        assert f"resumed from {victim}/checkpoints/ckpt-{saved} at step {saved}" in log, log
        starts = [e for e in RunDir(victim).events() if e["event"] == "started"]
        assert len(starts) == 2 and starts[1]["step"] == saved
        assert states[ref.number] in ("done", "pruned")
        task = int(handle.split("_")[1])
        assert ref.number in read_agent(sweep, task).finished

    # status and Sweep.best() agree on the best trial, and it is near the known optimum.
    import hpctf as api

    best = api.Sweep(sweep).best()
    assert best is not None and document["best"]["trial"] == best.index
    assert Path(document["best"]["run_dir"]) == Path(best.run.path)
    values = best.values
    value = document["best"]["value"]
    assert value == pytest.approx(min(d["value"] for d in document["trials"]
                                      if d["state"] == "done"))  # fmt: skip
    assert penalty(values["train.args.x"], values["train.args.depth"]) < 0.1, values
    text = hpctf(env, "status", str(sweep))
    assert f"{trials} of {trials} trials asked" in text and f"(trial {best.index})" in text
    print(f"search test: {took:.0f} s for {trials} trials, {len(pruned)} pruned, preempted "
          f"{'trial ' + str(ref.number) if preempted else 'none (it ended first)'}; best "
          f"{value:.4f} at {values}")  # fmt: skip


def test_a_custom_loops_trial_is_pruned_at_one_step_on_both_ranks_on_slurm(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """``train.loop: custom`` (examples/custom_loop, 2 nodes) as a search's trial on the real
    cluster: its ``session.evaluated`` tells the study far ahead of it, both ranks take the
    chief's vote at the first evaluation (step 6), save it and leave; job-end records the end
    pruned and requeues nothing."""
    from tests.search_trials import make_trial, start_trial

    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    (tmp_path / "runs").mkdir()
    make_trial(tmp_path / "staged", tmp_path / "runs", "asha")
    experiment = REPO / "examples" / "custom_loop" / "experiment.yaml"
    sets = ["train.steps=24", "train.eval_every_steps=6", "train.log_every_steps=6",
            "checkpoint.every_steps=12"]  # fmt: skip
    run_dir, said = start_trial(tmp_path, tmp_path / "staged" / "trial.json", experiment,
                                *sets, site="local-slurm", env=env)  # fmt: skip
    until(lambda: "ended" in events(run_dir), time.monotonic() + 240, lambda: logs_of(run_dir))
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert re.findall(r"the search pruned this trial: saved step (\d+)", log) == ["6"], log
    assert RunDir(run_dir).checkpoint_step() == 6
    ended = [e for e in RunDir(run_dir).events() if e["event"] == "ended"]
    assert [(e["reason"], e["exit_code"]) for e in ended] == [("pruned", 0)], said
    assert "requeued" not in events(run_dir) and not (run_dir / "DONE").exists()
