"""The search section: a search (TPE + ASHA, `hpctf sweep` of an experiment with `sweep:`)
against the equivalent full grid (`hpctf sweep --grid`) over the same discretized space, both
on the real Slurm test cluster (benchmarks/slurm_cluster.py, with accounting) in one run, one
after the other. The task is tests/search_task.py: a tiny linear model whose evaluation's
``objective`` has a known best at ``x = 0.7, depth = 2``; its steps sleep (no CPU), so that a
trial's training, not TensorFlow's start, is most of what it costs, as on a real cluster.

Figures: the node-hours of each from Slurm's accounting as ``hpctf status SWEEP --json`` sums
them (every start of every job, sacct; a search's array tasks each once, however many trials
each ran), their ratio (goal: <= 1/3, #33), and whether the search reached the grid's best
value (within 1e-4: every trial learns the same curve, so the grid's best is the optimum's).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import REPO, BenchError, Harness, say
from slurm_cluster import slurm_cluster, slurm_missing, slurm_required

GOAL_RATIO = 1 / 3
REACHED_TOLERANCE = 1e-4

EXPERIMENT = """\
name: {name}
resources: {{nodes: 1, tasks_per_node: 1, time: "00:20:00"}}
train:
  entry: search_task:build
  python_path: [{tests}]
  args: {{step_seconds: {step_seconds}}}
  steps: {steps}
  global_batch_size: 8
  log_every_steps: {evals}
  eval_every_steps: {evals}
  save_model: false
checkpoint: {{every_steps: {every}}}
"""
SEARCH = """\
sweep:
  parameters:
    train.args.x: {{type: float, low: 0.0, high: 1.0, step: {x_step}}}
    train.args.depth: {{type: int, low: 0, high: {depth_high}}}
  objective: {{metric: eval.objective, direction: minimize}}
  trials: {trials}
  parallel: {parallel}
  sampler: tpe
  seed: 1
  pruner: {{kind: asha, min_evals: 1, reduction_factor: 3}}
