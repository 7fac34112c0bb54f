"""The soak section: threads, RSS and steps/s at the start and end of a long job, and which of
the workers' thread pools grew between the two (their threads' names, read from /proc)."""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import threading
from pathlib import Path
from typing import Any

from harness import SOAK_BATCH, BenchError, Harness, median, metrics, say, write_experiment

# Pools that TensorFlow and gRPC grow to the work in flight and keep at that high-water mark:
# TF's collective executor runs each collective op on an UnboundedWorkQueue named
# "collective_ops", adding a thread when every one is blocked in a collective and never
# reaping one (tensorflow/core/common_runtime/collective_executor_mgr.cc,
# tensorflow/core/platform/unbounded_work_queue.h); gRPC's EventEngine pool ("event_engine")
# adds a thread when its workers are blocked (grpc/src/core/lib/event_engine/thread_pool).
# Under other load both step up by a thread or two and stay: a high-water mark, not a leak.
# Threads hpctf or Python start (named "python" until Python 3.14) are counted apart.
GROWING_POOLS = ("collective_ops", "event_engine")
SAMPLE_EVERY_S = 10.0


def thread_names(pid: int) -> collections.Counter[str]:
    """How many threads of process ``pid`` carry each name (/proc/PID/task/*/comm); empty
    when it is gone."""
    names: collections.Counter[str] = collections.Counter()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                names[(task / "comm").read_text().strip()] += 1
    return names


def workers_of(runs: Path) -> list[int]:
    """The PIDs of the ``hpctf worker`` processes whose command line names a run under
    ``runs``, lowest first."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"worker" in argv and any(arg.startswith(bytes(runs)) for arg in argv):
                found.append(int(proc.name))
    return sorted(found)


class ThreadSampler:
    """Every :data:`SAMPLE_EVERY_S`, the soak's step and each worker's threads by name, from a
    thread of the benchmark's own while the soak runs."""

    def __init__(self, runs: Path, step: Any) -> None:
        self._runs, self._step = runs, step
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="soak-threads", daemon=True)

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            step = self._step()
            pools = {pid: thread_names(pid) for pid in workers_of(self._runs)}
            if step and pools:
                self.samples.append({"step": step, "pools": pools})

    def growth(self, from_step: int) -> dict[str, int]:
        """Threads added by name, summed over the workers seen in both, from the first sample
        at or after ``from_step`` to the last (names that lost threads left out); empty
        without two."""
        after = [s for s in self.samples if s["step"] >= from_step]
        if len(after) < 2:
            return {}
        first, last = after[0]["pools"], after[-1]["pools"]
        added: collections.Counter[str] = collections.Counter()
        for pid in first.keys() & last.keys():  # a process in both: the same workers
            added.update({n: c - first[pid].get(n, 0) for n, c in last[pid].items()})
        return {name: count for name, count in sorted(added.items()) if count > 0}


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
            with ThreadSampler(work / "runs", self.soak_step) as sampler:
                run_dir, elapsed = self.submit(
                    experiment,
                    [],
                    work / "runs",
                    work / "soak.log",
                    timeout=max(3600.0, steps / 100),
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
        # Flat: no thread hpctf or Python could leak added (+2 at most: the old goal, for the
        # sampler's window against the metrics'), and TF's and gRPC's pools at most 2 each.
        added = sampler.growth(warm)
        pools_added = {n: c for n, c in added.items() if n in GROWING_POOLS}
        others_added = sum(c for n, c in added.items() if n not in GROWING_POOLS)
        grown = end["threads"] - start["threads"]
        threads_flat = grown <= 2 or (
            bool(added) and others_added <= 2 and all(c <= 2 for c in pools_added.values())
        )
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
            "threads_added_by_name": added,
            "thread_samples": len(sampler.samples),
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
            "goal": "threads +2 at most (TF's and gRPC's growing pools: +2 each at most), RSS "
            "+64 MB at most, steps/s -10 % at most",
            "met": threads_flat and rss_flat and rate_flat,
        }
        self.row(
            benchmark=f"soak: {steps:,} steps in one job ({elapsed / 60:.1f} min; 2 workers, "
            f"the smallest step, a save every {sizes.soak_every:,}), from step {start['step']:,}",
            hpctf=f"threads {start['threads']} -> {end['threads']}"
            + (f" ({_added(added)}, both workers)" if added else "")
            + "; RSS "
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


def _added(added: dict[str, int]) -> str:
    """``collective_ops +1, event_engine +1``: the threads added, by name."""
    return ", ".join(f"{name} +{count}" for name, count in added.items())
