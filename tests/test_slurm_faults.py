"""More of the fault matrix on the real Slurm test cluster (tests/slurm/cluster.sh): a preemption
with a grace time, walltime continuation at Slurm's one-minute minimum, a node set DOWN mid-run,
and a full disk at save time. Each writes its row with HPCTF_FAULT_REPORT=FILE, as the tests in
tests/test_slurm_e2e.py do; the README's fault matrix comes from these runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.history import RestartCause, read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from tests.conftest import (
    DIGITS,
    HPCTF,
    SLURM_VERSIONS,
    checkpoint_steps,
    losses,
    paced,
    pointed_at,
    require_tool,
    submitted,
    wait_for_job,
)
from tests.slurm_jobs import (
    LONG,
    logs_of,
    report_fault,
    submit_digits,
    wait_for_first_checkpoint,
    wait_for_log,
)

pytestmark = [pytest.mark.slurm, pytest.mark.tf]
# A job in the `high` partition that needs every CPU of both nodes: it preempts a debug job.
HIGH_JOB = ["sbatch", "--parsable", "-p", "high", "-N2", "--ntasks-per-node=2", "-o", "/dev/null"]
HIGH_JOB += ["--wrap", "sleep 3"]


def scontrol(env: dict[str, str], *args: str) -> None:
    subprocess.run(["scontrol", *args], env=env, check=True, capture_output=True, text=True)


def wait_for_event(run_dir: Path, event: str, deadline: float, count: int = 1) -> None:
    while sum(e["event"] == event for e in RunDir(run_dir).events()) < count:
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.2)


def resumes(run_dir: Path) -> list[tuple[int, int]]:
    """For each resume in rank 0's log: (the highest step logged before it, the step it resumed
    at). Steps trained twice are at least the first minus the second, at the log's resolution
    (train.log_every_steps)."""
    pairs, high = [], 0
    for line in (run_dir / "logs" / "rank-0.log").read_text().splitlines():
        if match := re.search(r" step (\d+)/\d+ loss", line):
            high = max(high, int(match.group(1)))
        elif match := re.search(r"resumed from \S+ at step (\d+)", line):
            pairs.append((high, int(match.group(1))))
    return pairs


def seconds_between(run_dir: Path, first: str, then: str, after: int = 0) -> int:
    """Seconds (journal resolution: 1 s) from the first ``first`` event to the next ``then``
    event after it; ``after`` skips that many ``first`` events."""
    events = RunDir(run_dir).events()
    start = [i for i, e in enumerate(events) if e["event"] == first][after]
    end = next(i for i, e in enumerate(events) if i > start and e["event"] == then)
    stamp = [_stamp(str(events[i]["time"])) for i in (start, end)]
    return int(stamp[1] - stamp[0])


def _stamp(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


# --- a preemption with GraceTime 60 ----------------------------------------------------------


def test_a_preemption_with_a_grace_time_saves_and_is_requeued_by_hpctf(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """GraceTime 60 on the preempted partition: Slurm sends SIGTERM to the job steps only and
    waits up to 60 s before it kills and requeues the job. The ranks save an agreed step at
    once and exit 75; the batch shell lives on, so job-end records the end and requeues the
    job itself (a warned end: the preemption budget), and the higher-priority job starts."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    scontrol(env, "update", "PartitionName=debug", "GraceTime=60")
    try:
        job_id, run_dir = submit_digits(
            env,
            f"train.steps={LONG}",
            "checkpoint.every_steps=1000",
            "train.log_every_steps=10",
        )
        deadline = time.monotonic() + 300
        wait_for_log(run_dir / "logs" / "rank-0.log", "step 100/", run_dir, deadline)
        high = subprocess.run(
            HIGH_JOB,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        preempted_at = time.monotonic()
        wait_for_event(run_dir, "requeued", deadline)
        requeued_after = time.monotonic() - preempted_at
        assert wait_for_job(high)["JobState"] == "COMPLETED"
        info = wait_for_job(job_id)
    finally:
        scontrol(env, "update", "PartitionName=debug", "GraceTime=0")
    assert info["JobState"] == "COMPLETED", logs_of(run_dir)
    # The grace time was not used up: hpctf requeued the job long before Slurm would kill it.
    assert requeued_after < 30, requeued_after
    events = [e for e in RunDir(run_dir).events() if e["event"] != "signalled"]
    kinds = [e["event"] for e in events]
    assert kinds == [
        "created",
        "submitted",
        "started",
        journal.SAVED_ON_WARNING,
        "ended",
        "requeued",
        "released",  # Slurm's hold on the requeued job, cut short by job-end
        "started",
        "ended",
    ], kinds
    saved = int(events[3]["step"])  # type: ignore[call-overload]
    assert events[3]["signal"] == "TERM" and events[4]["reason"] == "preempted"
    assert int(events[7]["step"]) == saved  # type: ignore[call-overload]
    ((high_step, resumed),) = resumes(run_dir)
    assert resumed == saved and high_step <= saved  # no step trained twice
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steps = [r["step"] for r in records if "loss" in r]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    report_fault(
        "test_a_preemption_with_a_grace_time_saves_and_is_requeued_by_hpctf",
        run_dir,
        requeued_after_s=round(requeued_after, 1),
    )


# --- walltime continuation at Slurm's one-minute minimum -------------------------------------


def test_one_minute_jobs_continue_the_run_across_three_starts_on_both_slurms(
    slurm2205_cluster: dict[str, str], slurm2411_cluster: dict[str, str], tmp_path: Path
) -> None:
    """``time: 1`` (Slurm's minimum) with ``--signal=USR2@15``: Slurm checks time limits every
    30 s and sends the warning up to that much early (PERIODIC_TIMEOUT in slurmctld), so each
    start gets it 15 to 45 s after it began. The ranks save an agreed step, job-end requeues,
    and the next start resumes there: three starts, no step trained twice.

    On Slurm 22.05 and 24.11 at once (#45 asks for the walltime chain on both): each chain
    mostly waits for its scheduler, a start a minute, so the two overlap; one after the other
    they held a test worker for three and a half minutes. Each step sleeps 50 ms
    (tests.conftest.paced): the starts last as long as Slurm lets them whatever the step time,
    and a sleeping step leaves the test machine's CPUs to the other tests."""
    clusters = dict(zip(SLURM_VERSIONS, (slurm2205_cluster, slurm2411_cluster), strict=True))
    chains = {}
    try:
        for version, cluster in clusters.items():
            chains[version] = _start_one_minute_chain(cluster, tmp_path / version)
        deadline = time.monotonic() + 400
        for version, (job_id, run_dir) in chains.items():
            with pointed_at(clusters[version]):
                _check_one_minute_chain(clusters[version], job_id, run_dir, deadline)
    finally:  # a chain left behind by a failure would go on starting every minute
        for version, (job_id, _) in chains.items():
            subprocess.run(["scancel", job_id], env=clusters[version], check=False)


def _start_one_minute_chain(cluster: dict[str, str], where: Path) -> tuple[str, Path]:
    site = where / "one-minute.yaml"
    site.parent.mkdir(parents=True)
    site.write_text("name: one-minute\nextends: local-slurm\npreemption:\n  warning_seconds: 15\n")
    env = {**cluster, "HPCTF_RUNS_ROOT": str(where / "runs")}
    return submit_digits(
        env,
        "resources.time=1",
        *paced(),
        "train.steps=1000000",
        "checkpoint.every_steps=100000",
        "train.log_every_steps=10",
        site=str(site),
    )


def _check_one_minute_chain(
    cluster: dict[str, str], job_id: str, run_dir: Path, deadline: float
) -> None:
    """Three starts of ``job_id``, the first two ended by the walltime warning; then cancelled.
    Inside :func:`tests.conftest.pointed_at` its cluster."""
    for requeue in (1, 2):
        wait_for_event(run_dir, "requeued", deadline, count=requeue)
    wait_for_event(run_dir, "started", deadline, count=3)
    third = int([e for e in RunDir(run_dir).events() if e["event"] == "started"][2]["step"])  # type: ignore[call-overload]
    rank0 = run_dir / "logs" / "rank-0.log"
    while max(losses(run_dir), default=0) <= third:  # until the third start trains on
        assert time.monotonic() < deadline, logs_of(run_dir)
        time.sleep(0.5)
    env = {**cluster, "HPCTF_RUNS_ROOT": str(run_dir.parent)}
    subprocess.run([*HPCTF, "cancel", str(run_dir)], env=env, check=True, capture_output=True)
    wait_for_job(job_id)
    events = RunDir(run_dir).events()
    ends = [e for e in events if e["event"] == "ended"]
    assert [e["reason"] for e in ends[:2]] == ["timeout", "timeout"], logs_of(run_dir)
    saves = [e for e in events if e["event"] == journal.SAVED_ON_WARNING]
    assert [e["signal"] for e in saves[:2]] == ["USR2", "USR2"]
    starts = [int(e["step"]) for e in events if e["event"] == "started"]  # type: ignore[call-overload]
    assert starts[:3] == [0, saves[0]["step"], saves[1]["step"]]
    assert 0 < starts[1] < starts[2]
    assert all(high <= at for high, at in resumes(run_dir)), resumes(run_dir)
    assert "warning: got SIGUSR2" in rank0.read_text()
    info = slurm.job_info(job_id) or {}
    assert info.get("TimeLimit") == "00:01:00", info
    report_fault(
        "test_one_minute_jobs_continue_the_run_across_three_starts",
        run_dir,
        run_seconds=[seconds_between(run_dir, "started", "ended", after=i) for i in (0, 1)],
    )


# --- a node set DOWN mid-run -----------------------------------------------------------------


def test_a_node_set_down_mid_run_is_left_out_of_the_next_start(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """A one-node run on the two-node cluster; its node goes DOWN. Slurm kills and requeues the
    job; the batch shell's trap finds the node down, records it, and sets the pending job's
    ExcNodeList. The node then comes back, and the next start still runs on the other node.

    The node is drained first, then set DOWN: on this cluster every node's slurmd lives on, and
    with ReturnToService=2 a DOWN node that answers is back in service within a second
    (measured); a node that really failed stays out, as the drained one does here.
    """
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    job_id, run_dir = submit_digits(
        env,
        "resources.nodes=1",
        f"train.steps={LONG}",
        "checkpoint.every_steps=100",
        "train.log_every_steps=10",
    )
    deadline = time.monotonic() + 300
    wait_for_first_checkpoint(run_dir)
    node = (slurm.job_info(job_id) or {})["NodeList"]
    other = {"node1": "node2", "node2": "node1"}[node]
    try:
        scontrol(env, "update", f"NodeName={node}", "State=DRAIN", "Reason=hpctf-test")
        scontrol(env, "update", f"NodeName={node}", "State=DOWN", "Reason=hpctf-test")
        down_at = time.monotonic()
        wait_for_event(run_dir, "excluded", deadline)
        assert (slurm.job_info(job_id) or {}).get("ExcNodeList") == node
        # Back in service: from here only the job's ExcNodeList keeps it off the node.
        scontrol(env, "update", f"NodeName={node}", "State=RESUME")
        restarted_after = time.monotonic() - down_at
        info = wait_for_job(job_id)
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
            env=env,
            check=False,
            capture_output=True,
        )
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", logs_of(run_dir)
    assert info["NodeList"] == other
    events = RunDir(run_dir).events()
    failed = [e for e in events if e["event"] == journal.NODES_DOWN]
    assert [(f["job_id"], f["nodes"]) for f in failed] == [(job_id, [node])]
    starts = [e for e in events if e["event"] == "started"]
    assert [s["nodes"] for s in starts] == [node, other]
    checkpoint = int(starts[1]["step"])  # type: ignore[call-overload]
    ((high, resumed),) = resumes(run_dir)
    assert resumed == checkpoint >= 100
    assert high - resumed <= 100  # at most checkpoint.every_steps trained twice
    assert json.loads((run_dir / "DONE").read_text())["step"] == LONG
    status = subprocess.run(
        [*HPCTF, "status", str(run_dir)], env=env, capture_output=True, text=True, check=True
    )
    assert status.stdout.startswith("run: done"), status.stdout
    report_fault(
        "test_a_node_set_down_mid_run_is_left_out_of_the_next_start",
        run_dir,
        restarted_after_s=round(restarted_after, 1),
        trained_twice=high - resumed,
    )


# --- a full disk at save time ----------------------------------------------------------------


@contextmanager
def small_filesystem(path: Path, state: Path, megabytes: int = 16) -> Iterator[Path]:
    """An ext4 filesystem of ``megabytes`` on a loop device, mounted at ``path`` here and in
    every node's mount namespace (cluster.sh starts each slurmd in its own, private one, so a
    mount made here later is not seen by the jobs): one filesystem all nodes share, like a
    parallel filesystem. No blocks reserved for root: the jobs run as root."""
    for tool in ("losetup", "mkfs.ext4", "nsenter", "mount", "umount"):
        require_tool(tool)
    image = path.with_suffix(".img")
    with image.open("wb") as handle:
        handle.truncate(megabytes << 20)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", str(image)], check=True, capture_output=True)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    path.mkdir()
    namespaces = [["nsenter", f"--target={pid}", "--mount", "--"] for pid in _slurmd_pids(state)]
    mounted: list[list[str]] = []
    try:
        for prefix in [[], *namespaces]:
            subprocess.run([*prefix, "mount", device, str(path)], check=True, capture_output=True)
            mounted.append(prefix)
        yield path
    finally:
        for prefix in reversed(mounted):
            subprocess.run([*prefix, "umount", str(path)], check=False, capture_output=True)
        subprocess.run(["losetup", "--detach", device], check=False, capture_output=True)
        image.unlink()


def _slurmd_pids(state: Path) -> list[int]:
    return [int(p.read_text().strip()) for p in sorted((state / "run").glob("slurmd-*.pid"))]


def test_a_full_disk_at_save_time_keeps_the_last_checkpoint_and_resumes_after_a_resubmit(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """runs_root on a 16 MB filesystem. After the checkpoint of step 1000 the disk fills up
    (another user's file) until half a checkpoint fits. The save of step 2000 fails: the chief
    says so in one line (the environment's fault, exit 3) and records it; the checkpoint of
    step 1000 stays the latest, nothing of step 2000 is left, the end is recorded and the run
    gives up rather than requeue into the same full disk. Freed, ``hpctf resubmit`` resumes at
    step 1000 and completes."""
    state = Path(slurm_cluster["HPCTF_SLURM_DIR"])
    with small_filesystem(tmp_path / "small", state) as root:
        env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(root)}
        job_id, run_dir = submit_digits(
            env,
            "train.steps=3000",
            "checkpoint.every_steps=1000",
        )
        wait_for_first_checkpoint(run_dir)
        size = sum(p.stat().st_size for p in (run_dir / "checkpoints").glob("ckpt-1000.*"))
        free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
        filler = root / "someone-elses-file"
        filler.write_bytes(b"\0" * (free - size // 2))
        filled_at = time.monotonic()
        info = wait_for_job(job_id)
        failed_after = time.monotonic() - filled_at
        assert info["JobState"] == "FAILED" and info["Restarts"] == "0", logs_of(run_dir)
        events = RunDir(run_dir).events()
        # The other rank may see the chief go and record a lost peer: the environment's
        # record decides the start's cause all the same.
        events = [e for e in events if e["event"] != "peer_lost"]
        kinds = [e["event"] for e in events]
        assert kinds[-3:] == ["environment_failed", "ended", "gave_up"], (kinds, logs_of(run_dir))
        start = read_history(RunDir(run_dir)).state.starts[-1]
        assert start.cause is RestartCause.ENVIRONMENT, start
        ended = events[-2]
        assert ended["reason"] == "failed" and ended["step"] == 1000, ended
        assert "No space left on device" in str(events[-1]["why"])
        # The newest checkpoint is the complete one of step 1000; nothing of step 2000 is left.
        assert checkpoint_steps(run_dir) == [1000]
        assert not list((run_dir / "checkpoints").glob("ckpt-2000*"))
        rank0 = (run_dir / "logs" / "rank-0.log").read_text()
        said = [line for line in rank0.splitlines() if line.startswith("Error: ")]
        assert said == [
            f"Error: cannot save the checkpoint of step 2000 in {run_dir}/checkpoints: No space "
            f"left on device; the checkpoint of step 1000 is kept: free space there, then "
            f"hpctf resubmit {run_dir}"
        ], rank0[-2000:]
        assert "Traceback" not in rank0
        out = (run_dir / "logs" / f"slurm-{job_id}.out").read_text()
        (gave_up,) = [line for line in out.splitlines() if " not requeued: " in line]
        assert gave_up.count("hpctf resubmit") == 1, gave_up  # the fix, said once

        filler.unlink()
        proc = subprocess.run(
            [*HPCTF, "resubmit", str(run_dir)], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        second, _ = submitted(proc.stdout)
        resubmitted_at = time.monotonic()
        assert second and wait_for_job(second)["JobState"] == "COMPLETED", logs_of(run_dir)
        completed_after = time.monotonic() - resubmitted_at
        rank0 = (run_dir / "logs" / "rank-0.log").read_text()
        assert f"resumed from {run_dir}/checkpoints/ckpt-1000 at step 1000" in rank0
        assert json.loads((run_dir / "DONE").read_text())["step"] == 3000
        report_fault(
            "test_a_full_disk_at_save_time_keeps_the_last_checkpoint_and_resumes_after_a_resubmit",
            run_dir,
            failed_after_s=round(failed_after, 1),
            resubmit_to_done_s=round(completed_after, 1),
        )


def test_a_submit_killed_while_sbatch_ran_leaves_no_job_hpctf_cannot_find(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """sbatch took the job, then the submit was SIGKILLed before its journal heard of it (a
    busy controller answers in seconds). The job's comment names the run: status says so,
    resubmit records it and refuses a second job beside it, cancel stops it."""
    real = require_tool("sbatch")
    shim = tmp_path / "bin" / "sbatch"
    shim.parent.mkdir()
    # The real sbatch, then the submit (its parent) killed before it reads the job id.
    shim.write_text(f'#!/bin/sh\nout=$({real} "$@") || exit 1\nkill -KILL $PPID\necho "$out"\n')
    shim.chmod(0o755)
    env = {**slurm_cluster, "PATH": f"{shim.parent}:{slurm_cluster['PATH']}"}
    env["HPCTF_RUNS_ROOT"] = str(tmp_path / "runs")
    held = ["--set", "resources.extra_sbatch=[--hold]"]  # pending for as long as the test
    killed = subprocess.run(
        [*HPCTF, "submit", str(DIGITS), "--site", "local-slurm", *held],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stdout + killed.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "submitted" not in [e["event"] for e in RunDir(run_dir).events()]
    env["PATH"] = slurm_cluster["PATH"]

    def hpctf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*HPCTF, *args, str(run_dir)], env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip

    status = hpctf("status")
    (job,) = re.findall(r"note: Slurm holds job (\d+) of this run", status.stdout)
    assert slurm.job_info(job, env)["JobState"] == "PENDING"  # type: ignore[index]
    again = hpctf("resubmit")
    assert again.returncode == 2, again.stdout + again.stderr
    assert (
        f"job {job} of {run_dir} was in Slurm's queue but not in the run's journal" in again.stderr
    )
    assert f"job {job} of {run_dir} is still PENDING" in again.stderr
    assert [e["job_id"] for e in RunDir(run_dir).events() if e["event"] == "submitted"] == [job]
    stopped = hpctf("cancel")
    assert stopped.returncode == 0 and stopped.stdout == f"cancelled: {job}\n", stopped.stderr
    deadline = time.monotonic() + 60
    while (slurm.job_info(job, env) or {}).get("JobState") not in (None, "CANCELLED"):
        assert time.monotonic() < deadline, slurm.job_info(job, env)
        time.sleep(0.3)
