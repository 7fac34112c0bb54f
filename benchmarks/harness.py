"""The shared harness of benchmarks/run.py: sizes, timing and alternation helpers, and a
run's plumbing (submitting a run, reading its metrics, the table's rows). Each section is a
mixin in a ``bench_<section>.py`` module; run.py puts them together.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # tests/paced.py: the paced run's settings, the tests' own
from tests.paced import paced  # noqa: E402

DIGITS = REPO / "examples" / "digits" / "experiment.yaml"
SECTIONS = (
    "login", "listing", "sweep", "resolver", "runtime", "preemption", "crash", "lost_node",
    "first_step", "stall", "soak", "remote", "search", "dashboard",
)  # fmt: skip
# Run order: login's `hpctf status` reads a finished run, and runtime leaves one behind.
ORDER = (
    "resolver", "runtime", "login", "remote", "listing", "dashboard", "sweep", "preemption",
    "crash", "lost_node", "first_step", "stall", "soak", "search",
)  # fmt: skip
GPU_SECTIONS = ("gpu_runtime", "gpu_stall")
# Run beside the others with --tiny; first_step in the first lane, which was the shorter one:
# 116 s against 122 s (+ first_step's 33 s) at load average 7.
TINY_SECOND_LANE = ("preemption", "crash", "stall")
# A third lane with --tiny: the search against its grid mostly waits on the Slurm test
# cluster's scheduling and accounting, so it overlaps the two others well (CI time); the lost
# node mostly waits for Slurm to notice it (SlurmdTimeout).
TINY_THIRD_LANE = ("search", "lost_node")
GLOBAL_BATCH = 64  # the digits example's, given explicitly to both sides
SOAK_BATCH = 2  # one example per replica: the step is the collectives, not the model


@dataclass(frozen=True)
class Sizes:
    """How much of each section to run. The full sizes are what each figure's noise needs on
    the shared 2-core VM (benchmarks/README.md says how each was chosen), so that the whole
    run takes under 20 minutes there; the tiny ones only exercise the code."""

    login_runs: int
    login_warmup: int  # untimed runs of each command first (page cache, .pyc files)
    sweep_rounds: int  # alternated pairs: the 2,500-point sweep plan and one render
    listing_runs: int  # run directories under the runs root `hpctf status` and `runs` list
    listing_points: int  # points of the sweep `hpctf status SWEEP` shows
    listing_rounds: int  # timed runs of each listing command (after the one that indexes)
    listing_cold: bool  # drop the page cache before each `status SWEEP` (root; a full run only)
    sweep_dry_points: int  # the big dry run (issue #31: 100,000 points in at most 30 s)
    submit_points: int  # the sweep submitted (issue #34: 1,000 points in at most 3 s)
    submit_slurm: bool  # to the real Slurm test cluster, started for it where none answers
    resolver_nodes: tuple[int, ...]
    resolver_repeat: int
    runtime_steps: int
    runtime_log_every: int
    runtime_rounds: int
    wide_hidden: int  # the digits MLP with a hidden layer this wide: a step of about 50 ms
    wide_batch: int
    wide_steps: int
    wide_log_every: int
    wide_rounds: int  # alternated pairs; 0: the row is left out
    preempt_after: int  # steps trained before the signal
    # The real-Slurm sections whose training only waits for something to happen to it (a save,
    # the standbys, Slurm noticing a lost node: crash, lost_node): None trains the digits
    # example at full speed; a number paces each step, asleep that long (tests/entries.py's
    # slow_steps in its place), so that a tiny run's two ranks leave the cores to its other
    # lanes and to the tests beside it (at full speed they took both for a minute and a half;
    # 10 ms asleep still kept them a third busy: a logged step costs about 3.5 ms a rank).
    paced_step_s: float | None
    restart_rounds: int
    crash_rounds: int  # SIGKILLs of a rank of one Slurm job (within its failure budget, 3)
    takeover_rounds: int  # the same with warm standbys (its failure budget raised to fit)
    first_step_rounds: int  # alternated pairs: hpctf worker and the plain script to step 1
    first_step_workers: int
    stall_steps: int
    stall_log_every: int
    stall_every: int
    stall_rounds: int  # alternated pairs of the Dense stack, saved sync and async
    dense_width: int
    dense_depth: int
    dense_steps: int
    dense_log_every: int
    dense_every: int
    soak_steps: int
    soak_log_every: int  # each logged step records threads and RSS: the soak's samples
    soak_every: int  # checkpoint interval: the save path soaks too
    gpu_rounds: int
    gpu_steps: int
    # The search against its full grid (bench_search.py): x in [0, 1] by search_x_step times
    # depth in 0..search_depths-1 is the grid; each trial or point search_steps steps of
    # search_step_seconds (asleep), evaluated every search_eval_every steps.
    search_trials: int
    search_parallel: int
    search_steps: int
    search_step_seconds: float
    search_eval_every: int
    search_x_step: float
    search_depths: int
    search_nodes: int  # the test cluster's nodes (2 CPUs each)
    search_slots: int  # the grid's --max-running: as many at once as the search's parallel
    dashboard_runs: int  # run directories under the runs root `hpctf ui` shows
    dashboard_rounds: int  # first paints from no index (each followed by 3 refreshes)


FULL = Sizes(
    login_runs=15,
    login_warmup=1,
    sweep_rounds=5,
    listing_runs=10_000,
    listing_points=1_000,
    listing_rounds=3,
    listing_cold=True,
    sweep_dry_points=100_000,
    submit_points=1_000,
    submit_slurm=True,
    resolver_nodes=(10, 1000, 4000, 10000),
    resolver_repeat=50,
    runtime_steps=2000,
    runtime_log_every=250,
    runtime_rounds=5,
    wide_hidden=4096,
    # 1,024 gave about 23 ms a step on a quiet VM (40 ms under load): twice the batch for 50.
    wide_batch=2048,
    wide_steps=300,
    wide_log_every=50,
    wide_rounds=5,
    preempt_after=200,
    paced_step_s=None,
    restart_rounds=4,
    crash_rounds=3,
    takeover_rounds=10,
    first_step_rounds=4,
    first_step_workers=2,
    stall_steps=1000,
    stall_log_every=50,
    stall_every=100,
    stall_rounds=2,
    dense_width=2048,
    dense_depth=7,
    dense_steps=40,
    dense_log_every=5,
    dense_every=10,
    soak_steps=100_000,
    soak_log_every=500,
    soak_every=1000,
    gpu_rounds=2,
    gpu_steps=300,
    search_trials=24,
    search_parallel=4,
    search_steps=200,
    search_step_seconds=0.1,
    search_eval_every=20,
    search_x_step=0.1,
    search_depths=4,
    search_nodes=2,
    search_slots=4,
    dashboard_runs=1_000,
    dashboard_rounds=5,
)
# Every section once, each process as short as it can be and still report every figure: one
# login round, the 4,000-node resolver row (the goal's), two timed windows per runtime side, a
# save after the first in each stall run.
TINY = replace(
    FULL,
    login_runs=1,
    login_warmup=0,
    sweep_rounds=1,
    listing_runs=200,
    listing_points=20,
    listing_rounds=1,
    listing_cold=False,
    sweep_dry_points=2_000,
    submit_points=20,
    submit_slurm=False,  # a stand-in sbatch: a cluster's start is 15 s
    resolver_nodes=(10, 4000),
    resolver_repeat=1,
    runtime_steps=200,
    runtime_log_every=50,
    runtime_rounds=1,
    wide_rounds=0,  # the digits row's code with other numbers
    preempt_after=20,
    paced_step_s=0.05,
    restart_rounds=1,
    crash_rounds=1,
    takeover_rounds=1,
    first_step_rounds=1,
    first_step_workers=1,
    stall_steps=100,
    stall_log_every=25,
    stall_every=50,
    stall_rounds=1,
    dense_width=256,
    dense_depth=3,
    dense_steps=20,
    dense_every=10,
    soak_steps=1000,
    soak_log_every=100,
    soak_every=500,
    gpu_rounds=1,
    gpu_steps=100,
    search_trials=2,
    search_parallel=2,
    search_steps=20,
    search_step_seconds=0.02,
    search_eval_every=5,
    search_x_step=1.0,
    search_depths=2,  # a range needs low < high
    search_slots=2,
    dashboard_runs=50,
    dashboard_rounds=1,
)
# What rank 0's log says when each phase of a start is over (hpctf/compute/start/runtime.py,
# joining.py, session.py).
PHASES = (
    ("worker_up", re.compile(r"rank 0: host .* pid \d+")),  # Python, hpctf, the cluster spec
    ("tensorflow_imported", re.compile(r"rank 0: joining \d+ worker")),
    ("strategy", re.compile(r"rank 0: \d+ replicas, ")),  # every worker joined
    ("restored", re.compile(r"rank 0: (resumed from |no checkpoint in )")),
)
WARMUP_WINDOWS = 2  # logged windows left out at the start of each run (tracing, warm caches)


class BenchError(RuntimeError):
    """A benchmark could not run; the message says which and where its logs are."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def hpctf_argv() -> list[str]:
    """The console script users run, next to this interpreter; else ``python -m hpctf``."""
    script = Path(sys.executable).with_name("hpctf")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpctf"]


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} missing)"


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def windows(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, steps/s of the window ending there) of every logged training step."""
    return [(r["step"], r["steps_per_s"]) for r in records if "steps_per_s" in r]


def median(values: list[float]) -> float:
    if not values:
        raise BenchError("no measurement to take a median of")
    return statistics.median(values)


def write_experiment(
    folder: Path,
    name: str,
    nodes: int,
    train: dict[str, Any],
    checkpoint_every: int,
    asynchronous: bool | None = None,
) -> Path:
    """An experiment file for ``--site local`` with ``nodes`` one-task workers, its entry
    found in this folder or beside the digits example."""
    experiment = folder / "experiment.yaml"
    experiment.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "name": name,
        "site": "local",
        "resources": {"nodes": nodes, "tasks_per_node": 1, "time": "01:00:00"},
        "train": {"python_path": [str(HERE), str(DIGITS.parent)], **train},
        "checkpoint": {"every_steps": checkpoint_every, "keep": 3},
    }
    if asynchronous is not None:  # else hpctf's default
        config["checkpoint"]["asynchronous"] = asynchronous
    experiment.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return experiment


def spread(values: list[float]) -> dict[str, float]:
    """Lowest, quartiles and highest of ``values`` (per-round ratios), for the JSON."""
    ordered = sorted(values)
    if len(ordered) < 2:
        low = high = ordered[0]
    else:
        low, _, high = statistics.quantiles(ordered, n=4, method="inclusive")
    return {
        "min": round(ordered[0], 4),
        "q1": round(low, 4),
        "median": round(statistics.median(ordered), 4),
        "q3": round(high, 4),
        "max": round(ordered[-1], 4),
    }


def middle_half(values: list[float]) -> str:
    found = spread(values)
    return f"{found['q1']:.3f}-{found['q3']:.3f}"


def each_round(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def megabytes(value: float) -> str:
    return f"{value:.0f} MB" if value >= 10 else f"{value:.2f} MB"


def milliseconds(value: float) -> str:
    return f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


def checkpoint_mb(run_dir: Path) -> float:
    """Size of the newest checkpoint in ``run_dir``'s checkpoints (all of its files)."""
    folder = run_dir / "checkpoints"
    steps = sorted(int(p.name.split("-")[1].split(".")[0]) for p in folder.glob("ckpt-*.index"))
    if not steps:
        return 0.0
    return sum(p.stat().st_size for p in folder.glob(f"ckpt-{steps[-1]}.*")) / 1e6


