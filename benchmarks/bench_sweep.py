"""The sweep section: planning a 2,500-point sweep (`hpctf sweep ... --dry-run`, whole process)
against rendering one point (`hpctf render`), alternated."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from harness import DIGITS, BenchError, Harness, median, say

SWEEP_POINTS = 2500  # issue #21: "a 2,500-point dry run within 1 s here"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``argv`` to the end, output discarded: (wall seconds, CPU seconds, user + system,
    of that process alone; on a loaded machine the wall time is mostly waiting for a core)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    errors = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{errors[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime


class SweepBench(Harness):
    """One section's measurements, over the shared harness."""

    def sweep(self) -> dict[str, Any]:
        work = self.folder("sweep")
        sites = work / "sites"
        sites.mkdir(parents=True, exist_ok=True)
        # The array limit from the site: a dry run asks no Slurm.
        (sites / "bench.yaml").write_text(
            "name: bench\nextends: local-slurm\nsweep: {max_array_size: 1001}\n"
        )
        env = {**self.env(work / "runs"), "HPCTF_SITE_PATH": str(sites)}
        seeds, logs = ",".join(map(str, range(50))), ",".join(map(str, range(1, 51)))
        sweep = [*self.hpctf, "sweep", str(DIGITS), "--site", "bench", "--grid",
                 f"train.seed={seeds}", "--grid", f"train.log_every_steps={logs}",
                 "--max-points", str(SWEEP_POINTS), "--dry-run"]  # fmt: skip
        render = [*self.hpctf, "render", str(DIGITS), "--site", "bench"]
        samples: dict[str, list[tuple[float, float]]] = {"sweep": [], "render": []}
        for index in range(self.sizes.sweep_rounds):
            for name in ("sweep", "render") if index % 2 == 0 else ("render", "sweep"):
                samples[name].append(timed(sweep if name == "sweep" else render, env))
        wall = {name: median([w for w, _ in found]) for name, found in samples.items()}
        cpu = {name: median([c for _, c in found]) for name, found in samples.items()}
        load = os.getloadavg()[0]
        self.row(
            benchmark=f"sweep plan: `hpctf sweep --dry-run`, {SWEEP_POINTS:,} points "
            f"({len(samples['sweep'])} round(s), load average {load:.1f})",
            hpctf=f"{cpu['sweep']:.2f} s CPU, {wall['sweep']:.2f} s wall",
            baseline=f"`hpctf render`, one point: {cpu['render']:.2f} s CPU, "
            f"{wall['render']:.2f} s wall",
            result=f"{cpu['sweep'] / cpu['render']:.1f} x one point's CPU time",
            goal="<= 1 s CPU",
            met=cpu["sweep"] <= 1.0,
        )
        say(f"sweep: {cpu['sweep']:.2f} s CPU, {wall['sweep']:.2f} s wall for {SWEEP_POINTS}")
        return {
            "points": SWEEP_POINTS,
            "sweep_wall_s": [round(w, 3) for w, _ in samples["sweep"]],
            "sweep_cpu_s": [round(c, 3) for _, c in samples["sweep"]],
            "render_wall_s": [round(w, 3) for w, _ in samples["render"]],
            "render_cpu_s": [round(c, 3) for _, c in samples["render"]],
            "load_average": round(load, 2),
        }
