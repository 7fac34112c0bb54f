"""The login section: hpctf's login commands, whole processes, against `import tensorflow`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import DIGITS, BenchError, Harness, median, middle_half, say, spread


class LoginBench(Harness):
    """One section's measurements, over the shared harness."""

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
