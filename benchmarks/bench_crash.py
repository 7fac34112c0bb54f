"""The crash section: a rank SIGKILLed on the real Slurm test cluster (tests/slurm/cluster.sh,
started by benchmarks/slurm_cluster.py), with ``checkpoint.every_seconds``: seconds from the
kill to the next first step, each phase between them from Slurm's logs, the batch script's
output and the new worker's own startup clock, and the training lost (seconds and steps).
Twice in one run of the section: with ``train.warm_standby: false`` (the baseline: the new
workers import TensorFlow) and with the warm standby (hpctf.compute.start.standby), each kill
once both slots' standbys are ready.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import bench_takeovers
from harness import DIGITS, REPO, BenchError, Harness, median, metrics, say, tail, wait_until
from slurm_cluster import SlurmCluster, slurm_cluster, slurm_missing

from hpctf.core.run.rundir import RunDir

EVERY_S = 5  # checkpoint.every_seconds
GOAL_BACK_S = 10.0  # without a standby (the baseline's row)
GOAL_STANDBY_S = 3.0
# The events of a crash and what follows, as Slurm's daemons log them (slurmd-nodeN.log,
# slurmctld.log: "[2026-12-02T14:20:02.289] ...") or hpctf writes them: the first of each
# after the kill. The phases are the spans between consecutive events that happened.
SLURM_EVENTS = (
    ("srun signals the step", re.compile(r"\*\*\* STEP \d+\.\d+ ON \S+ CANCELLED AT")),
    ("job-end requeues the job", re.compile(r"CANCELLED AT \S+ DUE TO JOB REQUEUE")),
    ("job-end releases it", re.compile(r"_update_job: setting begin to")),
    ("the requeue completes", re.compile(r"Requeuing JobId=")),
    ("Slurm starts the job", re.compile(r"sched: Allocate JobId=|backfill: Started JobId=")),
    ("the batch shell starts", re.compile(r"Launching batch job")),
    ("srun launches the step", re.compile(r"launch task StepId=")),
)
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)\] (.*)$", re.M)
RELAUNCHED = re.compile(r"again in this allocation\) on \S+ at (\S+) =====")
FIRST_STEP = re.compile(r"rank 0: first step (\d+) after ([0-9.]+) s \([^)]*\): (.*)$", re.M)
RESUMED = re.compile(r"rank 0: resumed from \S+ at step (\d+)")
PID = re.compile(r"rank 1: host \S+ pid (\d+) ")
READY = re.compile(r"standby \d+ ready")


class CrashBench(Harness):
    """One section's measurements, over the shared harness."""

    def crash(self) -> dict[str, Any]:
        missing = slurm_missing()
        if missing:
            goal = f"<= {GOAL_BACK_S:.0f} s back, lost <= every_seconds"
            return self.skipped(missing, [("crash: SIGKILL of a rank, real Slurm (skipped)", goal)])
        work = self.folder("crash")
        with slurm_cluster("crash") as cluster:
            baseline = self._crashes(work / "baseline", cluster, standby=False)
            result = self._crashes(work / "standby", cluster, standby=True)
        ratio = result["kill_to_first_step_median_s"] / baseline["kill_to_first_step_median_s"]
        return {**result, "baseline": baseline, "ratio_to_baseline": round(ratio, 3)}

    def _crashes(self, work: Path, cluster: SlurmCluster, standby: bool) -> dict[str, Any]:
        work.mkdir(parents=True, exist_ok=True)
        runs = work / "runs"
        env = {**cluster.env, "HPCTF_RUNS_ROOT": str(runs), "CUDA_VISIBLE_DEVICES": ""}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        rounds_wanted = self.sizes.takeover_rounds if standby else self.sizes.crash_rounds
        site = "local-slurm"
        if standby:  # every takeover is a crash restart: a failure budget to fit them all
            site = str(work / "local-slurm-takeovers.yaml")
            text = (REPO / "site_configs" / "local-slurm.yaml").read_text()
            name = "name: local-slurm-takeovers"
            Path(site).write_text(
                text.replace("name: local-slurm", name)
                + f"preemption:\n  max_failure_requeues: {rounds_wanted + 2}\n"
            )
        argv = [*self.hpctf, "submit", str(DIGITS), "--site", site]
        for setting in (
            "train.steps=10000000",
            "train.log_every_steps=1",  # the step trained at the kill, exactly
            f"checkpoint.every_seconds={EVERY_S}",
            "checkpoint.every_steps=null",
            "checkpoint.keep=100",
            f"train.warm_standby={str(standby).lower()}",
        ):
            argv += ["--set", setting]
        argv += self.paced()
        job_id, run_dir = self.submitted_job(argv, env, work)
        rounds = []
        try:
            for number in range(rounds_wanted):
                rounds.append(self._crash_once(cluster, job_id, run_dir, number, standby))
                last = rounds[-1]
                mode = " (standby)" if standby else ""
                say(
                    f"crash {number + 1}{mode}: first step again "
                    f"{last['kill_to_first_step_s']:.1f} s after the kill; "
                    f"lost {last['lost_s']:.2f} s, {last['lost_steps']} steps; "
                    + ", ".join(f"{k} {v:.2f}" for k, v in last["phases_s"].items())
                )
            if standby:  # the last takeover's start, as sampled before each kill
                final = self._holdings(run_dir, len(rounds))
        finally:
            subprocess.run(["scancel", job_id], env=env, capture_output=True, check=False)
        back = median([r["kill_to_first_step_s"] for r in rounds])
        lost = max(r["lost_s"] for r in rounds)
        goal = GOAL_STANDBY_S if standby else GOAL_BACK_S
        met = back <= goal and lost <= EVERY_S
        how = "a warm standby takes over" if standby else "no standby: the baseline"
        self.row(
            benchmark=f"crash: SIGKILL of rank 1 of 2, real Slurm, every_seconds {EVERY_S}, {how}",
            hpctf=f"first step again {back:.1f} s after the kill (rounds "
            + ", ".join(f"{r['kill_to_first_step_s']:.1f}" for r in rounds)
            + f"); lost {lost:.2f} s at most ("
            + ", ".join(f"{r['lost_steps']}" for r in rounds)
            + " steps)",
            baseline=f"every_seconds {EVERY_S}" + ("; the row above" if standby else ""),
            result=f"{back:.1f} s, {lost:.2f} s lost",
            goal=f"<= {goal:.0f} s, <= {EVERY_S} s lost",
            met=met,
        )
        if standby:
            soak = bench_takeovers.verdict([*(r.pop("holdings") for r in rounds), final])
            self.row(
                benchmark=f"crash: soak of {len(rounds)} warm-standby takeovers in one job",
                hpctf=bench_takeovers.summary(soak),
                baseline="the first taken-over start",
                result={True: "flat", False: "GROWS", None: "-"}[soak["flat"]],
                goal="flat",
                met=soak["flat"],
            )
        return {
            "every_seconds": EVERY_S,
            "warm_standby": standby,
            **({"takeover_soak": soak} if standby else {}),
            "rounds": rounds,
            "kill_to_first_step_median_s": round(back, 2),
            "lost_max_s": round(lost, 2),
            "goal_back_s": goal,
            "met": met,
        }

    def _crash_once(
        self, cluster: SlurmCluster, job_id: str, run_dir: Path, number: int, standby: bool
    ) -> dict[str, Any]:
        """Kill rank 1 of the start running now, between two saves; the kill's aftermath."""
        rank0, rank1 = (run_dir / "logs" / f"rank-{rank}.log" for rank in (0, 1))

        def text(path: Path) -> str:
            return path.read_text(errors="replace") if path.exists() else ""

        def trained_and_saved() -> bool:
            if "gave_up" in {event["event"] for event in RunDir(run_dir).events()}:
                raise BenchError(
                    f"crash: the run gave up before crash {number + 1}:\n"
                    f"{tail(run_dir / 'logs' / f'slurm-{job_id}.out')}\n{tail(rank0)}"
                )
            started = len(FIRST_STEP.findall(text(rank0))) > number
            return started and bool(newest_checkpoint(run_dir, after=self._resumed(rank0)))

        wait_until(trained_and_saved, 300, f"a checkpoint of start {number + 1}", poll=0.1)
        if standby:
            wait_for_standbys(run_dir, number)
        saved = newest_checkpoint(run_dir)
        saved_at = (run_dir / "checkpoints" / f"ckpt-{saved}.index").stat().st_mtime
        if time.time() - saved_at > EVERY_S * 0.4:  # too late for this one: the next save
            wait_until(lambda: newest_checkpoint(run_dir) != saved, 60, "the next save", poll=0.05)
            saved_at = time.time()
        time.sleep(max(0.0, saved_at + EVERY_S * 0.6 - time.time()))  # between two saves
        (pid,) = PID.findall(text(rank1))[-1:] or [""]
        if not pid:
            raise BenchError(f"crash: no pid of rank 1:\n{tail(rank1)}")
        holdings = bench_takeovers.sample(run_dir, int(pid)) if standby else None
        os.kill(int(pid), signal.SIGKILL)  # the test cluster's "nodes" share this process table
        killed = time.time()
        trained = max((r["step"] for r in metrics(run_dir) if "loss" in r), default=0)

        def back() -> bool:
            return len(FIRST_STEP.findall(text(rank0))) > number + 1

        wait_until(back, 300, f"the first step after crash {number + 1}", poll=0.02)
        seen = time.time()
        first = list(FIRST_STEP.finditer(text(rank0)))[-1]
        restored = self._resumed(rank0)
        index = run_dir / "checkpoints" / f"ckpt-{restored}.index"
        if not index.exists():
            raise BenchError(f"crash: resumed from step {restored}, not on disk:\n{tail(rank0)}")
        worker_up = seen - float(first.group(2))
        events = slurm_events(cluster, killed)
        out = text(run_dir / "logs" / f"slurm-{job_id}.out")
        relaunches = [stamp(m) for m in RELAUNCHED.findall(out)]
        relaunches = [t for t in relaunches if t >= killed]
        if relaunches:
            events["job-end starts the workers again"] = relaunches[0]
        events["the new worker process starts"] = worker_up
        events["its first step"] = seen
        order = sorted(events.items(), key=lambda item: item[1])
        phases, before = {}, ("the kill", killed)
        for name, at in order:
            phases[f"{before[0]} -> {name}"] = round(at - before[1], 3)
            before = (name, at)
        return {
            "kill_to_first_step_s": round(seen - killed, 2),
            "lost_s": round(killed - index.stat().st_mtime, 2),
            "lost_steps": trained - restored,
            "trained_at_kill": trained,
            "restored_step": restored,
            "phases_s": phases,
            "worker_phases": first.group(3),
            **({"holdings": holdings} if standby else {}),
        }

    @staticmethod
    def _holdings(run_dir: Path, number: int) -> dict[str, Any]:
        """What the run's processes hold once start ``number`` (0: the first) has trained and
        both standbys are ready again."""
        wait_for_standbys(run_dir, number)
        rank1 = (run_dir / "logs" / "rank-1.log").read_text(errors="replace")
        return bench_takeovers.sample(run_dir, int(PID.findall(rank1)[-1]))

    @staticmethod
    def _resumed(rank0: Path) -> int:
        found = RESUMED.findall(rank0.read_text(errors="replace")) if rank0.exists() else []
        return int(found[-1]) if found else 0