def wait_until(test: Callable[[], Any], timeout: float, what: str, poll: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = test()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def stop(proc: subprocess.Popen[bytes], how: int = signal.SIGKILL) -> None:
    """End ``proc`` and its process group, if still running."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, how)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Harness:
    """One run of the benchmarks: sizes, a work directory, the table's rows; each section is a
    mixin of its own module (:class:`run.Bench` puts them together)."""

    def __init__(self, sizes: Sizes, work: Path) -> None:
        self.sizes = sizes
        self.work = work
        self.hpctf = hpctf_argv()
        self.rows: list[dict[str, Any]] = []  # the summary table
        self._running = threading.local()  # the section each lane runs, for its rows
        self.finished_run: Path | None = None  # a digits run that reached DONE
        self.exit_after_done: dict[str, float] = {}  # section/log -> seconds
        # The full run's soak runs beside the other sections (see main): the soak steps at
        # which they started and, once done, ended; and whether the soak job has ended.
        self.beside_soak: list[int] = []
        self.soak_ended = threading.Event()
        self.failed = threading.Event()  # a lane failed: the other stops at its next section

    # --- plumbing ------------------------------------------------------------------------

    @property
    def section(self) -> str:
        """The section this thread runs (``--tiny`` runs lanes of sections at once)."""
        name: str = getattr(self._running, "section", "")
        return name

    @section.setter
    def section(self, name: str) -> None:
        self._running.section = name

    def env(self, runs_root: Path, gpus: str = "") -> dict[str, str]:
        """A child's environment: no SLURM_* of an allocation this may run in, the run dirs
        under ``runs_root``, and ``gpus`` as CUDA_VISIBLE_DEVICES ("" hides every GPU)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        env.update(HPCTF_RUNS_ROOT=str(runs_root), CUDA_VISIBLE_DEVICES=gpus)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return env

    def paced(self) -> list[str]:
        """``--set`` arguments for a real-Slurm section's digits run: none, or the paced steps
        of :attr:`Sizes.paced_step_s`."""
        seconds = self.sizes.paced_step_s
        if seconds is None:
            return []
        sets = paced(seconds)
        return [arg for setting in sets for arg in ("--set", setting)]

    def folder(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def submit(
        self,
        experiment: Path,
        sets: list[str],
        runs_root: Path,
        log: Path,
        gpus: str = "",
        timeout: float = 3600,
    ) -> tuple[Path, float]:
        """``hpctf submit EXPERIMENT --site local --set ...`` to the end; (run dir, seconds)."""
        argv = [*self.hpctf, "submit", str(experiment), "--site", "local"]
        argv += [arg for setting in sets for arg in ("--set", setting)]
        started = time.perf_counter()
        with log.open("wb") as out:
            proc = subprocess.run(
                argv,
                env=self.env(runs_root, gpus),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        ended, elapsed = time.time(), time.perf_counter() - started
        found = re.search(r"^run directory: (\S+)$", log.read_text(errors="replace"), re.M)
        if proc.returncode != 0 or not found:
            rank0 = Path(found.group(1)) / "logs" / "rank-0.log" if found else log
            raise BenchError(
                f"hpctf submit failed (exit {proc.returncode}): {' '.join(argv)}\n"
                f"{tail(log)}\n{tail(rank0)}"
            )
        run_dir = Path(found.group(1))
        done = run_dir / "DONE"
        if done.exists():
            # How long the workers took to exit after the chief wrote DONE (the run is over
            # for the user there): not part of any figure, but a Slurm job pays for it too.
            self.exit_after_done[f"{self.section}/{log.stem}"] = round(
                ended - done.stat().st_mtime, 1
            )
        return run_dir, elapsed

    def row(self, **cells: Any) -> None:
        self.rows.append({"section": self.section, **cells})

    def submitted_job(
        self, argv: list[str], env: dict[str, str], work: Path
    ) -> tuple[str, Path]:
        """Run ``hpctf submit`` (``argv``) for a Slurm site; the job id and run directory it
        printed, or a BenchError naming this section."""
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=work)
        job = re.search(r"^submitted job (\d+)$", proc.stdout, re.M)
        found = re.search(r"^run directory: (\S+)$", proc.stdout, re.M)
        if proc.returncode != 0 or not job or not found:
            raise BenchError(f"{self.section}: hpctf submit failed:\n{proc.stdout}\n{proc.stderr}")
        return job.group(1), Path(found.group(1))

    def skipped(self, missing: str, rows: list[tuple[str, str]]) -> dict[str, Any]:
        """A section that cannot run here (``missing`` says why): a BenchError where the
        test command requires every part (HPCTF_REQUIRE_SLURM, CI), else each of its ``rows``
        (benchmark, goal) marked skipped, and the section's result."""
        from slurm_cluster import slurm_required

        if slurm_required():
            raise BenchError(f"{self.section}: {missing} (HPCTF_REQUIRE_SLURM is set)")
        say(f"{self.section}: skipped: {missing}")
        for benchmark, goal in rows:
            self.row(benchmark=benchmark, hpctf="-", baseline=missing, result="skipped",
                     goal=goal, met=None)  # fmt: skip
        return {"skipped": missing, "met": None}
