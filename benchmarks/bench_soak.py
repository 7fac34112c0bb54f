"""The soak section: threads, RSS and steps/s at the start and end of a long job."""

from __future__ import annotations

import contextlib
import json
import statistics
from typing import Any

from harness import SOAK_BATCH, BenchError, Harness, median, metrics, say, write_experiment


class SoakBench(Harness):
    """One section's measurements, over the shared harness."""

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
            # 10^6 steps take about 40 minutes here, beside the other sections: allow 100/s.
            run_dir, elapsed = self.submit(
                experiment, [], work / "runs", work / "soak.log", timeout=max(3600.0, steps / 100)
            )
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
