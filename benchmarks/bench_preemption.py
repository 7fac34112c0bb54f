"""The preemption section: steps lost and seconds to exit on a warning or a preemption,
and resume against a cold start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import (
    DIGITS,
    PHASES,
    BenchError,
    Harness,
    each_round,
    median,
    metrics,
    say,
    stop,
    tail,
    wait_until,
    windows,
)


class PreemptionBench(Harness):
    """One section's measurements, over the shared harness."""

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
        def newest() -> int:
            return max(
                int(p.name.split("-")[1].split(".")[0])
                for p in (run_dir / "checkpoints").glob("ckpt-*.index")
            )

        saved = newest()
        runs: dict[str, list[dict[str, float]]] = {"restart": [], "cold": []}
        for index in range(self.sizes.restart_rounds):
            order = ("restart", "cold") if index % 2 == 0 else ("cold", "restart")
            for side in order:
                if side == "restart":
                    # Each round resumes where the one before was stopped (its SIGTERM
                    # saves the next agreed step).
                    argv = [*self.hpctf, "resubmit", str(run_dir)]
                    phases = self._first_step(
                        argv, run_dir.parent, run_dir, newest() + 1, work / f"restart-{index}.log"
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
