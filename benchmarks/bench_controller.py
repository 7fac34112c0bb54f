"""The controller section (#45, item 3): the RPCs hpctf sends to slurmctld, counted by
``sdiag`` ("Remote Procedure Call statistics by message type" and "by user") before and after
each case, on the real Slurm test cluster (benchmarks/slurm_cluster.py, no accounting: sacct
talks to slurmdbd, never to slurmctld). sdiag's own REQUEST_STATS_INFO is left out; the
types Slurm's daemons and job steps send for any job (:data:`SLURMS_OWN`: slurmd's
registrations, srun's step, the batch script's completion) are counted apart from those of
commands (squeue, sbatch, scontrol: hpctf's).

Cases: one run from submit to DONE with one requeue (`train.restart_every_steps`); `hpctf
sweep` of 1,000 points (held: nothing trains); `hpctf status SWEEP` over those 1,000 points,
all pending in Slurm; a search (TPE + ASHA, 16 trials, 4 agents: the 64 trials and 8 agents
of the issue scaled down, their extrapolation stated); and watchers of 100 pending runs over a
window: `hpctf logs -f` (one process each), `Run.wait` (one thread each) and `Sweep.wait`.

The goal, "<= 1 RPC/s for 1,000 active runs", is read so: a watcher's rate per watched run
times 1,000; a one-time cost (a submit, a run's whole life, a status call) spread over a run
hour (:data:`RUN_HOUR_BUDGET`: 3.6 RPCs a run, 1,000 runs of an hour each at 1 RPC/s); a
`status` call taken every 10 s (a `watch` loop), whatever the number of runs it shows.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import DIGITS, REPO, TINY, BenchError, Harness, say, stop, tail, wait_until
from slurm_cluster import slurm_cluster, slurm_missing, slurm_required

from hpctf.core.run.rundir import RunDir

GOAL = "<= 1 RPC/s for 1,000 active runs"
# One squeue's RPCs (REQUEST_JOB_INFO or _SINGLE, REQUEST_FED_INFO, REQUEST_PARTITION_INFO), and
# how often the watchers of one user may ask it (hpctf.login.reading.slurm_view.WATCH_SHARE_S).
SQUEUE_RPCS = 3
SHARE_S = 30.0
ACTIVE = 1000
RUN_HOUR_BUDGET = 3600 * 1.0 / ACTIVE  # RPCs a run may cost once, spread over an hour
STATUS_EVERY_S = 10.0  # a status loop (`watch -n 10 hpctf status SWEEP`)
SDIAG_OWN = "REQUEST_STATS_INFO"  # sdiag's own call: never counted
# What slurmd, srun and the job's steps send for any batch job (not a command's poll).
SLURMS_OWN = frozenset({
    "MESSAGE_NODE_REGISTRATION_STATUS", "MESSAGE_EPILOG_COMPLETE", "REQUEST_COMPLETE_PROLOG",
    "REQUEST_HET_JOB_ALLOC_INFO", "REQUEST_JOB_ALLOCATION_INFO", "REQUEST_JOB_STEP_CREATE",
    "REQUEST_STEP_COMPLETE", "REQUEST_COMPLETE_BATCH_SCRIPT", "REQUEST_COMPLETE_JOB_ALLOCATION",
    "REQUEST_STEP_LAYOUT", "REQUEST_JOB_SBCAST_CRED", "REQUEST_UPDATE_JOB_STEP",
    "MESSAGE_TASK_EXIT", "REQUEST_JOB_READY", "REQUEST_CANCEL_JOB_STEP",
})  # fmt: skip

_TYPE_LINE = re.compile(r"^\s*(\w+)\s+\(\s*(\d+)\)\s+count:(\d+)\s")
_JOB_LINE = re.compile(
    r"^Jobs (submitted|started|completed|canceled|failed|pending|running):\s+(\d+)"
)


@dataclass(frozen=True)
class Sdiag:
    """What one ``sdiag`` says: RPC counts by message type and by user, and its job counters."""

    types: dict[str, int] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)


def parse_sdiag(text: str) -> Sdiag:
    """``sdiag``'s text (Slurm 22.05; its layout has been the same since 17.x): the two RPC
    tables (each line ``NAME ( ID) count:N ave_time:.. total_time:..``) and the job counters."""
    types: dict[str, int] = {}
    users: dict[str, int] = {}
    jobs: dict[str, int] = {}
    table: dict[str, int] | None = None
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            table = types
            continue
        if line.startswith("Remote Procedure Call statistics by user"):
            table = users
            continue
        if line and not line[0].isspace():  # the next heading ("Pending RPC statistics")
            table = None
        found = _JOB_LINE.match(line)
        if found:
            jobs[found.group(1)] = int(found.group(2))
        found = _TYPE_LINE.match(line)
        if table is not None and found:
            table[found.group(1)] = table.get(found.group(1), 0) + int(found.group(3))
    return Sdiag(types, users, jobs)


def rpc_delta(before: Sdiag, after: Sdiag) -> dict[str, int]:
    """RPCs by message type between two sdiag outputs, sdiag's own left out, most first."""
    names = set(before.types) | set(after.types)
    found = {n: after.types.get(n, 0) - before.types.get(n, 0) for n in names if n != SDIAG_OWN}
    return dict(sorted(((n, c) for n, c in found.items() if c), key=lambda x: (-x[1], x[0])))


