"""End to end on a real Slurm cluster (tests/slurm/cluster.sh: 2 emulated nodes, slurm-wlm).

These tests are the proof for the walking skeleton: real sbatch, real srun on node1 and node2,
real TensorFlow workers under MultiWorkerMirroredStrategy, real files in the run directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from hpctf.core.settings.values import slurm_time_seconds
from tests.conftest import (
    DIGITS,
    ENTRIES_PATH,
    HPCTF,
    REPO,
    checkpoint_steps,
    line_of,
    paced,
    submitted,
    wait_for_job,
)
from tests.slurm_jobs import (
    HELD_S,
    LONG,
    job_state,
    logs_of,
    report_fault,
    save_to_first_step_s,
    submit,
    submit_digits,
    wait_for_first_checkpoint,
    wait_for_log,
)

pytestmark = [pytest.mark.slurm, pytest.mark.tf]


@pytest.mark.both_slurms
def test_digits_trains_on_two_slurm_nodes(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs"), "TMPDIR": str(node_tmp)}
    job_id, run_dir = submit(env, str(DIGITS), "--site", "local-slurm")
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    assert info["NodeList"] == "node[1-2]"

    # srun ran the worker on node1 and node2 as SLURM_PROCID 0 and 1.
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    rank1 = (run_dir / "logs" / "rank-1.log").read_text()
    for rank, log in enumerate((rank0, rank1)):
        node = f"node{rank + 1}"
        pattern = (
            rf"host {node} pid \d+ \(SLURMD_NODENAME {node}\) SLURM_PROCID {rank}: "
            rf"worker {rank} of 2"
        )
        assert re.search(pattern, log), log[:500]

    done = json.loads((run_dir / "DONE").read_text())
    assert done["step"] == 300
    assert done["eval"]["accuracy"] >= 0.90
    # Checkpoints from the chief only; the other worker's throwaway saves are gone.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint"] + [
        f"ckpt-{s}.{x}" for s in (100, 200, 300) for x in ("data-00000-of-00001", "index")
    ]
    assert list(node_tmp.iterdir()) == []
    events = [e["event"] for e in RunDir(run_dir).events()]
    assert events == ["created", "submitted", "started", "ended"]

    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert f"job {job_id}: ENDED exit 0 starts 1 nodes node[1-2]" in status.stdout


def test_script_from_render_o_trains_when_sbatched_by_hand_once_however_often_sbatched(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    script = tmp_path / "job.sbatch"
    subprocess.run(
        [*HPCTF, "render", str(DIGITS), "--site", "local-slurm", "-o", str(script)],
        env=env,
        check=True,
        capture_output=True,
    )
    (run_dir,) = (tmp_path / "runs").iterdir()

    def sbatch(*options: str) -> str:
        # By hand: plain sbatch from another directory, no hpctf involved in the submission.
        proc = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout.strip()

    job_id = sbatch()
    second = sbatch()  # the same script again: Slurm's singleton holds it while the first runs
    deadline = time.monotonic() + 300
    while "started" not in [e["event"] for e in RunDir(run_dir).events()]:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    # Under another job name (as another user's would be), Slurm runs it beside the first: the
    # run directory's claim ends it at once, naming the owner.
    third = sbatch("--job-name=another")
    states: list[tuple[str | None, ...]] = []
    while (info := slurm.job_info(second)) and info["JobState"] not in slurm.FINAL_STATES:
        states.append(tuple(job_state(j) for j in (job_id, second, third)))
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.3)
    assert info and info["JobState"] == "COMPLETED", logs_of(run_dir)  # exit 0: no failure
    assert wait_for_job(job_id)["JobState"] == "COMPLETED", logs_of(run_dir)
    assert wait_for_job(third)["JobState"] == "COMPLETED", logs_of(run_dir)
    # The third ran beside the first only as long as its job-start took to end it.
    assert states and ("RUNNING", "RUNNING") not in [s[:2] for s in states], states
    assert ("RUNNING", "PENDING") in [s[:2] for s in states], states  # the second waited
    assert json.loads((run_dir / "DONE").read_text())["step"] == 300
    started = [e for e in RunDir(run_dir).events() if e["event"] == "started"]
    assert [e["job_id"] for e in started] == [job_id]  # the job recorded itself, alone
    out = (run_dir / "logs" / f"slurm-{third}.out").read_text()
    assert f"hpctf: job {third} ends at once: job {job_id} owns {run_dir}" in out
    out = (run_dir / "logs" / f"slurm-{second}.out").read_text()
    assert f"hpctf: job {second} ends at once: the run is complete" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert len(steps) == len(set(steps)), "a step was logged twice"


def long_run(
    env: dict[str, str], every_steps: int, wait_for_checkpoint: bool = True, *sets: str
) -> tuple[str, Path, float]:
    """Submit LONG digits steps with a checkpoint every ``every_steps`` (and ``sets``);
    return the job id, the run directory and a deadline, once the first checkpoint exists."""
    job_id, run_dir = submit_digits(
        env,
        f"train.steps={LONG}",
        f"checkpoint.every_steps={every_steps}",
        *sets,
    )
    deadline = time.monotonic() + 400
    if wait_for_checkpoint:
        wait_for_first_checkpoint(run_dir, timeout=400)
    return job_id, run_dir, deadline


def test_second_job_resumes_from_latest_checkpoint(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """On 22.05 alone: on 24.11 the walltime chain and the sweep run ``hpctf cancel`` and the
    preemption, crash and walltime tests resume from checkpoints (the 24.11 list of #45)."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    # A step logged each (a host read each): slow enough that the cancel lands mid-run (the
    # loop's 10-step calls ran LONG steps in about 2.5 s, before it did).
    job_id, run_dir, _ = long_run(env, 50, True, "train.log_every_steps=1")
    subprocess.run([*HPCTF, "cancel", str(run_dir)], env=env, check=True, capture_output=True)
    assert wait_for_job(job_id)["JobState"] == "CANCELLED"
    assert not (run_dir / "DONE").exists()
    saved = checkpoint_steps(run_dir)[-1]
    assert 0 < saved < LONG

    # Hostile run-directory data reaches no Slurm command: a journal job id that is an option
    # (it was `scancel --user=root`), and a copy of the run directory, whose script names the
    # original. A job of the same user stands by to be cancelled by mistake.
    sentinel = subprocess.run(
        ["sbatch", "--parsable", "--time=5", "--nodes=1", f"--output={tmp_path}/sentinel.out",
         "--wrap=sleep 300"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    hostile = run_dir / "journal" / "99999999999999999999-1-submitted.json"
    hostile.write_text(
        '{"event": "submitted", "time": "2026-12-01T00:00:00", "job_id": "--user=root"}'
    )
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, symlinks=True)
    said = {}
    # A damaged journal is hpctf's record gone wrong (exit 3); a copied run directory is the
    # user's doing (exit 2).
    for command, status in ((["cancel", str(run_dir)], 3), (["resubmit", str(copy)], 2)):
        refused = subprocess.run([*HPCTF, *command], env=env, capture_output=True, text=True)
        assert refused.returncode == status and refused.stderr.count("\n") == 1, refused.stderr
        said[command[0]] = refused.stderr
    assert "job_id '--user=root' is not a job id" in said["cancel"]
    assert f"{copy} is a copy of the run directory {run_dir}" in said["resubmit"]
    assert job_state(sentinel) in ("PENDING", "RUNNING")
    hostile.unlink()
    subprocess.run(["scancel", sentinel], env=env, check=True)
    assert wait_for_job(sentinel)["JobState"] == "CANCELLED"

    # Two resubmits released at one instant: one submits, the other says who owns the run.
    barrier = threading.Barrier(2)
    procs: list[subprocess.CompletedProcess[str]] = []

    def resubmit() -> None:
        barrier.wait()
        procs.append(
            subprocess.run(
                [*HPCTF, "resubmit", str(run_dir)], env=env, capture_output=True, text=True
            )
        )

    threads = [threading.Thread(target=resubmit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (proc,) = [p for p in procs if p.returncode == 0]
    (refused,) = [p for p in procs if p.returncode != 0]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = r"^Error: ((hpctf resubmit \(pid \d+ on \S+\)|job \d+) owns|job \d+ of \S+ is still) "
    assert re.search(said, refused.stderr), refused.stderr
    second, _ = submitted(proc.stdout)
    assert second and second != job_id
    assert [e["job_id"] for e in RunDir(run_dir).events() if e["event"] == "submitted"][1:] == [
        second
    ]
    info = wait_for_job(second)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in rank0
    assert json.loads((run_dir / "DONE").read_text())["step"] == LONG


PLANNED_RUN_STEPS, PLANNED_RESTART_AT = 3000, 2000


@pytest.mark.both_slurms
def test_preempted_job_saves_requeues_itself_and_resumes(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """Then a planned restart (train.restart_every_steps) at step 2,000: saved, requeued in
    the same way, within no budget; no step trained twice.

    The warning goes at step 100 and must land before the planned restart: 1,900 steps (about
    3 s at the loop's speed here) leave room for a loaded machine's scancel (at 1,000 one
    once came after it, and the warning went to a job that was pending its requeue)."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit_digits(
        env,
        f"train.steps={PLANNED_RUN_STEPS}",
        "checkpoint.every_steps=1000",
        f"train.restart_every_steps={PLANNED_RESTART_AT}",
    )
    rank0 = run_dir / "logs" / "rank-0.log"
    deadline = time.monotonic() + 180
    while not (rank0.exists() and "step 100/" in rank0.read_text()):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    # What Slurm does before a preemption or the time limit (--signal=USR2@T): the signal goes
    # to the job steps only, here to rank 1 alone.
    subprocess.run(["scancel", "--signal=USR2", job_id], env=env, check=True)
    while "requeued" not in [e["event"] for e in RunDir(run_dir).events()]:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    assert info["Restarts"] == "2"

    log = rank0.read_text()
    saved = int(log.split("preempted: saved step ")[1].split(";")[0])
    assert 100 <= saved < PLANNED_RESTART_AT
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in log
    assert f"restart: saved step {PLANNED_RESTART_AT}; exiting 75 for a requeue" in log
    assert (
        f"resumed from {run_dir}/checkpoints/ckpt-{PLANNED_RESTART_AT} "
        f"at step {PLANNED_RESTART_AT}" in log
    )
    assert json.loads((run_dir / "DONE").read_text())["step"] == PLANNED_RUN_STEPS
    logged = [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "loss" in r]
    assert len(logged) == len(set(logged)) and logged == sorted(logged), logged
    # scontrol requeue signals the batch shell too: its trap records that, after the requeue.
    events = [e for e in RunDir(run_dir).events() if e["event"] != "signalled"]
    assert [e["event"] for e in events] == [
        "created",
        "submitted",
        "started",
        journal.SAVED_ON_WARNING,
        "ended",
        "requeued",
        "released",  # Slurm's ~120 s hold on the requeued job, cut short by job-end
        "started",
        journal.SAVED_FOR_RESTART,
        "ended",
        "requeued",
        "released",
        "started",
        "ended",
    ]
    assert events[4]["reason"] == "timeout"  # USR2, the site's warning before the time limit
    assert events[3]["step"] == saved and events[-1]["exit_code"] == 0
    # Each start resumed at the step the one before it saved: none trained twice.
    assert [e["step"] for e in events if e["event"] == "started"] == [0, saved, PLANNED_RESTART_AT]
    assert (events[9]["reason"], events[9]["step"], events[9]["exit_code"]) == (
        "restart",
        PLANNED_RESTART_AT,
        75,
    )
    assert events[10]["why"] == "restart 1 (train.restart_every_steps): no budget used"
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert f"job {job_id}: ENDED exit 0 starts 3" in status.stdout
    # The preemption used its budget (1 of the site's 3); the planned restart none.
    assert "requeues after preemption 1/" in status.stdout, status.stdout
    assert "after failures 0/" in status.stdout, status.stdout
    assert "planned restarts 1 (every 2,000 steps)" in status.stdout, status.stdout
    # The job's own output holds every start's lines (appended, not truncated at the restart).
    out = (run_dir / "logs" / f"slurm-{job_id}.out").read_text()
    assert re.findall(rf"^===== hpctf: job {job_id} start \(restart (\d)\)", out, re.M) == [
        "0",
        "1",
        "2",
    ], out
    assert f"hpctf: job {job_id} requeued: timeout" in out and "ended: done" in out, out
    assert f"hpctf: job {job_id} requeued: restart 1" in out, out
    # Released by job-end, not held ~120 s: started at Slurm's next scheduling pass.
    restart = save_to_first_step_s(run_dir)
    assert restart < HELD_S, logs_of(run_dir)
    planned = save_to_first_step_s(run_dir, "restart")  # the cost of one planned restart
    assert planned < HELD_S, logs_of(run_dir)
    case = "test_preempted_job_saves_requeues_itself_and_resumes"
    report_fault(case, run_dir, save_to_first_step_s=restart, planned_restart_s=planned)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        # The venv's TensorFlow is tensorflow-cpu; the test cluster's fake GPUs are /dev/null,
        # which Slurm hands out as CUDA_VISIBLE_DEVICES=0 all the same.
        (
            ["resources.gpus_per_node=1"],
            r"Error: Slurm gave this task 1 GPU\(s\) \(GPUs 0\) but TensorFlow \S+ is a "
            r"CPU-only build \([^)]*\) and sees none: install hpctf\[gpu\] "
            r"\(tensorflow\[and-cuda\]\)",
        ),
        # One GPU per node for two tasks per node: both saw GPU 0 (as measured on Slurm 22.05:
        # CUDA_VISIBLE_DEVICES=0 and SLURM_STEP_GPUS=0 in both tasks, no SLURMD_TRES_BIND).
        (
            ["resources.nodes=1", "resources.tasks_per_node=2", "resources.gpus_per_node=1"],
            r"Error: 1 GPU visible on node1 \(CUDA_VISIBLE_DEVICES=0\) cannot be shared by 2 "
            r"tasks per node: .* ask for gpus_per_node equal to tasks_per_node",
        ),
    ],
    ids=["cpu-only-tensorflow", "one-gpu-two-tasks"],
)
def test_gpu_job_that_cannot_use_its_gpus_fails_at_once(
    slurm_cluster: dict[str, str], tmp_path: Path, sets: list[str], message: str
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    # 100,000 steps would train for many minutes: a job that ends within a minute never did.
    overrides = [arg for item in [*sets, "train.steps=100000"] for arg in ("--set", item)]
    job_id, run_dir = submit(env, str(DIGITS), "--site", "local-slurm", *overrides)
    info = wait_for_job(job_id, timeout=120)
    assert info["JobState"] == "FAILED", logs_of(run_dir)
    assert info["Restarts"] == "0"
    # Stopped before the first collective: no training, no checkpoint. Most of the time is two
    # `import tensorflow` side by side on 2 cores (20-30 s here).
    assert slurm_time_seconds(info["RunTime"]) < 60, info["RunTime"]
    ended, gave_up = RunDir(run_dir).events()[-2:]
    assert ended["event"] == "ended" and ended["exit_code"] != 0 and ended["reason"] == "failed"
    assert gave_up["event"] == "gave_up"  # no progress: not requeued
    assert not (run_dir / "metrics.jsonl").exists()
    assert not list((run_dir / "checkpoints").glob("ckpt-*"))
    ranks = [p.read_text() for p in sorted((run_dir / "logs").glob("rank-*.log"))]
    assert ranks, logs_of(run_dir)
    # srun --kill-on-bad-exit may end the other rank before it says anything; whoever speaks
    # says it in one line: the worker's own error, or (train.preflight: quick, the default) the
    # node check's, which names node, rank and check before the same words.
    node_check = re.compile(
        r"\d\d:\d\d:\d\d rank \d+: error: node check failed on node\d \(rank \d+\): \w+: "
    )
    lines = [
        "Error: " + node_check.sub("", line) if node_check.match(line) else line
        for text in ranks
        for line in text.splitlines()
        if line.startswith("Error: ") or node_check.match(line)
    ]
    assert lines, logs_of(run_dir)
    for line in lines:
        assert re.fullmatch(message + r".*", line), line
    assert not any(" step " in text for text in ranks), logs_of(run_dir)


# --- faults: how each kind of end is recorded and whether the run goes on --------------------


def test_an_entry_that_crashes_at_step_0_gives_up_without_a_requeue(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit_digits(
        env,
        "train.entry=entries:crash_at_start",
        f"train.python_path={json.dumps(ENTRIES_PATH)}",
    )
    info = wait_for_job(job_id)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", logs_of(run_dir)
    events = RunDir(run_dir).events()
    # The entry raised: the user's code, named as theirs (each rank that got to say it).
    number = line_of(REPO / "tests" / "entries.py", 'raise RuntimeError("a bug in the user')
    line = (
        f"your code raised RuntimeError at entries.py:{number} in crash_at_start: a bug in the "
        "user's entry"
    )
    raised = [e for e in events if e["event"] == "user_code_failed"]
    assert raised and all(e["line"] == line for e in raised), events
    events = [e for e in events if e["event"] != "user_code_failed"]
    assert [e["event"] for e in events] == ["created", "submitted", "started", "ended", "gave_up"]
    assert events[3]["reason"] == "failed" and events[3]["step"] == 0
    assert events[4]["why"] == f"{line}; not requeued: fix it and run hpctf resubmit"
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert status.stdout.startswith(f"run: gave_up ({line}; not requeued"), status.stdout
    assert f"from step 0: {line} (step 0, exit " in status.stdout, status.stdout
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("rank-*.log"))
    assert f"error: {line}" in logs and "bug in hpctf" not in logs, logs
    report_fault("test_an_entry_that_crashes_at_step_0_gives_up_without_a_requeue", run_dir)


@pytest.mark.both_slurms
def test_a_killed_rank_after_a_checkpoint_requeues_and_resumes(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL to one rank (an OOM kill): srun ends the step, the run had advanced, so the
    run is requeued within the failure budget and resumes from its last checkpoint: in the
    same allocation (its nodes are well), its new workers up seconds after the kill, where a
    Slurm requeue waits for the release and a scheduling pass (measured: 8-38 s). With
    checkpoint.every_seconds 5, at most 5 s of training is lost (plus a second of slack for a
    loaded machine); the seconds from the kill to the next first step are measured.

    Paced (30 ms asleep a step, about 30 steps a second): 600 steps last about 20 s, the kill
    comes about 8 s in, and the ranks leave the CPUs to the tests beside this one."""
    every = 5
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    steps = 600
    job_id, run_dir = submit_digits(
        env,
        *paced(0.03),
        f"train.steps={steps}",
        f"checkpoint.every_seconds={every}",
        "checkpoint.every_steps=null",  # the example's 100
        "checkpoint.keep=50",
    )
    deadline = time.monotonic() + 300
    rank1 = wait_for_log(run_dir / "logs" / "rank-1.log", "pid ", run_dir, deadline)
    pid = int(rank1.split(" pid ")[1].split()[0])
    while not checkpoint_steps(run_dir):
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    time.sleep(every * 0.6)  # between two saves
    os.kill(pid, signal.SIGKILL)  # the "nodes" share this machine's process table
    killed = time.time()
    rank0 = run_dir / "logs" / "rank-0.log"
    starts = re.compile(r"first step \d+ after ([0-9.]+) s.*$", re.M)
    while len(starts.findall(rank0.read_text())) < 2:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.05)
    back = time.time() - killed
    second = list(starts.finditer(rank0.read_text()))[-1]
    after = float(second.group(1))  # since the new worker's process started
    first = second.group(0)
    events = [(e["event"], e["time"]) for e in RunDir(run_dir).events()]
    restored = int(re.findall(r"resumed from \S+ at step (\d+)", rank0.read_text())[-1])
    # The training lost: from the restored step's save (its files written) to the kill.
    lost = killed - (run_dir / "checkpoints" / f"ckpt-{restored}.index").stat().st_mtime
    print(f"lost {lost:.2f} s (resumed at step {restored}); first step again {back:.1f} s "
          f"after the kill, the new worker up {back - after:.1f} s after it; its start: {first}; "
          f"journal: {events[-4:]}")  # fmt: skip
    assert lost <= every + 1.0, f"{lost:.2f} s of training lost"
    # Measured 1.6-2.1 s at load average 4-9 (the survivor leaves at once, job-end decides,
    # srun starts again); 10 s leaves room for a loaded machine, not for a Slurm requeue.
    assert back - after <= 10.0, f"the new worker started {back - after:.1f} s after the kill"
    while "requeued" not in [e["event"] for e in RunDir(run_dir).events()]:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    ends = [e for e in RunDir(run_dir).events() if e["event"] == "ended"]
    assert [e["reason"] for e in ends] == ["failed", "done"]
    requeues = [e for e in RunDir(run_dir).events() if e["event"] == "requeued"]
    assert [e.get("in_place") for e in requeues] == [True]  # no Slurm requeue
    starts = [e for e in RunDir(run_dir).events() if e["event"] == "started"]
    assert [e["restart_count"] for e in starts] == [0, 0]
    saved = int(ends[0]["step"])  # type: ignore[call-overload]
    assert saved == restored
    assert json.loads((run_dir / "DONE").read_text())["step"] == steps
    log = rank0.read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in log
    # The survivor blamed the environment and named the dead rank (unless srun, ending the
    # step, killed it first), never a bug in hpctf.
    assert "bug in hpctf" not in log
    if "stopped answering" in log:
        assert "Error: rank 1 (node2:" in log and "on node node2) stopped answering" in log
    report_fault(
        "test_a_killed_rank_after_a_checkpoint_requeues_and_resumes",
        run_dir,
        lost_s=round(lost, 2),
        kill_to_first_step_s=round(back, 1),
        new_worker_to_first_step_s=after,
    )


def test_scontrol_requeue_without_a_warning_resumes_from_the_last_checkpoint(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """Slurm requeues the job itself (as after a node failure): SIGTERM reaches the batch shell,
    whose trap records it, and the ranks, which save an agreed step; it resumes there."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir, _ = long_run(env, 100)
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True)
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    starts = [e for e in RunDir(run_dir).events() if e["event"] == "started"]
    assert len(starts) == 2 and int(starts[1]["step"]) >= 100  # type: ignore[call-overload]
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    # scontrol requeue signals the ranks too: they saved an agreed step, nothing was lost.
    assert status.stdout.startswith("run: done; requeues after preemption 1/20, after failures 0/3")
    assert "start 1: job" in status.stdout and ": preempted at step" in status.stdout
    assert "start 2: job" in status.stdout and f": done at step {LONG} (exit 0)" in status.stdout
    report_fault(
        "test_scontrol_requeue_without_a_warning_resumes_from_the_last_checkpoint", run_dir
    )


def test_a_higher_priority_job_preempts_the_run_which_saves_and_comes_back(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """A real preemption: a job in the `high` partition needs every CPU of both nodes. Slurm
    sends SIGTERM to the run's job (GraceTime 0, SIGKILL after KillWait 5 s) and requeues it;
    the ranks agree on a step, save it and exit 75 within KillWait; it resumes there."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir, deadline = long_run(env, 1000, wait_for_checkpoint=False)
    rank0 = run_dir / "logs" / "rank-0.log"
    wait_for_log(rank0, "step 100/", run_dir, deadline)
    high = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-N2",
            "--ntasks-per-node=2",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 3",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    while journal.SAVED_ON_WARNING not in [e["event"] for e in RunDir(run_dir).events()]:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)
    assert wait_for_job(high)["JobState"] == "COMPLETED"
    info = wait_for_job(job_id)
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    events = RunDir(run_dir).events()
    saved = next(int(e["step"]) for e in events if e["event"] == journal.SAVED_ON_WARNING)  # type: ignore[call-overload]
    assert next(e for e in events if e["event"] == journal.SAVED_ON_WARNING)["signal"] == "TERM"
    log = rank0.read_text()
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in log
    # No step trained twice: every logged step after the resume is past the saved one.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    resumed = steps[steps.index(max(s for s in steps if s <= saved)) + 1 :]
    assert resumed and resumed[0] > saved
    assert len(steps) == len(set(steps)), "a step was logged twice"
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert status.stdout.startswith("run: done; requeues after preemption 1/20"), status.stdout
    assert ": preempted at step " in status.stdout
    # Released by the batch shell's trap, not held ~120 s.
    restart = save_to_first_step_s(run_dir)
    assert restart < HELD_S, logs_of(run_dir)
    report_fault(
        "test_a_higher_priority_job_preempts_the_run_which_saves_and_comes_back",
        run_dir,
        save_to_first_step_s=restart,
    )
