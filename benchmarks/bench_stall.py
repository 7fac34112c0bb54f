"""The stall section: seconds the loop waits per checkpoint save against a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import (
    GLOBAL_BATCH,
    BenchError,
    Harness,
    checkpoint_mb,
    each_round,
    median,
    megabytes,
    metrics,
    say,
    windows,
    write_experiment,
)


class StallBench(Harness):
    """One section's measurements, over the shared harness."""

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
        # The Dense stack saved synchronously and asynchronously (checkpoint.asynchronous),
        # alternated, who goes first swapping each round: the stall of each, in one run.
        runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
        for index in range(sizes.stall_rounds):
            for mode in ("sync", "async") if index % 2 == 0 else ("async", "sync"):
                runs[mode].append(
                    self._stall_run(
                        work,
                        f"dense-{mode}-{index}",
                        {"builder": "bench_entries:dense_stack", "width": width, "depth": depth},
                        sizes.dense_steps,
                        sizes.dense_log_every,
                        sizes.dense_every,
                        nodes=2,
                        asynchronous=mode == "async",
                        row=index == 0 and mode == "sync",  # the table's row as before
                    )
                )
        model = f"Dense stack {depth} x {width}, Adam"
        for found in (*runs["sync"], *runs["async"]):
            found["model"] = model
        return {"digits": digits, "dense": runs["sync"][0], **self._async_row(runs)}

    def _async_row(self, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """The asynchronous save's stall against the synchronous one's, per round."""
        sync = [r["save_s"] for r in runs["sync"]]
        asynchronous = [r["save_s"] for r in runs["async"]]
        ratios = [a / s for a, s in zip(asynchronous, sync, strict=True)]
        ratio = median(ratios)
        weights = runs["sync"][0]["weights_mb"]
        self.row(
            benchmark=f"checkpoint stall, asynchronous against synchronous ({megabytes(weights)}"
            f" of weights, {len(ratios)} alternated pair(s))",
            hpctf=f"{median(asynchronous):.3f} s per save (async)",
            baseline=f"{median(sync):.3f} s per save (sync)",
            result=f"{ratio:.3f}; rounds {each_round(ratios)}",
            goal="<= 0.1",
            met=ratio <= 0.1,
        )
        say(f"stall: async/sync {ratio:.3f} ({', '.join(f'{r:.3f}' for r in ratios)})")
        return {
            "dense_async": runs["async"],
            "dense_sync": runs["sync"],
            "async_over_sync": round(ratio, 4),
            "async_over_sync_rounds": [round(r, 4) for r in ratios],
        }

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
        asynchronous: bool | None = None,
        row: bool = True,
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
            asynchronous,
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
        if not row:
            return result
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
