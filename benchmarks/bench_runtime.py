"""The runtime section: steps/s of hpctf against the plain MWMS loop (plain_mwms.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import (
    DIGITS,
    GLOBAL_BATCH,
    HERE,
    WARMUP_WINDOWS,
    BenchError,
    Harness,
    each_round,
    median,
    metrics,
    say,
    tail,
    windows,
)


class RuntimeBench(Harness):
    """One section's measurements, over the shared harness."""

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
