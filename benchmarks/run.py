"""hpctf's benchmarks in one command: a table on stdout and every measurement as JSON.

    .venv/bin/python benchmarks/run.py [--tiny] [--only NAME[,NAME...]] [--json FILE]
                                       [--soak-steps N] [--keep DIR] [--gpu]

Each figure is hpctf against what a user would do instead, measured in the same run, the two
sides alternated, and given as a ratio where there is a baseline (these machines are shared
and noisy: absolute numbers move, ratios much less):

  login       whole-process median of `hpctf render`, `hpctf submit --dry-run` and
              `hpctf status RUN` against `python -c "import tensorflow"` (goal: <= 0.1)
  resolver    hpctf's cluster_spec against TF's SlurmClusterResolver at 10 to 10,000 nodes,
              1 and 4 tasks per node: time and whether each answer is Slurm's order
              (goal: <= 20 ms at 4,000 nodes, always right); benchmarks/bench_tfconfig.py
  runtime     steps/s of `hpctf submit --site local` (2 workers, the digits example) against
              benchmarks/plain_mwms.py, the same training written by hand (goal: >= 0.97)
  preemption  SIGUSR2 (the warning) and SIGTERM to one rank of 2 workers: steps lost and
              seconds from signal to exit (goal: 0 lost when warned); then seconds from
              `hpctf resubmit` to the first resumed step against a cold start of the same
              job (goal: <= 1.15)
  stall       seconds the loop waits for each checkpoint save against the time of a step,
              for the digits model and a ~100 MB Dense stack (benchmarks/bench_entries.py)
  soak        one job of 100,000 steps (--tiny: 1,000) of the smallest step, 2 workers:
              threads, RSS and steps/s at its start and end (goal: flat)

--gpu runs instead the GPU mode of runtime and stall (ResNet-50, synthetic images, mixed
precision, XLA, NCCL; benchmarks/gpu_check.py) and refuses on a machine without GPUs.
The full run takes under 20 minutes on 2 cores, half of it the soak. --tiny runs every
section once at the smallest size that still reports every figure, in two lanes at once, in
about a minute (CI runs it: tests/test_benchmarks.py); its numbers say nothing. Run dirs and
logs go to a temporary directory (--keep DIR keeps them), never into the checkout.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DIGITS = REPO / "examples" / "digits" / "experiment.yaml"
SECTIONS = ("login", "resolver", "runtime", "preemption", "stall", "soak")
# Run order: login's `hpctf status` reads a finished run, and runtime leaves one behind.
ORDER = ("resolver", "runtime", "login", "preemption", "stall", "soak")
GPU_SECTIONS = ("gpu_runtime", "gpu_stall")
TINY_SECOND_LANE = ("preemption", "stall")  # run beside the others with --tiny
GLOBAL_BATCH = 64  # the digits example's, given explicitly to both sides
SOAK_BATCH = 2  # one example per replica: the step is the collectives, not the model


@dataclass(frozen=True)
class Sizes:
    """How much of each section to run. The full sizes are what each figure's noise needs on
    the shared 2-core VM (benchmarks/README.md says how each was chosen), so that the whole
    run takes under 20 minutes there; the tiny ones only exercise the code."""

    login_runs: int
    login_warmup: int  # untimed runs of each command first (page cache, .pyc files)
    resolver_nodes: tuple[int, ...]
    resolver_repeat: int
    runtime_steps: int
    runtime_log_every: int
    runtime_rounds: int
    preempt_after: int  # steps trained before the signal
    restart_rounds: int
    stall_steps: int
    stall_log_every: int
    stall_every: int
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


FULL = Sizes(
    login_runs=15,
    login_warmup=1,
    resolver_nodes=(10, 1000, 4000, 10000),
    resolver_repeat=50,
    runtime_steps=2000,
    runtime_log_every=250,
    runtime_rounds=4,
    preempt_after=200,
    restart_rounds=4,
    stall_steps=1000,
    stall_log_every=50,
    stall_every=100,
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
)
# Every section once, each process as short as it can be and still report every figure: one
# login round, the 4,000-node resolver row (the goal's), two timed windows per runtime side, a
# save after the first in each stall run.
TINY = replace(
    FULL,
    login_runs=1,
    login_warmup=0,
    resolver_nodes=(10, 4000),
    resolver_repeat=1,
    runtime_steps=200,
    runtime_log_every=50,
    runtime_rounds=1,
    preempt_after=20,
    restart_rounds=1,
    stall_steps=100,
    stall_log_every=25,
    stall_every=50,
    dense_width=256,
    dense_depth=3,
    dense_steps=20,
    dense_every=10,
    soak_steps=1000,
    soak_log_every=100,
    soak_every=500,
    gpu_rounds=1,
    gpu_steps=100,
)
# What rank 0's log says when each phase of a start is over (hpctf/compute/runtime.py,
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
    folder: Path, name: str, nodes: int, train: dict[str, Any], checkpoint_every: int
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


class Bench:
    """One run of the benchmarks: sizes, a work directory, and each section as a method."""

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
        """The section this thread runs (``--tiny`` runs two lanes of sections at once)."""
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

    # --- 1. login-node latency --------------------------------------------------------------

    def login(self) -> dict[str, Any]:
        """Whole processes, each command and `import tensorflow` alternated round by round."""
        work = self.folder("login")
        runs = work / "runs"
        run_dir = self.finished_run
        if run_dir is None:
            say("login: a finished 100-step digits run for `hpctf status`")
            run_dir, _ = self.submit(DIGITS, ["train.steps=100"], runs, work / "digits.log")
        commands = {
            "hpctf render": [*self.hpctf, "render", str(DIGITS), "--site", "local-slurm"],
            "hpctf submit --dry-run": [
                *self.hpctf,
                "submit",
                str(DIGITS),
                "--site",
                "local",
                "--dry-run",
            ],
            "hpctf status RUN": [*self.hpctf, "status", str(run_dir)],
            "import tensorflow": [sys.executable, "-c", "import tensorflow"],
        }
        env = {**self.env(runs), "TF_CPP_MIN_LOG_LEVEL": "3"}

        def once(argv: list[str]) -> float:
            started = time.perf_counter()
            proc = subprocess.run(argv, env=env, capture_output=True, check=False)
            elapsed = time.perf_counter() - started
            if proc.returncode != 0:
                raise BenchError(f"{' '.join(argv)} failed: {proc.stderr.decode()[-2000:]}")
            return elapsed

        for _ in range(self.sizes.login_warmup):  # warm the page cache and .pyc files
            for argv in commands.values():
                once(argv)
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for index in range(self.sizes.login_runs):
            # Rotate the order each round: load on the machine hits every command alike.
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(round(once(commands[name]), 4))
            if (index + 1) % 10 == 0:
                say(f"login: {index + 1}/{self.sizes.login_runs} rounds")
        baseline = median(times["import tensorflow"])
        results: dict[str, Any] = {
            "runs": self.sizes.login_runs,
            "baseline": {
                "command": f"{Path(sys.executable).name} -c 'import tensorflow'",
                "median_s": round(baseline, 4),
                "times_s": times["import tensorflow"],
            },
            "commands": {},
            "goal_ratio_max": 0.1,
        }
        for name in names[:-1]:
            value = median(times[name])
            ratio = value / baseline
            # Each round's command against the import in the same round: the spread says
            # whether the rounds were enough for the median's distance from the goal.
            rounds = [
                t / base for t, base in zip(times[name], times["import tensorflow"], strict=True)
            ]
            results["commands"][name] = {
                "argv": " ".join(["hpctf", *commands[name][len(self.hpctf) :]]),
                "median_s": round(value, 4),
                "ratio": round(ratio, 4),
                "round_ratios": spread(rounds),
                "times_s": times[name],
            }
            self.row(
                benchmark=f"login: `{name}`",
                hpctf=f"{value:.3f} s",
                baseline=f"{baseline:.3f} s (`import tensorflow`)",
                result=f"{ratio:.3f} (middle half of rounds {middle_half(rounds)})",
                goal="<= 0.1",
                met=ratio <= 0.1,
            )
        results["met"] = all(c["ratio"] <= 0.1 for c in results["commands"].values())
        return results

    # --- 2. resolver --------------------------------------------------------------------------

    def resolver(self) -> dict[str, Any]:
        work = self.folder("resolver")
        out = work / "resolver.json"
        argv = [
            sys.executable,
            str(HERE / "bench_tfconfig.py"),
            "--scale",
            ",".join(map(str, self.sizes.resolver_nodes)),
            "--tasks",
            "1,4",
            "--repeat",
            str(self.sizes.resolver_repeat),
            "--json",
            str(out),
        ]
        log = work / "resolver.log"
        with log.open("wb") as handle:
            proc = subprocess.run(
                argv, env=self.env(work), stdout=handle, stderr=subprocess.STDOUT, check=False
            )
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"bench_tfconfig.py failed (exit {proc.returncode}):\n{tail(log)}")
        data: dict[str, Any] = json.loads(out.read_text())
        rows = data["rows"]
        at_4000 = [r for r in rows if r["nodes"] == 4000]
        slowest = max((r["hpctf"]["median_ms"] for r in at_4000), default=0.0)
        always_right = all(r["hpctf"]["right"] and r["hpctf"]["unique"] for r in rows)
        data["goal_ms_at_4000_max"] = 20
        data["hpctf_slowest_ms_at_4000"] = slowest
        data["hpctf_always_right"] = always_right
        data["met"] = bool(at_4000) and slowest <= 20 and always_right
        tf_4000 = [r["tf"] for r in at_4000 if "median_ms" in r.get("tf", {})]
        tf_wrong = sum(1 for r in rows if not r.get("tf", {}).get("right", False))
        self.row(
            benchmark="resolver: 4,000 nodes, 1 and 4 tasks/node (slowest)",
            hpctf=f"{slowest:.1f} ms, {'always right' if always_right else 'WRONG answers'}",
            baseline=(
                f"TF SlurmClusterResolver {max(t['median_ms'] for t in tf_4000):.1f} ms; "
                f"wrong in {tf_wrong} of {len(rows)} layouts"
                if tf_4000
                else "TF SlurmClusterResolver: not measured"
            ),
            result=f"{slowest:.1f} ms",
            goal="<= 20 ms, always right",
            met=data["met"],
        )
        return data

    # --- 3. runtime overhead ---------------------------------------------------------------

    def runtime(self) -> dict[str, Any]:
        sizes = self.sizes
        work = self.folder("runtime")
        steps, log_every = sizes.runtime_steps, sizes.runtime_log_every
        hpctf_runs: list[list[float]] = []
        plain_runs: list[list[float]] = []
        for index in range(sizes.runtime_rounds):  # alternate who goes first
            order = ("hpctf", "plain") if index % 2 == 0 else ("plain", "hpctf")
            for side in order:
                if side == "hpctf":
                    run_dir, _ = self.submit(
                        DIGITS,
                        [
                            f"train.steps={steps}",
                            f"train.log_every_steps={log_every}",
                            f"train.global_batch_size={GLOBAL_BATCH}",
                            f"checkpoint.every_steps={steps}",  # the stall is measured apart
                        ],
                        work / "runs",
                        work / f"hpctf-{index}.log",
                    )
                    rates = [rate for _, rate in windows(metrics(run_dir))]
                    hpctf_runs.append(rates[WARMUP_WINDOWS:])
                    self.finished_run = run_dir
                else:
                    plain_runs.append(self._plain(work, index, steps, log_every)[WARMUP_WINDOWS:])
                say(f"runtime: round {index + 1}/{sizes.runtime_rounds}: {side} done")
        hpctf_rate = median([w for run in hpctf_runs for w in run])
        plain_rate = median([w for run in plain_runs for w in run])
        ratio = hpctf_rate / plain_rate
        rounds = [median(h) / median(p) for h, p in zip(hpctf_runs, plain_runs, strict=True)]
        self.row(
            benchmark="runtime: digits, 2 local workers, global batch 64",
            hpctf=f"{hpctf_rate:.1f} steps/s",
            baseline=f"{plain_rate:.1f} steps/s (plain MWMS script)",
            result=f"{ratio:.3f} (rounds {each_round(rounds)})",
            goal=">= 0.97",
            met=ratio >= 0.97,
        )
        return {
            "model": "examples/digits (MLP 64 hidden, Adam 0.01)",
            "workers": 2,
            "global_batch": GLOBAL_BATCH,
            "steps": steps,
            "log_every_steps": log_every,
            "warmup_windows_left_out": WARMUP_WINDOWS,
            "rounds": sizes.runtime_rounds,
            "hpctf_steps_per_s": round(hpctf_rate, 3),
            "plain_steps_per_s": round(plain_rate, 3),
            "ratio": round(ratio, 4),
            "per_round_ratio": [round(r, 4) for r in rounds],
            "hpctf_windows": hpctf_runs,
            "plain_windows": plain_runs,
            "goal_ratio_min": 0.97,
            "met": ratio >= 0.97,
        }

    def _plain(self, work: Path, index: int, steps: int, log_every: int) -> list[float]:
        out = work / f"plain-{index}.json"
        log = work / f"plain-{index}.log"
        argv = [sys.executable, str(HERE / "plain_mwms.py"), "--workers", "2"]
        argv += ["--steps", str(steps), "--log-every", str(log_every)]
        argv += ["--batch", str(GLOBAL_BATCH), "--out", str(out)]
        with log.open("wb") as handle:
            proc = subprocess.run(
                argv, env=self.env(work), stdout=handle, stderr=subprocess.STDOUT, check=False
            )
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"plain_mwms.py failed (exit {proc.returncode}):\n{tail(log)}")
        rates: list[float] = json.loads(out.read_text())["steps_per_s"]
        return rates

    # --- 4. preemption and restart ------------------------------------------------------------

    def preemption(self) -> dict[str, Any]:
        work = self.folder("preemption")
        sets = [
            "train.steps=1000000",
            "train.log_every_steps=1",  # every step in metrics.jsonl: what ran, exactly
            "checkpoint.every_steps=1000000",  # no periodic save: only the agreed one
        ]
        results: dict[str, Any] = {"signals": {}}
        run_dirs = {}
        for number, signum in enumerate((signal.SIGUSR2, signal.SIGTERM)):
            result, run_dirs[signum] = self._preempt(work, signum, number, sets)
            results["signals"][signum.name] = result
            lost, seconds = result["steps_lost"], result["signal_to_exit_s"]
            say(f"preemption: {signum.name}: saved step {result['saved_step']}, {lost} lost")
            self.row(
                benchmark=f"preemption: {signum.name} to rank 1 of 2",
                hpctf=f"{lost} steps lost; checkpoint complete "
                f"{result['signal_to_checkpoint_s']:.2f} s and all ranks exited {seconds:.1f} s "
                "after the signal",
                baseline=f"saved step {result['saved_step']} (signal at step "
                f"{result['step_at_signal']})",
                result=f"{lost} lost",
                goal="0 lost" if signum == signal.SIGUSR2 else "(report)",
                met=lost == 0 if signum == signal.SIGUSR2 else None,
            )
        results["restart"] = self._restart(work, run_dirs[signal.SIGUSR2], sets)
        warned = results["signals"]["SIGUSR2"]["steps_lost"] == 0
        results["met"] = warned and results["restart"]["met"]
        return results

    def _preempt(
        self, work: Path, signum: signal.Signals, number: int, sets: list[str]
    ) -> tuple[dict[str, Any], Path]:
        """Two workers started directly with srun's environment (no launcher that would stop
        the other rank for us); ``signum`` to rank 1 once rank 0 logged ``preempt_after``."""
        from hpctf.login.submitting.local import task_environment  # login wing: no TensorFlow

        name = signum.name
        runs = work / f"runs-{name}"
        render = [*self.hpctf, "render", str(DIGITS), "--site", "local"]
        render += ["-o", str(work / f"{name}.sbatch")]
        render += [arg for setting in sets for arg in ("--set", setting)]
        subprocess.run(render, env=self.env(runs), check=True, capture_output=True)
        (run_dir,) = runs.iterdir()
        logs = [work / f"{name}-rank-{rank}.log" for rank in range(2)]
        job_id = 20000 + os.getpid() % 20000 + number
        procs = [
            subprocess.Popen(
                [*self.hpctf, "worker", str(run_dir)],
                env=task_environment(self.env(runs), job_id, 2, rank),
                stdout=logs[rank].open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for rank in range(2)
        ]
        after = self.sizes.preempt_after
        exited: list[float | None] = [None, None]

        def trained() -> int:
            records = windows(metrics(run_dir))
            return records[-1][0] if records else 0

        def ready() -> bool:
            return trained() >= after or any(p.poll() is not None for p in procs)

        try:
            wait_until(ready, 300, f"step {after} of the {name} run")
            if any(p.poll() is not None for p in procs):
                raise BenchError(f"a worker ended before the signal:\n{tail(logs[0])}")
            at_signal = trained()
            sent, sent_wall = time.perf_counter(), time.time()
            os.kill(procs[1].pid, signum)

            def all_exited() -> bool:
                for rank, proc in enumerate(procs):
                    if exited[rank] is None and proc.poll() is not None:
                        exited[rank] = time.perf_counter() - sent
                return all(e is not None for e in exited)

            wait_until(all_exited, 120, f"the workers to exit after {name}", poll=0.005)
        finally:
            for proc in procs:
                stop(proc)
        codes = [proc.returncode for proc in procs]
        texts = [log.read_text(errors="replace") for log in logs]
        saved = [
            int(found)
            for text in texts
            for found in re.findall(r"preempted: saved step (\d+);", text)
        ]
        if codes != [75, 75] or len(saved) != 2 or saved[0] != saved[1]:
            raise BenchError(
                f"{name}: exit codes {codes}, saved steps {saved}:\n"
                f"{texts[0][-2000:]}\n{texts[1][-2000:]}"
            )
        last = max(step for step, _ in windows(metrics(run_dir)))
        # The chief's checkpoint is complete when TF replaces the ``checkpoint`` state file.
        state = run_dir / "checkpoints" / "checkpoint"
        result = {
            "signalled_rank": 1,
            "step_at_signal": at_signal,
            "saved_step": saved[0],
            "steps_after_signal_before_save": saved[0] - at_signal,
            "last_step_trained": last,
            "steps_lost": max(0, last - saved[0]),
            "signal_to_exit_s": round(max(e for e in exited if e is not None), 3),
            "signal_to_checkpoint_s": round(state.stat().st_mtime - sent_wall, 3),
            "signal_to_exit_s_per_rank": [round(e or 0.0, 3) for e in exited],
            "exit_codes": codes,
        }
        return result, run_dir

    def _first_step(
        self, argv: list[str], runs: Path, run_dir: Path | None, step: int, log: Path
    ) -> dict[str, float]:
        """Seconds from starting ``argv`` (submit or resubmit) until ``step`` is in the run's
        metrics.jsonl, and until each phase showed in rank 0's log; then the launcher is
        stopped (it kills its workers, as srun would)."""

        def size(path: Path) -> int:
            return path.stat().st_size if path.exists() else 0

        offsets = {"metrics": 0, "log": 0}
        if run_dir is not None:
            offsets = {
                "metrics": size(run_dir / "metrics.jsonl"),
                "log": size(run_dir / "logs" / "rank-0.log"),
            }
        phases: dict[str, float] = {}
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            env=self.env(runs),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def new_text(path: Path, offset: int) -> str:
            if not path.exists():
                return ""
            with path.open("rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")

        def reached() -> bool:
            nonlocal run_dir
            if proc.poll() is not None:
                raise BenchError(f"{' '.join(argv)} ended (exit {proc.returncode}):\n{tail(log)}")
            if run_dir is None:
                found = list(runs.iterdir()) if runs.exists() else []
                if not found:
                    return False
                run_dir = found[0]
            now = time.perf_counter() - started
            text = new_text(run_dir / "logs" / "rank-0.log", offsets["log"])
            for phase, marker in PHASES:
                if phase not in phases and marker.search(text):
                    phases[phase] = round(now, 3)
            metrics_text = new_text(run_dir / "metrics.jsonl", offsets["metrics"])
            if f'"step": {step},' in metrics_text:
                phases["first_step"] = round(now, 3)
                return True
            return False

        try:
            wait_until(reached, 300, f"step {step} of {' '.join(argv[-3:])}")
        finally:
            stop(proc, signal.SIGTERM)
        return phases

    def _restart(self, work: Path, run_dir: Path, sets: list[str]) -> dict[str, Any]:
        saved = max(
            int(p.name.split("-")[1].split(".")[0])
            for p in (run_dir / "checkpoints").glob("ckpt-*.index")
        )
        runs: dict[str, list[dict[str, float]]] = {"restart": [], "cold": []}
        for index in range(self.sizes.restart_rounds):
            order = ("restart", "cold") if index % 2 == 0 else ("cold", "restart")
            for side in order:
                if side == "restart":
                    argv = [*self.hpctf, "resubmit", str(run_dir)]
                    phases = self._first_step(
                        argv, run_dir.parent, run_dir, saved + 1, work / f"restart-{index}.log"
                    )
                else:
                    cold_runs = work / f"runs-cold-{index}"
                    argv = [*self.hpctf, "submit", str(DIGITS), "--site", "local"]
                    argv += [arg for setting in sets for arg in ("--set", setting)]
                    phases = self._first_step(argv, cold_runs, None, 1, work / f"cold-{index}.log")
                runs[side].append(phases)
                say(
                    f"restart: round {index + 1}: {side} {phases['first_step']:.1f} s to its "
                    f"first step ({', '.join(f'{k} {v:.1f}' for k, v in phases.items())})"
                )
        resumed = "resumed from" in (run_dir / "logs" / "rank-0.log").read_text(errors="replace")
        restart = median([p["first_step"] for p in runs["restart"]])
        cold = median([p["first_step"] for p in runs["cold"]])
        ratio = restart / cold
        rounds = [
            r["first_step"] / c["first_step"]
            for r, c in zip(runs["restart"], runs["cold"], strict=True)
        ]

        def phase_medians(side: str) -> dict[str, float]:
            """Median seconds spent in each phase (from the end of the one before)."""
            result, before = {}, "launch"
            names = [name for name, _ in PHASES] + ["first_step"]
            for name in names:
                spans = [
                    p[name] - (p[before] if before != "launch" else 0.0)
                    for p in runs[side]
                    if name in p and (before == "launch" or before in p)
                ]
                if spans:
                    result[f"{before}->{name}"] = round(median(spans), 3)
                before = name
            return result

        self.row(
            benchmark=f"restart: `hpctf resubmit` to the first resumed step (from step {saved})",
            hpctf=f"{restart:.1f} s",
            baseline=f"{cold:.1f} s (cold start of the same job to step 1)",
            result=f"{ratio:.3f} (rounds {each_round(rounds)})",
            goal="<= 1.15",
            met=ratio <= 1.15 and resumed,
        )
        return {
            "resumed_from_step": saved,
            "resumed_message_in_log": resumed,
            "restart_s": [p["first_step"] for p in runs["restart"]],
            "cold_start_s": [p["first_step"] for p in runs["cold"]],
            "restart_median_s": round(restart, 3),
            "cold_start_median_s": round(cold, 3),
            "ratio": round(ratio, 4),
            "per_round_ratio": [round(r, 4) for r in rounds],
            "restart_phases_s": phase_medians("restart"),
            "cold_start_phases_s": phase_medians("cold"),
            "restart_runs": runs["restart"],
            "cold_start_runs": runs["cold"],
            "goal_ratio_max": 1.15,
            "met": ratio <= 1.15 and resumed,
        }

    # --- 5. checkpoint stall --------------------------------------------------------------

    def stall(self) -> dict[str, Any]:
        sizes = self.sizes
        work = self.folder("stall")
        digits = self._stall_run(
            work,
            "digits",
            {"builder": "digits:build"},
            sizes.stall_steps,
            sizes.stall_log_every,
            sizes.stall_every,
            nodes=2,
        )
        width, depth = sizes.dense_width, sizes.dense_depth
        dense = self._stall_run(
            work,
            "dense",
            {"builder": "bench_entries:dense_stack", "width": width, "depth": depth},
            sizes.dense_steps,
            sizes.dense_log_every,
            sizes.dense_every,
            nodes=2,
        )
        dense["model"] = f"Dense stack {depth} x {width}, Adam"
        return {"digits": digits, "dense": dense}

    def _stall_run(
        self,
        work: Path,
        name: str,
        args: dict[str, Any],
        steps: int,
        log_every: int,
        every: int,
        nodes: int,
        train: dict[str, Any] | None = None,
        gpus: str = "",
    ) -> dict[str, Any]:
        """hpctf's built-in loop with each save timed (bench_entries.timed_saves)."""
        experiment = write_experiment(
            work / name,
            f"stall-{name}",
            nodes,
            {
                "loop": "custom",
                "entry": "bench_entries:timed_saves",
                "args": args,
                "steps": steps,
                "global_batch_size": GLOBAL_BATCH,
                "log_every_steps": log_every,
                **(train or {}),
            },
            every,
        )
        run_dir, elapsed = self.submit(
            experiment, [], work / "runs", work / f"{name}.log", gpus=gpus
        )
        records = metrics(run_dir)
        saves = [r["bench"]["save_s"] for r in records if "save_s" in r.get("bench", {})]
        weights = next(
            (r["bench"]["weights_mb"] for r in records if "weights_mb" in r.get("bench", {})), 0.0
        )
        # The save at step s runs after the log of step s, so it falls in the window that
        # starts there; windows that start at no save time the steps alone.
        clean = [
            rate
            for end, rate in windows(records)[1:]  # the first window holds the tracing
            if (end - log_every) % every != 0
        ]
        if not saves or not clean:
            raise BenchError(f"stall {name}: no saves or no clean windows in {run_dir}")
        step_s = 1 / median(clean)
        later = saves[1:] or saves
        save_s = median(later)
        result = {
            "model": args["builder"],
            "weights_mb": round(weights, 2),
            "checkpoint_mb": round(checkpoint_mb(run_dir), 2),
            "workers": nodes,
            "steps": steps,
            "checkpoint_every_steps": every,
            "saves": len(saves),
            "first_save_s": round(saves[0], 4),
            "save_s": round(save_s, 4),
            "save_s_all": [round(s, 4) for s in saves],
            "step_s": round(step_s, 5),
            "save_in_steps": round(save_s / step_s, 2),
            "overhead_at_every_steps": round(save_s / (every * step_s + save_s), 4),
            "run_s": round(elapsed, 1),
        }
        self.row(
            benchmark=f"checkpoint stall: {name} ({megabytes(weights)} of weights, "
            f"{megabytes(result['checkpoint_mb'])} checkpoint)",
            hpctf=f"{save_s:.3f} s per save (first {saves[0]:.3f} s)",
            baseline=f"{step_s * 1000:.1f} ms per step",
            result=f"{result['save_in_steps']:.1f} steps per save; "
            f"{100 * result['overhead_at_every_steps']:.1f} % of the time when saving every "
            f"{every} steps",
            goal="(report)",
            met=None,
        )
        say(f"stall: {name}: {save_s:.3f} s per save, {step_s * 1000:.1f} ms per step")
        return result

    # --- 6. soak -------------------------------------------------------------------------

    def soak_step(self) -> int:
        """The last step the soak job has logged; 0 before it has."""
        found = sorted((self.work / "soak" / "runs").glob("*/metrics.jsonl"))
        if not found:
            return 0
        lines = found[0].read_text().splitlines()
        for line in reversed(lines):
            with contextlib.suppress(ValueError, KeyError):
                return int(json.loads(line)["step"])  # a line being written fails: the one before
        return 0

    def soak(self) -> dict[str, Any]:
        """One long job of the smallest step hpctf's built-in loop can take (the model
        ``bench_entries.soak_task``, a global batch of 2): what is soaked is hpctf's worker
        around the step (watchdog, preemption agreement every 10 steps, logging, saves) and
        TensorFlow's MWMS under it, not a model; a step costs about what 2 RING workers take
        to all-reduce."""
        sizes = self.sizes
        steps = sizes.soak_steps
        work = self.folder("soak")
        say(f"soak: {steps} steps of bench_entries:soak_task in one job")
        experiment = write_experiment(
            work,
            "soak",
            2,
            {
                "entry": "bench_entries:soak_task",
                "steps": steps,
                "global_batch_size": SOAK_BATCH,
                "log_every_steps": sizes.soak_log_every,
            },
            sizes.soak_every,
        )
        try:
            run_dir, elapsed = self.submit(experiment, [], work / "runs", work / "soak.log")
        finally:
            self.soak_ended.set()
        # The other sections' span in soak steps; still running when the soak ended: to its end.
        beside = [*self.beside_soak, steps][:2] if self.beside_soak else []
        records = [r for r in metrics(run_dir) if "threads" in r and "rss_mb" in r]
        if len(records) < 4:
            raise BenchError(f"soak: too few logged steps in {run_dir}")
        warm = steps // 20  # 5 %: past tracing, caches and the first checkpoints
        after = [r for r in records if r["step"] >= warm]
        start, end = after[0], after[-1]
        tenth = max(1, len(after) // 10)
        rate_start = median([r["steps_per_s"] for r in after[:tenth]])
        # Speed is compared between windows the soak ran alone (but for other people's load):
        # the start's always (the other sections wait for it), the end's where they had ended.
        last = after[-tenth:]
        alone = [r for r in last if not beside or r["step"] - sizes.soak_log_every >= beside[1]]
        end_alone = len(alone) >= max(1, tenth // 2)
        rate_end = median([r["steps_per_s"] for r in (alone if end_alone else last)])
        # Least squares RSS slope over the run after the warm-up, MB per 1,000 steps.
        xs = [r["step"] for r in after]
        ys = [r["rss_mb"] for r in after]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        threads_flat = end["threads"] <= start["threads"] + 2
        rss_growth = end["rss_mb"] - start["rss_mb"]
        rss_flat = rss_growth <= 64
        rate_flat = rate_end >= 0.9 * rate_start
        result = {
            "model": "bench_entries:soak_task (one Dense layer without bias, 16 weights, SGD)",
            "workers": 2,
            "global_batch": SOAK_BATCH,
            "log_every_steps": sizes.soak_log_every,
            "checkpoint_every_steps": sizes.soak_every,
            "steps": steps,
            "done": (run_dir / "DONE").exists(),
            "run_s": round(elapsed, 1),
            "logged_samples": len(records),
            "start_step": start["step"],
            "end_step": end["step"],
            "first_logged": {k: records[0][k] for k in ("step", "threads", "rss_mb")},
            "threads_start": start["threads"],
            "threads_end": end["threads"],
            "threads_max": max(r["threads"] for r in records),
            "rss_mb_start": start["rss_mb"],
            "rss_mb_end": end["rss_mb"],
            "rss_mb_per_1000_steps": round(slope * 1000, 3),
            "steps_per_s_start": rate_start,
            "steps_per_s_end": rate_end,
            "other_sections_ran_at_steps": beside,
            "end_window_alone": end_alone,
            "windows_in_end": len(alone) if end_alone else len(last),
            "threads_flat": threads_flat,
            "rss_flat": rss_flat,
            "steps_per_s_flat": rate_flat,
            "goal": "threads +2 at most, RSS +64 MB at most, steps/s -10 % at most",
            "met": threads_flat and rss_flat and rate_flat,
        }
        self.row(
            benchmark=f"soak: {steps:,} steps in one job ({elapsed / 60:.1f} min; 2 workers, "
            f"the smallest step, a save every {sizes.soak_every:,}), from step {start['step']:,}",
            hpctf=f"threads {start['threads']} -> {end['threads']}; RSS "
            f"{start['rss_mb']:.0f} -> {end['rss_mb']:.0f} MB "
            f"({slope * 1000:+.2f} MB/1,000 steps); "
            f"{rate_start:.0f} -> {rate_end:.0f} steps/s"
            + ("" if end_alone else " (the end beside other sections)"),
            baseline="its own start",
            result=f"threads {'flat' if threads_flat else 'GROW'}, RSS "
            f"{'flat' if rss_flat else f'+{rss_growth:.0f} MB'}, steps/s "
            f"{'flat' if rate_flat else 'DROP'}",
            goal="flat",
            met=result["met"],
        )
        return result

    # --- 7. GPU mode ----------------------------------------------------------------------

    def gpu_runtime(self) -> dict[str, Any]:
        """benchmarks/gpu_check.py: ResNet-50 through hpctf's worker against plain TF."""
        work = self.folder("gpu_runtime")
        out = work / "gpu-check.json"
        argv = [sys.executable, str(HERE / "gpu_check.py"), "--json", str(out)]
        argv += ["--rounds", str(self.sizes.gpu_rounds), "--steps", str(self.sizes.gpu_steps)]
        log = work / "gpu-check.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        with log.open("wb") as handle:
            proc = subprocess.run(argv, env=env, stdout=handle, stderr=subprocess.STDOUT)
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"gpu_check.py failed (exit {proc.returncode}):\n{tail(log)}")
        data: dict[str, Any] = json.loads(out.read_text())
        ratio = data["ratio"]
        self.row(
            benchmark=f"GPU runtime: ResNet-50, {data['precision']}, XLA, {data['device']}",
            hpctf=f"{data['hpctf_images_per_s']:.0f} images/s",
            baseline=f"{data['plain_images_per_s']:.0f} images/s (plain TF script)",
            result=f"{ratio:.3f}",
            goal=">= 0.97",
            met=ratio >= 0.97,
        )
        data["goal_ratio_min"] = 0.97
        data["met"] = ratio >= 0.97
        return data

    def gpu_stall(self) -> dict[str, Any]:
        """The checkpoint stall of ResNet-50 (~100 MB of float32 weights) on one GPU."""
        work = self.folder("gpu_stall")
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "0"
        args = {
            "builder": "gpu_check:build",
            "image_size": 224,
            "classes": 1000,
            "examples": 512,
            "shuffle_buffer": 512,
        }
        steps = self.sizes.gpu_steps
        result = self._stall_run(
            work,
            "resnet50",
            args,
            steps,
            10,
            max(20, steps // 6),
            nodes=1,
            train={"mixed_precision": True, "jit_compile": True, "communication": "nccl"},
            gpus=gpus,
        )
        result["model"] = "ResNet-50 (gpu_check:build), mixed_float16, XLA, NCCL"
        return result


# --- the driver -------------------------------------------------------------------------------


def gpus_here() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists; empty without the tool or the driver."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        proc = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
        info["cpu"] = model.group(1).strip() if model else platform.processor()
    with contextlib.suppress(OSError, AttributeError, ValueError):
        meminfo = Path("/proc/meminfo").read_text()
        found = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
        info["memory_gb"] = round(int(found.group(1)) / 1024**2, 1) if found else None
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    for package in ("tensorflow-cpu", "tensorflow", "keras"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[package] = importlib.metadata.version(package)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["hpctf_commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    return info


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = [
        "| benchmark | hpctf | against | result | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(
            f"| {row['benchmark']} | {row['hpctf']} | {row['baseline']} | {row['result']} "
            f"| {row['goal']} | {met} |"
        )
    return "\n".join(lines)


def resolver_table(data: dict[str, Any]) -> str:
    """Every resolver layout, hpctf beside TF's resolver."""
    lines = [
        "| nodes x tasks/node | names | hpctf cluster_spec | TF SlurmClusterResolver |",
        "|---|---|---|---|",
    ]
    for row in data["rows"]:
        ours, theirs = row["hpctf"], row.get("tf", {})
        ok = "right" if ours["right"] and ours["unique"] else "WRONG"
        if "error" in theirs:
            tf_text = f"failed: {theirs['error'][:60]}"
        elif theirs:
            verdict = (
                "right"
                if theirs["right"]
                else f"{theirs['wrong_ranks']:,} of {row['workers']:,} ranks wrong"
            )
            tf_text = f"{milliseconds(theirs['median_ms'])}, {verdict}"
        else:
            tf_text = "not measured"
        lines.append(
            f"| {row['nodes']:,} x {row['tasks_per_node']} | {row['names']} "
            f"| {milliseconds(ours['median_ms'])}, {ok} | {tf_text} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="hpctf-bench-"))
    try:
        yield path
    except BaseException:
        say(f"(work directory kept for inspection: {path})")
        raise
    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="sections: " + ", ".join(SECTIONS) + "; with --gpu: " + ", ".join(GPU_SECTIONS),
    )
    parser.add_argument("--tiny", action="store_true", help="CI size: about a minute")
    parser.add_argument(
        "--only", action="append", default=[], help="run only these sections (comma-separated)"
    )
    parser.add_argument(
        "--json", type=Path, default=Path("hpctf-benchmarks.json"), help="write results here"
    )
    parser.add_argument("--soak-steps", type=int, help="steps of the soak job (default 100,000)")
    parser.add_argument("--login-runs", type=int, help="rounds of the login commands (default 15)")
    parser.add_argument("--keep", type=Path, help="keep run directories and logs in this folder")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU mode of runtime and stall (ResNet-50, mixed precision); needs GPUs",
    )
    args = parser.parse_args(argv)

    sizes = TINY if args.tiny else FULL
    changes = {}
    if args.soak_steps:
        changes["soak_steps"] = args.soak_steps
    if args.login_runs:
        changes["login_runs"] = args.login_runs
    sizes = replace(sizes, **changes)
    known = GPU_SECTIONS if args.gpu else SECTIONS
    chosen = [name.strip() for value in args.only for name in value.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.gpu:
        found = gpus_here()
        if not found:
            print(
                "Error: --gpu needs NVIDIA GPUs, and this machine has none (nvidia-smi -L "
                "lists no GPU); the GPU mode (ResNet-50 through benchmarks/gpu_check.py and "
                "its checkpoint stall) runs on a GPU node; without --gpu the CPU benchmarks run",
                file=sys.stderr,
            )
            return 2
        say(f"GPUs: {'; '.join(found)}")
    order = GPU_SECTIONS if args.gpu else ORDER
    sections = [name for name in order if not chosen or name in chosen]

    results: dict[str, Any] = {
        "mode": ("gpu-" if args.gpu else "") + ("tiny" if args.tiny else "full"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "sizes": asdict(sizes),
        "sections": {},
        "seconds": {},
    }
    # Two lanes at once. The tiny run's numbers say nothing: CI time, not measurement (each
    # worker mostly waits for its peer's collectives, and a start for TensorFlow's import).
    # The full run's soak is 100,000 steps of a 2-worker job, over 10 minutes on the shared
    # 2-core VM: the other sections run beside it once its start is measured (15 % of its
    # steps), and its end is measured after they are done. Their ratios alternate both sides
    # under the same background; the soak's threads and RSS do not depend on load.
    # Login reads the run that runtime leaves, so both are always in one lane.
    beside_soak = not args.tiny and "soak" in sections and len(sections) > 1
    if args.tiny:
        lanes = [[n for n in sections if n not in TINY_SECOND_LANE]]
        lanes.append([n for n in sections if n in TINY_SECOND_LANE])
    elif beside_soak:
        lanes = [[n for n in sections if n != "soak"], ["soak"]]
    else:
        lanes = [sections]
    lanes = [lane for lane in lanes if lane]
    # The resolver's goal is milliseconds, not a ratio: it runs first, alone (20-30 s), not
    # beside the soak (39.8 ms at 4,000 x 4 beside it, 7-12 ms alone, at load average 7-9).
    alone_first = ["resolver"] if beside_soak and "resolver" in sections else []
    lanes = [[n for n in lane if n not in alone_first] for lane in lanes]
    lock = threading.Lock()
    started = time.perf_counter()
    with workdir(args.keep) as work:
        bench = Bench(sizes, work)

        def run_lane(lane: list[str], gated: bool) -> None:
            """Run ``lane``'s sections in order; ``gated``: after the soak's first 15 %."""
            if gated:
                wait_until(
                    lambda: (
                        bench.soak_step() >= 0.15 * sizes.soak_steps or bench.soak_ended.is_set()
                    ),
                    7200,
                    "the soak's first 15 %",
                    poll=1.0,
                )
                bench.beside_soak.append(bench.soak_step())
                say(f"the other sections start beside the soak, at its step {bench.soak_step()}")
            try:
                for name in lane:
                    if bench.failed.is_set():
                        return
                    say(f"== {name}")
                    bench.section = name
                    began = time.perf_counter()
                    found = getattr(bench, name)()
                    with lock:
                        results["sections"][name] = found
                        results["seconds"][name] = round(time.perf_counter() - began, 1)
                        results["exit_after_done_s"] = bench.exit_after_done
                        args.json.write_text(json.dumps(results, indent=2) + "\n")  # so far
            except BaseException:
                bench.failed.set()
                raise
            finally:
                if gated:
                    bench.beside_soak.append(bench.soak_step())

        if alone_first:
            run_lane(alone_first, gated=False)
        with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
            gates = [beside_soak and "soak" not in lane for lane in lanes]
            for future in [pool.submit(run_lane, *both) for both in zip(lanes, gates, strict=True)]:
                future.result()  # a lane's BenchError, raised here
    results["seconds"]["total"] = round(time.perf_counter() - started, 1)
    results["lanes"] = [alone_first, *lanes] if alone_first else lanes
    with contextlib.suppress(OSError):
        results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    rows = sorted(bench.rows, key=lambda row: known.index(row["section"]))  # stable
    results["table"] = rows
    args.json.write_text(json.dumps(results, indent=2) + "\n")

    info = results["machine"]
    print(
        f"hpctf benchmarks ({results['mode']}), {results['date']}: {info['cpus']} CPUs "
        f"({info.get('cpu', '?')}), Python {info['python']}, TensorFlow "
        f"{info.get('tensorflow-cpu') or info.get('tensorflow', '?')}, "
        f"{results['seconds']['total'] / 60:.1f} min\n"
    )
    print(table(rows))
    if "resolver" in results["sections"]:
        print()
        print(resolver_table(results["sections"]["resolver"]))
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)