def split_own(delta: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(the commands' RPCs, Slurm's own for the job) of a delta."""
    commands = {n: c for n, c in delta.items() if n not in SLURMS_OWN}
    return commands, {n: c for n, c in delta.items() if n in SLURMS_OWN}


def top(delta: Mapping[str, int], count: int = 4) -> str:
    shown = [f"{name} {n}" for name, n in list(delta.items())[:count]]
    more = len(delta) - count
    return ", ".join(shown) + (f", {more} more type(s)" if more > 0 else "") if shown else "none"


def burst_gaps(samples: list[tuple[float, int]]) -> list[float]:
    """Seconds between the samples (time, cumulative count) at which the count grew: the
    pauses of a poll loop whose calls all fall in one sample each."""
    grew = [t for (_, m), (t, n) in itertools.pairwise(samples) if n > m]
    return [round(b - a, 1) for a, b in itertools.pairwise(grew)]


def halves(samples: list[tuple[float, int]]) -> tuple[int, int]:
    """The count's growth in the first and the second half of the samples' span: a loop
    that backs off sends fewer in the second."""
    if len(samples) < 2:
        return 0, 0
    middle = (samples[0][0] + samples[-1][0]) / 2
    at_middle = next(n for t, n in samples if t >= middle)
    return at_middle - samples[0][1], samples[-1][1] - at_middle


def user_delta(before: Sdiag, after: Sdiag) -> dict[str, int]:
    """RPCs by user between two sdiag outputs (sdiag's own calls included: root's)."""
    names = set(before.users) | set(after.users)
    found = {n: after.users.get(n, 0) - before.users.get(n, 0) for n in names}
    return {n: c for n, c in sorted(found.items()) if c}


@dataclass(frozen=True)
class ControllerSizes:
    sweep_points: int  # the sweep submitted, and the runs `hpctf status SWEEP` shows
    watched: int  # pending runs watched by `logs -f`, Run.wait and Sweep.wait
    window_s: float  # each watcher's measured window, after its first look
    run_steps: int  # the run to DONE, restarted (a requeue) half way
    search_trials: int
    search_agents: int


CONTROLLER_FULL = ControllerSizes(1000, 100, 65.0, 400, 16, 4)
CONTROLLER_TINY = ControllerSizes(20, 4, 12.0, 40, 2, 2)
# The search as the issue asks it, for the extrapolation.
ISSUE_TRIALS, ISSUE_AGENTS = 64, 8

SEARCH_EXPERIMENT = """\
name: controller-search
resources: {{nodes: 1, tasks_per_node: 1, time: "00:20:00"}}
train:
  entry: search_task:build
  python_path: [{tests}]
  args: {{step_seconds: 0.02}}
  steps: 20
  global_batch_size: 8
  log_every_steps: 5
  eval_every_steps: 5
  save_model: false
checkpoint: {{every_steps: 10}}
sweep:
  parameters:
    train.args.x: {{type: float, low: 0.0, high: 1.0, step: 0.1}}
    train.args.depth: {{type: int, low: 0, high: 3}}
  objective: {{metric: eval.objective, direction: minimize}}
  trials: {trials}
  parallel: {agents}
  sampler: tpe
  seed: 1
  pruner: {{kind: asha, min_evals: 1, reduction_factor: 3}}
"""
WAITERS = """\
import sys, threading, hpctf
window, paths = float(sys.argv[1]), sys.argv[2:]
def wait(path):
    try:
        hpctf.run(path).wait(timeout=window)
    except TimeoutError:
        pass
threads = [threading.Thread(target=wait, args=(p,)) for p in paths]
for t in threads: t.start()
for t in threads: t.join()
"""
SWEEP_WAITER = """\
import sys, hpctf
try:
    hpctf.Sweep(sys.argv[2]).wait(timeout=float(sys.argv[1]))
except TimeoutError:
    pass
"""


class ControllerBench(Harness):
    def controller(self) -> dict[str, Any]:
        """Every case on one test cluster of its own; a row each."""
        reason = slurm_missing()
        if reason:
            if slurm_required():
                raise BenchError(f"controller: {reason}")
            self.row(benchmark="controller: RPCs to slurmctld", hpctf="-", baseline="-",
                     result=f"skipped: {reason}", goal=GOAL, met=None)  # fmt: skip
            return {"skipped": reason}
        sizes = CONTROLLER_TINY if self.sizes == TINY else CONTROLLER_FULL
        folder = self.folder("controller")
        port = _env_int("HPCTF_BENCH_CONTROLLER_PORT")
        first = _env_int("HPCTF_BENCH_CONTROLLER_FIRST_JOB_ID")
        found: dict[str, Any] = {"sizes": sizes.__dict__}
        self.users_seen: list[dict[str, int]] = []
        with slurm_cluster("controller", port=port, first_job_id=first) as cluster:
            env = {**self.env(folder / "runs"), **cluster.env}
            found["idle"] = self._ctl_idle(env, min(20.0, sizes.window_s))
            found["run"] = self._ctl_one_run(env, folder, sizes)
            hold = _sbatch_hold(env)
            try:
                found["sweep"], sweep = self._ctl_sweep(env, folder, sizes.sweep_points, hold)
                found["status"] = self._ctl_status(env, sweep, sizes.sweep_points)
                _cancel_sweep(env, sweep)
                _, watched = self._ctl_sweep(env, folder, sizes.watched, hold, row=False)
                found["logs_follow"] = self._ctl_logs_follow(env, watched, sizes)
                found["run_wait"] = self._ctl_run_wait(env, watched, sizes)
                found["sweep_wait"] = self._ctl_sweep_wait(env, watched, sizes)
                _cancel_sweep(env, watched)
            finally:
                subprocess.run(["scancel", hold], env=env, capture_output=True, check=False)
            found["search"] = self._ctl_search(env, folder, sizes)
        found["users"] = self.users_seen  # every counted case's, in order (sdiag's own in)
        return found

    # --- counting --------------------------------------------------------------------------

    def _ctl_sdiag(self, env: dict[str, str]) -> Sdiag:
        proc = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError(f"controller: sdiag failed (exit {proc.returncode}): {proc.stderr}")
        return parse_sdiag(proc.stdout)

    def _ctl_counted(
        self, env: dict[str, str], body: Callable[[], Any]
    ) -> tuple[dict[str, int], float, Any]:
        """(RPCs by message type, seconds, what ``body`` returned) of ``body``."""
        before, began = self._ctl_sdiag(env), time.monotonic()
        value = body()
        seconds = time.monotonic() - began
        after = self._ctl_sdiag(env)
        self.users_seen.append(user_delta(before, after))
        return rpc_delta(before, after), seconds, value

    def _ctl_sampled(
        self, env: dict[str, str], seconds: float
    ) -> tuple[dict[str, int], list[tuple[float, int]]]:
        """RPCs over ``seconds`` from now, with sdiag read every second: (by type, samples of
        (seconds, RPCs so far))."""
        first = self._ctl_sdiag(env)
        began, samples = time.monotonic(), [(0.0, 0)]
        last = first
        while time.monotonic() - began < seconds:
            time.sleep(1.0)
            last = self._ctl_sdiag(env)
            samples.append((time.monotonic() - began, sum(rpc_delta(first, last).values())))
        return rpc_delta(first, last), samples

    # --- cases ----------------------------------------------------------------------------

    def _ctl_idle(self, env: dict[str, str], seconds: float) -> dict[str, Any]:
        """The cluster with nothing asked of it: the floor under every windowed figure."""
        delta, _ = self._ctl_sampled(env, seconds)
        rate = sum(delta.values()) / seconds
        say(f"controller: idle {seconds:.0f} s: {delta}")
        return {"rpcs": delta, "seconds": seconds, "rpc_per_s": round(rate, 4)}

    def _ctl_one_run(
        self, env: dict[str, str], folder: Path, sizes: ControllerSizes
    ) -> dict[str, Any]:
        """`hpctf submit` of the digits example to DONE, restarted once half way (the job
        requeues itself: `train.restart_every_steps`); waited for on the files and sdiag's own
        job counters, so that no poll of this benchmark is counted."""
        log = folder / "submit.log"
        half = sizes.run_steps // 2
        argv = [*self.hpctf, "submit", str(DIGITS), "--site", "local-slurm",
                "--set", f"train.steps={sizes.run_steps}",
                "--set", f"train.restart_every_steps={half}",
                "--set", f"checkpoint.every_steps={half}"]  # fmt: skip

        def body() -> Path:
            completed = self._ctl_sdiag(env).jobs.get("completed", 0)
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            log.write_text(proc.stdout + proc.stderr)
            found = re.search(r"^run directory: (\S+)$", proc.stdout, re.M)
            if proc.returncode != 0 or not found:
                raise BenchError(f"controller: {' '.join(argv)} failed:\n{tail(log)}")
            run_dir = Path(found.group(1))
            wait_until(lambda: (run_dir / "DONE").exists(), 600, f"{run_dir}/DONE", poll=1.0)
            wait_until(lambda: self._ctl_sdiag(env).jobs.get("completed", 0) > completed, 120,
                       "the job's completion (sdiag)", poll=1.0)  # fmt: skip
            return run_dir

        delta, seconds, run_dir = self._ctl_counted(env, body)
        starts = sum(1 for line in _journal(run_dir) if line.get("event") == "started")
        commands, own = split_own(delta)
        mine = sum(commands.values())
        per_hour = mine / RUN_HOUR_BUDGET
        self.row(
            benchmark=f"controller: one run, `hpctf submit` to DONE ({starts} starts: one "
            f"requeue), digits on 2 nodes, {seconds:.0f} s",
            hpctf=f"{mine} RPCs from commands ({top(commands)})",
            baseline=f"Slurm's own for the job: {sum(own.values())} ({top(own, 3)})",
            result=f"{mine} a run; 1,000 runs of 1 h: {per_hour:.2f} RPC/s",
            goal=GOAL,
            met=per_hour <= 1.0,
        )
        return {"rpcs": delta, "commands": commands, "slurms_own": own, "seconds": seconds,
                "starts": starts, "rpc_per_s_1000_runs_of_1h": per_hour}  # fmt: skip

    def _ctl_sweep(
        self, env: dict[str, str], folder: Path, points: int, hold: str, row: bool = True
    ) -> tuple[dict[str, Any], Path]:
        """`hpctf sweep` of ``points`` digits points, held by a dependency (nothing trains)."""
        root = folder / f"sweep-{points}"
        argv = [*self.hpctf, "sweep", str(DIGITS), "--site", "local-slurm",
                "--grid", "train.seed=" + ",".join(map(str, range(points))),
                "--max-running", "2", "--set", f"resources.dependency=afterok:{hold}"]  # fmt: skip

        def body() -> subprocess.CompletedProcess[str]:
            return subprocess.run(argv, env={**env, "HPCTF_RUNS_ROOT": str(root)},
                                  capture_output=True, text=True, check=False)  # fmt: skip

        delta, seconds, proc = self._ctl_counted(env, body)
        found = re.search(r"^sweep directory: (\S+)$", proc.stdout, re.M)
        if proc.returncode != 0 or not found:
            raise BenchError(f"controller: {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        commands, own = split_own(delta)  # own: a job of the case before, still ending
        total = sum(commands.values())
        per_run = total / points
        if row:
            self.row(
                benchmark=f"controller: `hpctf sweep` of {points:,} points (held), {seconds:.1f} s",
                hpctf=f"{total} RPCs ({top(commands)})",
                baseline="-",
                result=f"{per_run:.4f} a run; 1,000 runs of 1 h: "
                f"{per_run / RUN_HOUR_BUDGET:.4f} RPC/s",
                goal=GOAL,
                met=per_run / RUN_HOUR_BUDGET <= 1.0,
            )
        document = {"points": points, "rpcs": commands, "slurms_own": own, "seconds": seconds}
        return document, Path(found.group(1))

    def _ctl_status(self, env: dict[str, str], sweep: Path, points: int) -> dict[str, Any]:
        """`hpctf status SWEEP` of the points just submitted (all pending in Slurm), after
        one call that makes its index; then `hpctf status RUN` of one of them."""
        results: dict[str, dict[str, Any]] = {}
        first = _points(sweep)[0]
        for name, path in (("sweep", sweep), ("run", first)):
            argv = [*self.hpctf, "status", str(path)]

            def body(argv: list[str] = argv) -> int:
                return subprocess.run(argv, env=env, capture_output=True, check=False).returncode

            self._ctl_counted(env, body)
            delta, seconds, code = self._ctl_counted(env, body)
            if code != 0:
                raise BenchError(f"controller: {' '.join(argv)} exited {code}")
            results[name] = {"rpcs": delta, "seconds": seconds}
        delta = results["sweep"]["rpcs"]
        total = sum(delta.values())
        rate = total / STATUS_EVERY_S
        self.row(
            benchmark=f"controller: `hpctf status SWEEP`, {points:,} points pending in Slurm "
            f"(`hpctf status RUN`: {top(results['run']['rpcs'])})",
            hpctf=f"{total} RPCs a call ({top(delta)})",
            baseline="-",
            result=f"{total / points:.4f} a run a call; every {STATUS_EVERY_S:.0f} s: "
            f"{rate:.2f} RPC/s for all of them",
            goal=GOAL,
            met=rate <= 1.0,
        )
        return results

    def _ctl_watched(
        self, env: dict[str, str], name: str, procs: list[subprocess.Popen[bytes]],
        runs: int, window: float, what: str, one_call: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """RPCs of ``procs`` (watching ``runs`` runs) over ``window`` seconds after their
        first look (10 s, and 0.2 s a process: 100 starting on 2 cores), in each half of it
        and between bursts, and a row."""
        try:
            time.sleep(10.0 + 0.2 * len(procs))
            for proc in procs:
                if proc.poll() not in (None, 0):
                    raise BenchError(f"controller: a watcher ({name}) exited {proc.returncode}")
            delta, samples = self._ctl_sampled(env, window)
        finally:
            for proc in procs:
                stop(proc)
        total = sum(delta.values())
        seconds = samples[-1][0]
        per_run_s = total / seconds / runs
        gaps = burst_gaps(samples)
        early, late = halves(samples)
        backoff = late < 0.75 * early
        # The watchers of one user share one view of the queue (hpctf.login.reading.slurm_view
        # .WATCH_SHARE_S): at most one squeue (3 RPCs) per SHARE_S whatever their number. Seen
        # here when the hundred cost no more than that, their cost does not grow with the
        # runs, as one call for all of them (a sweep's wait) does not.
        shared = total <= SQUEUE_RPCS * (seconds / SHARE_S + 1)
        at_scale = total / seconds if one_call or shared else per_run_s * ACTIVE
        self.row(
            benchmark=f"controller: {what}, {runs} pending runs, {seconds:.0f} s",
            hpctf=f"{total} RPCs ({top(delta)}); {early} in the first half, {late} in the "
            f"second; gaps between bursts {_gaps(gaps)}",
            baseline="-",
            result=f"{per_run_s:.4f} RPC/s a run; 1,000 runs"
            + (" in one sweep" if one_call else "")
            + f": {at_scale:.2f} RPC/s"
            + (f" (one shared view: at most {SQUEUE_RPCS} RPCs per {SHARE_S:.0f} s, whatever the"
               " number of watchers)" if shared and not one_call else "")
            + ("" if backoff or shared else "; no backoff seen"),
            goal=GOAL + ", with backoff or one shared view",
            met=at_scale <= 1.0 and (backoff or shared),
        )
        return {"rpcs": delta, "window_s": seconds, "runs": runs, "gaps_s": gaps,
                "halves": [early, late], "backoff": backoff, "shared": shared,
                "rpc_per_s_per_run": per_run_s, "rpc_per_s_1000_runs": at_scale}  # fmt: skip

    def _ctl_logs_follow(
        self, env: dict[str, str], sweep: Path, sizes: ControllerSizes
    ) -> dict[str, Any]:
        runs = _points(sweep)
        procs = [subprocess.Popen([*self.hpctf, "logs", "-f", str(run)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True) for run in runs]  # fmt: skip
        return self._ctl_watched(env, "logs -f", procs, len(runs), sizes.window_s,
                                 "`hpctf logs -f`, one process a run")  # fmt: skip

    def _ctl_run_wait(
        self, env: dict[str, str], sweep: Path, sizes: ControllerSizes
    ) -> dict[str, Any]:
        runs = _points(sweep)
        argv = [sys.executable, "-c", WAITERS, str(sizes.window_s + 30), *map(str, runs)]
        procs = [subprocess.Popen(argv, env=env, start_new_session=True)]
        return self._ctl_watched(env, "Run.wait", procs, len(runs), sizes.window_s,
                                 "`hpctf.run(path).wait()`, one thread a run")  # fmt: skip

    def _ctl_sweep_wait(
        self, env: dict[str, str], sweep: Path, sizes: ControllerSizes
    ) -> dict[str, Any]:
        runs = len(_points(sweep))
        argv = [sys.executable, "-c", SWEEP_WAITER, str(sizes.window_s + 30), str(sweep)]
        procs = [subprocess.Popen(argv, env=env, start_new_session=True)]
        return self._ctl_watched(env, "Sweep.wait", procs, runs, sizes.window_s,
                                 "`hpctf.Sweep(path).wait()` of the sweep",
                                 one_call=True)  # fmt: skip

    def _ctl_search(
        self, env: dict[str, str], folder: Path, sizes: ControllerSizes
    ) -> dict[str, Any]:
        """A search of ``search_trials`` trials by ``search_agents`` agents (tests/
        search_task.py): `hpctf sweep` counted alone, then its agents until Slurm has ended
        every job it submitted (sdiag's own counters: no poll of this benchmark counted)."""
        experiment = folder / "search.yaml"
        experiment.write_text(SEARCH_EXPERIMENT.format(
            tests=REPO / "tests", trials=sizes.search_trials,
            agents=sizes.search_agents))  # fmt: skip
        argv = [*self.hpctf, "sweep", str(experiment), "--site", "local-slurm"]
        before = self._ctl_sdiag(env).jobs

        def submit() -> subprocess.CompletedProcess[str]:
            return subprocess.run(argv, env={**env, "HPCTF_RUNS_ROOT": str(folder / "search")},
                                  capture_output=True, text=True, check=False)  # fmt: skip

        def ended() -> dict[str, int] | None:
            now = self._ctl_sdiag(env).jobs
            count = {k: now.get(k, 0) - before.get(k, 0) for k in now}
            gone = count.get("completed", 0) + count.get("canceled", 0) + count.get("failed", 0)
            return count if count.get("submitted") and gone >= count["submitted"] else None

        submitted, submit_s, proc = self._ctl_counted(env, submit)
        (folder / "search.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise BenchError(f"controller: {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        delta, seconds, jobs = self._ctl_counted(
            env, lambda: wait_until(ended, 900, "the search's agents", poll=2.0)
        )
        commands, own = split_own(delta)
        agents_rpcs = sum(commands.values())
        submit_rpcs = sum(submitted.values())
        trials, agents = sizes.search_trials, sizes.search_agents
        per_trial = (submit_rpcs + agents_rpcs) / trials
        # The issue's search: the submit once, the agents' and each trial's step per trial,
        # each agent's batch script once.
        issue = submit_rpcs + agents_rpcs / trials * ISSUE_TRIALS
        batch = own.get("REQUEST_COMPLETE_BATCH_SCRIPT", 0)
        own_issue = (sum(own.values()) - batch) / trials * ISSUE_TRIALS
        own_issue += batch / agents * ISSUE_AGENTS
        rate = agents_rpcs / seconds / agents
        self.row(
            benchmark=f"controller: a search, {trials} trials by {agents} agents (TPE + ASHA, "
            f"tests/search_task.py), {submit_s + seconds:.0f} s",
            hpctf=f"`hpctf sweep`: {submit_rpcs} ({top(submitted, 3)}); the agents: "
            f"{agents_rpcs} ({top(commands, 3)})",
            baseline=f"Slurm's own for the jobs and trials' steps: {sum(own.values())} "
            f"({top(own, 3)})",
            result=f"{per_trial:.2f} a trial; {ISSUE_TRIALS} trials by {ISSUE_AGENTS} agents: "
            f"{issue:.0f} (Slurm's own: {own_issue:.0f}); the agents {rate:.3f} RPC/s each, "
            f"1,000 at once: {rate * ACTIVE:.1f} RPC/s",
            goal=GOAL,
            met=rate * ACTIVE <= 1.0 and per_trial <= RUN_HOUR_BUDGET,
        )
        return {"submit_rpcs": submitted, "rpcs": delta, "commands": commands,
                "slurms_own": own, "submit_s": submit_s, "seconds": seconds, "jobs": jobs,
                "trials": trials, "agents": agents, "per_trial": per_trial,
                "issue_estimate": issue, "issue_slurms_own_estimate": own_issue,
                "rpc_per_s_per_agent": rate}  # fmt: skip


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _gaps(gaps: list[float]) -> str:
    return ", ".join(f"{g:.0f}" for g in gaps[:6]) + " s" if gaps else "(one burst or none)"


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    return list(RunDir(run_dir).events())


def _points(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / "config.json").is_file())


def _sbatch_hold(env: dict[str, str]) -> str:
    """A held job for the sweeps' tasks to depend on, so that none of them starts."""
    return subprocess.run(
        ["sbatch", "--parsable", "--hold", "--partition=debug", "--output=/dev/null",
         "--wrap=true"], env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def _cancel_sweep(env: dict[str, str], sweep: Path) -> None:
    arrays = json.loads((sweep / "sweep.json").read_text())["arrays"]
    ids = [str(a["job_id"]) for a in arrays]
    subprocess.run(["scancel", *ids], env=env, capture_output=True, check=False)