"""


class SearchBench(Harness):
    def search(self) -> dict[str, Any]:
        """The search against the full grid: node-hours, best values, the ratio."""
        reason = slurm_missing()
        if reason:
            if slurm_required():
                raise BenchError(f"search: {reason}")
            self.row(benchmark="search: TPE + ASHA against the full grid", hpctf="-",
                     baseline="-", result=f"skipped: {reason}", goal="<= 1/3",
                     met=None)  # fmt: skip
            return {"skipped": reason}
        s = self.sizes
        folder = self.folder("search")
        common = {"tests": str(REPO / "tests"), "step_seconds": s.search_step_seconds,
                  "steps": s.search_steps, "evals": s.search_eval_every,
                  "every": s.search_eval_every * 2}  # fmt: skip
        grid_file, search_file = folder / "grid.yaml", folder / "search.yaml"
        grid_file.write_text(EXPERIMENT.format(name="grid", **common))
        search_file.write_text(EXPERIMENT.format(name="search", **common) + SEARCH.format(
            x_step=s.search_x_step, depth_high=s.search_depths - 1, trials=s.search_trials,
            parallel=s.search_parallel))  # fmt: skip
        xs = [round(i * s.search_x_step, 6) for i in range(round(1 / s.search_x_step) + 1)]
        grid_args = ["--grid", "train.args.x=" + ",".join(str(x) for x in xs),
                     "--grid", "train.args.depth=" + ",".join(map(str, range(s.search_depths))),
                     "--max-running", str(s.search_slots)]  # fmt: skip
        with slurm_cluster("search", nodes=s.search_nodes, accounting=True) as cluster:
            env = {**self.env(folder / "runs"), **cluster.env}
            grid = self._sweep(env, [str(grid_file), *grid_args], folder / "grid.log")
            search = self._sweep(env, [str(search_file)], folder / "search.log")
            grid_doc = self._accounted(env, grid, len(xs) * s.search_depths)
            search_doc = self._accounted(env, search, 0)
        return self._figures(grid_doc, search_doc, len(xs) * s.search_depths)

    def _sweep(self, env: dict[str, str], args: list[str], log: Path) -> dict[str, Any]:
        """``hpctf sweep ARGS --site local-slurm`` and its array(s) to the end."""
        started = time.perf_counter()
        argv = [*self.hpctf, "sweep", *args, "--site", "local-slurm"]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        log.write_text(proc.stdout + proc.stderr)
        found = re.search(r"^sweep directory: (\S+)$", proc.stdout, re.M)
        if proc.returncode != 0 or not found:
            raise BenchError(f"search: {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        arrays = re.findall(r"^submitted job array (\d+)", proc.stdout, re.M)
        deadline = time.monotonic() + 3600
        while True:
            argv = ["squeue", "--noheader", f"--jobs={','.join(arrays)}"]
            queue = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if queue.returncode == 0 and not queue.stdout.strip():
                break
            if time.monotonic() > deadline:
                raise BenchError(f"search: {found.group(1)} still running after an hour")
            time.sleep(2)
        wall = time.perf_counter() - started
        say(f"search: {found.group(1)} ended after {wall:.0f} s")
        return {"path": found.group(1), "arrays": arrays, "wall_s": wall}

    def _accounted(self, env: dict[str, str], sweep: dict[str, Any], points: int) -> dict[str, Any]:
        """``status SWEEP --json`` once Slurm's accounting holds every start (slurmdbd lags
        slurmctld): its hours stop changing and count a start per job at least."""
        last: dict[str, Any] = {}
        for _ in range(60):
            proc = subprocess.run([*self.hpctf, "status", sweep["path"], "--json"], env=env,
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if proc.returncode != 0:
                raise BenchError(f"search: hpctf status {sweep['path']} failed:\n{proc.stderr}")
            document = json.loads(proc.stdout)
            hours = document["hours"]
            enough = isinstance(hours, dict) and hours["starts"] >= max(points, 1)
            if enough and last and hours == last["hours"]:
                return {**sweep, **document}
            last = document
            time.sleep(2)
        raise BenchError(f"search: sacct never settled for {sweep['path']}: {last.get('hours')}")

    def _figures(self, grid: dict[str, Any], search: dict[str, Any], points: int) -> dict[str, Any]:
        values = [p["eval"].get("objective") for p in grid["points"]]
        grid_best = min(v for v in values if isinstance(v, (int, float)))
        best = search["best"] or {}
        search_best = best.get("value")
        reached = search_best is not None and search_best <= grid_best + REACHED_TOLERANCE
        grid_h, search_h = grid["hours"]["node_hours"], search["hours"]["node_hours"]
        ratio = search_h / grid_h
        states: dict[str, int] = {}
        for trial in search["trials"]:
            states[trial["state"]] = states.get(trial["state"], 0) + 1
        met = ratio <= GOAL_RATIO and reached
        self.row(
            benchmark=f"search: TPE + ASHA, {search['budget']['trials']} trials "
            f"({search['search']['parallel']} at once) against the full grid of {points} points "
            "(tests/search_task.py, real Slurm, sacct)",
            hpctf=f"{search_h:.4f} node-h, best {search_best:.4g} "
            f"({', '.join(f'{n} {k}' for k, n in sorted(states.items()))})",
            baseline=f"grid: {grid_h:.4f} node-h, best {grid_best:.4g}",
            result=f"{ratio:.2f} x the grid's node-hours; "
            f"{'reached' if reached else 'missed'} the grid's best",
            goal="<= 1/3, and the grid's best reached",
            met=met,
        )
        return {
            "grid_points": points,
            "trials": search["budget"]["trials"],
            "parallel": search["search"]["parallel"],
            "grid_node_hours": grid_h,
            "search_node_hours": search_h,
            "ratio": ratio,
            "grid_best": grid_best,
            "search_best": search_best,
            "search_best_params": best.get("params"),
            "reached": reached,
            "trial_states": states,
            "grid_starts": grid["hours"]["starts"],
            "search_starts": search["hours"]["starts"],
            "grid_wall_s": round(grid["wall_s"], 1),
            "search_wall_s": round(search["wall_s"], 1),
            "goal_ratio": GOAL_RATIO,
            "met": met,
        }
