"""The dashboard section: ``hpctf ui`` over a runs root of 1,000 runs (benchmarks/many_runs.py:
hpctf's writers), in a real headless chromium (tests/browser.py), against ``hpctf status`` of
the same runs root, whole processes, alternated.

- first paint: from the navigation to the runs table in the page, the runs root's index
  removed before each round (a first look: the 200 runs whose journals changed last read now,
  the rest counted and indexed in the background, as ``hpctf status`` does); the page's own
  clock (``performance.now()`` when the table is in), and this side's wall clock around it.
- refresh: once the index is whole, the page's own time of a refresh (its one request to the
  server, one typed call, and the table made again), the median of several.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_listing import measured, wait_for_index
from harness import BenchError, Harness, median
from many_runs import many_runs

from hpctf.core.run.run_index import INDEX_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/browser.py

FIRST_PAINT_GOAL_S = 1.0
REFRESH_GOAL_S = 0.5


class DashboardBench(Harness):
    """One section's measurements, over the shared harness."""

    def dashboard(self) -> dict[str, Any]:
        from tests.browser import CHROMIUM, Browser

        if not any(shutil.which(name) for name in CHROMIUM):
            missing = "no chromium (tests/system-packages.sh installs it)"
            goals = (("first paint", FIRST_PAINT_GOAL_S), ("refresh", REFRESH_GOAL_S))
            rows = [(f"dashboard: {what} of the runs page (skipped)", f"<= {goal:g} s")
                    for what, goal in goals]  # fmt: skip
            return self.skipped(missing, rows)
        work = self.folder("dashboard")
        runs = work / "runs"
        count = self.sizes.dashboard_runs
        many_runs(runs, count, self.finished_run / "metrics.jsonl" if self.finished_run else None)
        env = self.env(runs)
        status = [*self.hpctf, "status", "--root", str(runs)]
        server = subprocess.Popen(
            [*self.hpctf, "ui", "--root", str(runs)], env=env, stdout=subprocess.PIPE,
            stderr=(work / "ui.log").open("wb"), text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            if "open http" not in line:
                raise BenchError(
                    f"hpctf ui printed no URL: {line!r}; {(work / 'ui.log').read_text()}"
                )
            url = line.split("open ", 1)[1].strip()
            with Browser(work) as browser:
                found = self._measure(browser, url, runs, status, env)
        finally:
            server.terminate()
            server.wait(timeout=30)
        return found

    def _measure(
        self, browser: Any, url: str, runs: Path, status: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        count, rounds = self.sizes.dashboard_runs, self.sizes.dashboard_rounds
        paints, walls, cold_status, refreshes, warm_status = [], [], [], [], []
        for _ in range(rounds):
            shutil.rmtree(runs / INDEX_DIR, ignore_errors=True)
            began = time.perf_counter()
            browser.open("about:blank")
            browser.call("Page.navigate", url=url)
            browser.wait_for("document.body && document.body.dataset.firstPaintMs", timeout=60)
            walls.append(time.perf_counter() - began)
            paints.append(float(browser.evaluate("document.body.dataset.firstPaintMs")) / 1000)
            wait_for_index(runs)
            shutil.rmtree(runs / INDEX_DIR, ignore_errors=True)
            cold_status.append(measured(status, env)["wall_s"])
            wait_for_index(runs)
            # The index whole: refreshes of the open page, each its own time.
            seen = int(browser.evaluate("document.body.dataset.refreshes"))
            for _ in range(3):
                seen = int(browser.wait_for(
                    f"Number(document.body.dataset.refreshes) > {seen} && "
                    "Number(document.body.dataset.refreshes)", timeout=30,
                ))  # fmt: skip
                refreshes.append(float(browser.evaluate("document.body.dataset.refreshMs")) / 1000)
            warm_status.append(measured(status, env)["wall_s"])
        rows = int(browser.evaluate("document.querySelectorAll('#runs tr.run').length"))
        if rows != count:
            raise BenchError(f"the runs page shows {rows} runs of {count}")
        found: dict[str, Any] = {
            "run_count": count,
            "first_paint_s": [round(p, 3) for p in paints],
            "first_paint_wall_s": [round(w, 3) for w in walls],
            "status_cold_s": cold_status,
            "refresh_s": [round(r, 3) for r in refreshes],
            "status_warm_s": warm_status,
            "rows_shown": rows,
        }
        paint, refresh = median(paints), median(refreshes)
        found["first_paint"] = self._row(
            f"first paint of the runs page, {count:,} runs its index has not seen "
            f"(this side's wall clock: {median(walls):.2f} s)",
            paint, median(cold_status), "`hpctf status` from no index", FIRST_PAINT_GOAL_S,
            len(paints),
        )  # fmt: skip
        found["refresh"] = self._row(
            f"a refresh of the runs page, {count:,} runs, index whole", refresh,
            median(warm_status), "`hpctf status`, index whole", REFRESH_GOAL_S, len(refreshes),
        )  # fmt: skip
        found["met"] = found["first_paint"]["met"] and found["refresh"]["met"]
        return found

    def _row(
        self, what: str, seconds: float, baseline: float, against: str, goal: float, rounds: int
    ) -> dict[str, Any]:
        met = seconds <= goal
        ratio = seconds / baseline
        self.row(
            benchmark=f"dashboard: {what} ({rounds} sample(s), headless chromium)",
            hpctf=f"{seconds:.3f} s",
            baseline=f"{against}, whole process: {baseline:.2f} s",
            result=f"{ratio:.2f}x of `hpctf status`",
            goal=f"<= {goal:g} s",
            met=met,
        )
        return {"seconds": seconds, "baseline_s": baseline, "ratio": round(ratio, 4), "met": met}