def wait_for_standbys(run_dir: Path, number: int) -> None:
    """Until both slots' standbys are ready for crash ``number`` (0: the first): each crash
    consumes one per slot."""

    def ready() -> bool:
        logs = [run_dir / "logs" / f"standby-{rank}.log" for rank in (0, 1)]
        found = [
            READY.findall(log.read_text(errors="replace")) if log.exists() else [] for log in logs
        ]
        return all(len(lines) > number for lines in found)

    wait_until(ready, 300, f"the standbys before crash {number + 1}", poll=0.2)


def newest_checkpoint(run_dir: Path, after: int = -1) -> int | None:
    steps = [
        int(p.name.split("-")[1].split(".")[0])
        for p in (run_dir / "checkpoints").glob("ckpt-*.index")
    ]
    newest = max(steps, default=None)
    return newest if newest is not None and newest > after else None


def stamp(text: str) -> float:
    """Seconds since the epoch of an ISO time; one without a zone is local (Slurm's logs)."""
    return datetime.fromisoformat(text).timestamp()


def slurm_events(cluster: SlurmCluster, since: float) -> dict[str, float]:
    """The first time after ``since`` that each of SLURM_EVENTS shows in the cluster's logs."""
    found: dict[str, float] = {}
    for log in sorted((cluster.dir / "log").glob("slurm*.log")):
        for match in STAMP.finditer(log.read_text(errors="replace")):
            at = stamp(match.group(1))
            if at < since:
                continue
            for name, pattern in SLURM_EVENTS:
                if pattern.search(match.group(2)) and at < found.get(name, float("inf")):
                    found[name] = at
    return found
