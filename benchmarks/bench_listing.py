"""The listing section: `hpctf status` and `hpctf runs` over a runs root of 10,000 runs, and
`hpctf status SWEEP` of a 1,000-point sweep from a cold page cache, whole processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import BenchError, Harness, median, say
from many_runs import a_sweep, many_runs

from hpctf.core.run.run_index import INDEX_DIR
from hpctf.login.reading import background_index

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def measured(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``argv`` to the end, output discarded: wall and CPU seconds and peak RSS (MB)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    errors = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise BenchError(f"{' '.join(argv)} failed:\n{errors[-3000:]}")
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def file_calls(argv: list[str], env: dict[str, str], under: Path) -> str:
    """How many files under ``under`` the command opens and ``stat`` s (strace; "" without)."""
    if shutil.which("strace") is None:
        return "strace not here to count file calls"
    with tempfile.NamedTemporaryFile(suffix=".strace") as trace:
        subprocess.run(
            ["strace", "-f", "-e", "trace=openat,open,stat,newfstatat,statx,lstat", "-o",
             trace.name, *argv], env=env, capture_output=True, check=False,
        )  # fmt: skip
        lines = [line for line in Path(trace.name).read_text().splitlines() if str(under) in line]
    opens = sum(1 for line in lines if "open" in line.split("(")[0])
    return f"{opens} opens and {len(lines) - opens} stats under the sweep"


def wait_for_index(runs: Path, timeout_s: float = 600) -> float:
    """When the background indexer of ``runs`` ended (perf_counter), waiting for its lock."""
    lock = runs / INDEX_DIR / background_index.LOCK
    deadline = time.perf_counter() + timeout_s
    while lock.exists():
        if time.perf_counter() > deadline:
            raise BenchError(f"the background indexer of {runs} did not end in {timeout_s:g} s")
        time.sleep(0.05)
    return time.perf_counter()


def drop_page_cache() -> bool:
    """Empty the page cache (root only): every file the next command reads comes from disk."""
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


class ListingBench(Harness):
    """One section's measurements, over the shared harness."""

    def listing(self) -> dict[str, Any]:
        work = self.folder("listing")
        runs, sweeps = work / "runs", work / "sweeps"
        runs.mkdir(exist_ok=True)
        sweeps.mkdir(exist_ok=True)
        metrics = self.finished_run / "metrics.jsonl" if self.finished_run else None
        count, points = self.sizes.listing_runs, self.sizes.listing_points
        say(f"listing: {count:,} run directories and a {points:,}-point sweep")
        made = time.perf_counter()
        many_runs(runs, count, metrics)
        sweep = a_sweep(sweeps, points, metrics)
        say(f"listing: made in {time.perf_counter() - made:.1f} s")
        env = self.env(runs)
        commands = {
            "status": [*self.hpctf, "status", "--root", str(runs)],
            "runs": [*self.hpctf, "runs", "--root", str(runs)],
        }
        # "runs" and "status" are the commands' rows; the sizes are named apart from them.
        results: dict[str, Any] = {"run_count": count, "point_count": points}
        help_argv = [*self.hpctf, "--help"]  # Python and hpctf's imports: every command's floor
        floor = [measured(help_argv, env) for _ in range(self.sizes.listing_rounds)]
        results.update(self._first_status(runs, commands["status"], env, floor))
        for name, argv in commands.items():
            samples = [measured(argv, env) for _ in range(self.sizes.listing_rounds)]
            results[name] = self._row_of(f"`hpctf {name}` over {count:,} runs", samples, floor, 2.0)
        results.update(self._sweep_status(sweep, env, points))
        return results

    def _first_status(
        self, runs: Path, argv: list[str], env: dict[str, str], floor: list[dict[str, float]]
    ) -> dict[str, Any]:
        """`hpctf status` of a runs root its index has never seen, each round from no index:
        it reads the runs whose journals changed last and starts the background indexer; the
        round waits for that to end (the seconds until the index is whole are recorded, and
        the next command is not measured beside it). Then `hpctf status --all` from no index
        (every run read in the command: what the first status cost before), once."""
        count = self.sizes.listing_runs
        samples, whole = [], []
        for _ in range(self.sizes.listing_rounds):
            shutil.rmtree(runs / INDEX_DIR, ignore_errors=True)
            started = time.perf_counter()
            samples.append(measured(argv, env))
            whole.append(round(wait_for_index(runs) - started, 3))
        found: dict[str, Any] = {"first_status": samples[0], "index_whole_after_s": whole}
        found["cold_status"] = self._row_of(
            f"first `hpctf status` over {count:,} runs its index has not seen (then indexed in "
            f"the background: whole after {median(whole):.1f} s)", samples, floor, 2.0,
        )  # fmt: skip
        shutil.rmtree(runs / INDEX_DIR, ignore_errors=True)
        found["first_status_all"] = measured([*argv, "--all"], env)
        return found

    def _sweep_status(self, sweep: Path, env: dict[str, str], points: int) -> dict[str, Any]:
        argv = [*self.hpctf, "status", str(sweep)]
        found: dict[str, Any] = {"first_sweep_status": measured(argv, env)}  # makes its index
        samples, floor, cold = [], [], True
        for _ in range(self.sizes.listing_rounds):
            cold = self.sizes.listing_cold and drop_page_cache() and cold
            samples.append(measured(argv, env))
            cold = self.sizes.listing_cold and drop_page_cache() and cold
            floor.append(measured([*self.hpctf, "--help"], env))
        where = "from a cold page cache" if cold else "warm (the page cache not dropped)"
        calls = file_calls(argv, env, sweep)
        found["sweep_status"] = self._row_of(
            f"`hpctf status SWEEP`, {points:,} points, {where}; {calls}", samples, floor, 1.0
        )
        found["sweep_cold"] = cold
        return found

    def _row_of(
        self, what: str, samples: list[dict[str, float]], floor: list[dict[str, float]],
        goal_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        wall = median([s["wall_s"] for s in samples])
        cpu = median([s["cpu_s"] for s in samples])
        rss = max(s["rss_mb"] for s in samples)
        base = median([s["wall_s"] for s in floor])
        met = wall <= goal_s and rss <= 300
        self.row(
            benchmark=f"listing: {what} ({len(samples)} round(s), load average "
            f"{os.getloadavg()[0]:.1f})",
            hpctf=f"{wall:.2f} s wall, {cpu:.2f} s CPU, {rss:.0f} MB peak RSS",
            baseline=f"`hpctf --help` (Python, hpctf's imports), alike: {base:.2f} s wall",
            result=f"{wall:.2f} s; {wall - base:.2f} s over `hpctf --help`",
            goal=f"<= {goal_s:g} s, <= 300 MB",
            met=met,
        )
        return {"wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "samples": samples, "met": met,
                "help_wall_s": base}  # fmt: skip
