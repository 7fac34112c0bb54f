"""hpctf's benchmarks in one command: a table on stdout and every measurement as JSON.
The sections are in bench_<section>.py, over harness.py (shared) and report.py (the table).

    .venv/bin/python benchmarks/run.py [--tiny] [--only NAME[,NAME...]] [--json FILE]
                                       [--soak-steps N] [--first-step-rounds N]
                                       [--runtime-rounds N] [--keep DIR] [--gpu]

Each figure is hpctf against what a user would do instead, measured in the same run, the two
sides alternated, and given as a ratio where there is a baseline (these machines are shared
and noisy: absolute numbers move, ratios much less):

  login       whole-process median of `hpctf render`, `hpctf submit --dry-run` and
              `hpctf status RUN` against `python -c "import tensorflow"` (goal: <= 0.1)
  resolver    hpctf's cluster_spec against TF's SlurmClusterResolver at 10 to 10,000 nodes,
              1 and 4 tasks per node: time and whether each answer is Slurm's order
              (goal: <= 20 ms at 4,000 nodes, always right); benchmarks/bench_tfconfig.py
  runtime     steps/s of `hpctf submit --site local` (2 workers, the digits example) against
              benchmarks/plain_mwms.py, the same training written by hand, running 10 steps
              per tf.function call (goal: >= 0.99), and beside it the tutorial's loop of one
              step per call
  preemption  SIGUSR2 (the warning) and SIGTERM to one rank of 2 workers: steps lost and
              seconds from signal to exit (goal: 0 lost when warned); then seconds from
              `hpctf resubmit` to the first resumed step against a cold start of the same
              job (goal: <= 1.15)
  crash       SIGKILL of one rank of a 2-node job on the real Slurm test cluster
              (tests/slurm/cluster.sh, started by slurm_cluster.py; skipped where Slurm is
              not installed, unless HPCTF_REQUIRE_SLURM): seconds from the kill to the next
              first step, each phase, and the training lost against checkpoint.every_seconds 5
              (goal: <= 10 s back, <= 5 s lost)
  lost_node   rank 1's node lost (its slurmd and processes killed) under a 2-node job with
              resources.spare_nodes 1 on a 3-node test cluster (SlurmdTimeout 10): seconds
              from the loss to the first step again in the same job, split into Slurm's own
              detection (the node set DOWN) and hpctf's part after it (goal: <= 10 s after
              Slurm's word, <= every_seconds 5 lost)
  first_step  seconds from a worker process's start to its first trained step, `hpctf
              worker` against plain_mwms.py (digits, 2 workers, alternated), and each
              phase's share (hpctf.compute.process.startup_clock) (goal: <= 1.05)
  stall       seconds the loop waits for each checkpoint save against the time of a step,
              for the digits model and a ~100 MB Dense stack (benchmarks/bench_entries.py);
              the Dense stack saved asynchronously against synchronously (goal: <= 0.1)
  listing     `hpctf status` and `hpctf runs` over 10,000 run directories (benchmarks/
              many_runs.py: hpctf's writers) and `hpctf status SWEEP` of a 1,000-point
              sweep from a cold page cache, whole processes (goal: <= 2 s and <= 300 MB;
              <= 1 s for the sweep)
  dashboard   `hpctf ui` over 1,000 run directories in headless chromium (tests/browser.py):
              the runs page's first paint from no index (goal: <= 1 s) and a refresh (goal:
              <= 0.5 s), beside `hpctf status` of the same runs root
  sweep       a 2,500-point `hpctf sweep --dry-run` against one `hpctf render`, whole
              processes, alternated (goal: <= 1 s of CPU); `hpctf sweep` of 1,000 points,
              each phase timed, to the cluster SLURM_CONF names (else a stand-in sbatch)
              (goal: <= 3 s), the files a point holds, and a 100,000-point dry run
              (goal: <= 30 s)
  search      a search (TPE + ASHA, 24 trials, 4 at once) against the full grid over the same
              space (44 points, 4 at once), both on the real Slurm test cluster (benchmarks/
              slurm_cluster.py, accounting on): node-hours from sacct and whether the search
              reached the grid's best (goal: <= 1/3 of the grid's node-hours)
  controller  RPCs hpctf sends to slurmctld (sdiag, by message type) for one run to DONE with
              a requeue, a 1,000-point sweep, `hpctf status SWEEP`, a search, and `logs -f`,
              Run.wait and Sweep.wait watching 100 runs (goal: <= 1 RPC/s for 1,000 active
              runs); not in --tiny unless named with --only
  soak        one job of 100,000 steps (--tiny: 1,000) of the smallest step, 2 workers:
              threads, RSS and steps/s at its start and end (goal: flat)

--gpu runs instead the GPU mode of runtime and stall (ResNet-50, synthetic images, mixed
precision, XLA, NCCL; benchmarks/gpu_check.py) and refuses on a machine without GPUs.
The full run takes about 40 minutes on 2 cores (the search 10 of them). --tiny runs every
section once at the smallest size that still reports every figure, in three lanes at once, in
a few minutes (CI runs it: tests/test_benchmarks.py); its numbers say nothing. Run dirs and
logs go to a temporary directory (--keep DIR keeps them), never into the checkout.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench_controller import ControllerBench
from bench_crash import CrashBench
from bench_dashboard import DashboardBench
from bench_first_step import FirstStepBench
from bench_gpu import GpuBench
from bench_listing import ListingBench
from bench_login import LoginBench
from bench_lost_node import LostNodeBench
from bench_preemption import PreemptionBench
from bench_remote import RemoteBench
from bench_resolver import ResolverBench
from bench_runtime import RuntimeBench
from bench_search import SearchBench
from bench_soak import SoakBench
from bench_stall import StallBench
from bench_sweep import SweepBench
from harness import (
    FULL,
    GPU_SECTIONS,
    ORDER,
    SECTIONS,
    TINY,
    TINY_SECOND_LANE,
    TINY_THIRD_LANE,
    BenchError,
    say,
    wait_until,
)
from report import gpus_here, machine, resolver_table, table

# The controller budget (#45: RPCs to slurmctld, bench_controller.py) runs last in a full run
# and alone with --only; --tiny leaves it out unless named (tests/test_benchmarks.py's lanes).
ALL_SECTIONS = (*SECTIONS, "controller")
FULL_ORDER = (*ORDER, "controller")


class Bench(
    LoginBench,
    ListingBench,
    DashboardBench,
    RemoteBench,
    SweepBench,
    ResolverBench,
    RuntimeBench,
    PreemptionBench,
    CrashBench,
    LostNodeBench,
    FirstStepBench,
    StallBench,
    SoakBench,
    GpuBench,
    SearchBench,
    ControllerBench,
):
    """Every section, each from its module (``bench_<section>.py``), over the shared harness."""


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="hpctf-bench-"))
    try:
        yield path
    except BaseException:
        say(f"(work directory kept for inspection: {path})")
        raise
    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="sections: " + ", ".join(ALL_SECTIONS) + "; with --gpu: " + ", ".join(GPU_SECTIONS),
    )
    parser.add_argument("--tiny", action="store_true", help="CI size: a few minutes")
    parser.add_argument(
        "--only", action="append", default=[], help="run only these sections (comma-separated)"
    )
    parser.add_argument(
        "--json", type=Path, default=Path("hpctf-benchmarks.json"), help="write results here"
    )
    parser.add_argument("--soak-steps", type=int, help="steps of the soak job (default 100,000)")
    parser.add_argument("--login-runs", type=int, help="rounds of the login commands (default 15)")
    parser.add_argument(
        "--first-step-rounds", type=int, help="alternated pairs of first_step (default 4)"
    )
    parser.add_argument(
        "--runtime-rounds", type=int, help="rounds of each runtime side (default 5)"
    )
    parser.add_argument("--keep", type=Path, help="keep run directories and logs in this folder")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU mode of runtime and stall (ResNet-50, mixed precision); needs GPUs",
    )
    args = parser.parse_args(argv)

    sizes = TINY if args.tiny else FULL
    changes = {}
    if args.soak_steps:
        changes["soak_steps"] = args.soak_steps
    if args.login_runs:
        changes["login_runs"] = args.login_runs
    if args.first_step_rounds:
        changes["first_step_rounds"] = args.first_step_rounds
    if args.runtime_rounds:
        changes["runtime_rounds"] = args.runtime_rounds
    sizes = replace(sizes, **changes)
    known = GPU_SECTIONS if args.gpu else ALL_SECTIONS
    chosen = [name.strip() for value in args.only for name in value.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.gpu:
        found = gpus_here()
        if not found:
            print(
                "Error: --gpu needs NVIDIA GPUs, and this machine has none (nvidia-smi -L "
                "lists no GPU); the GPU mode (ResNet-50 through benchmarks/gpu_check.py and "
                "its checkpoint stall) runs on a GPU node; without --gpu the CPU benchmarks run",
                file=sys.stderr,
            )
            return 2
        say(f"GPUs: {'; '.join(found)}")
    order = GPU_SECTIONS if args.gpu else ORDER if args.tiny and not chosen else FULL_ORDER
    sections = [name for name in order if not chosen or name in chosen]

    results: dict[str, Any] = {
        "mode": ("gpu-" if args.gpu else "") + ("tiny" if args.tiny else "full"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "sizes": asdict(sizes),
        "sections": {},
        "seconds": {},
    }
    # Lanes at once. The tiny run's numbers say nothing: CI time, not measurement (each
    # worker mostly waits for its peer's collectives, and a start for TensorFlow's import).
    # The full run's soak is 100,000 steps of a 2-worker job, over 10 minutes on the shared
    # 2-core VM: the other sections run beside it once its start is measured (15 % of its
    # steps), and its end is measured after they are done. Their ratios alternate both sides
    # under the same background; the soak's threads and RSS do not depend on load.
    # Login reads the run that runtime leaves, so both are always in one lane.
    beside_soak = not args.tiny and "soak" in sections and len(sections) > 1
    if args.tiny:
        lanes = [[n for n in sections if n not in TINY_SECOND_LANE + TINY_THIRD_LANE]]
        lanes.append([n for n in sections if n in TINY_SECOND_LANE])
        lanes.append([n for n in sections if n in TINY_THIRD_LANE])
    elif beside_soak:
        lanes = [[n for n in sections if n != "soak"], ["soak"]]
    else:
        lanes = [sections]
    lanes = [lane for lane in lanes if lane]
    # The resolver's goal is milliseconds, not a ratio: it runs first, alone (20-30 s), not
    # beside the soak (39.8 ms at 4,000 x 4 beside it, 7-12 ms alone, at load average 7-9).
    alone_first = ["resolver"] if beside_soak and "resolver" in sections else []
    lanes = [[n for n in lane if n not in alone_first] for lane in lanes]
    lock = threading.Lock()
    started = time.perf_counter()
    with workdir(args.keep) as work:
        bench = Bench(sizes, work)

        def run_lane(lane: list[str], gated: bool) -> None:
            """Run ``lane``'s sections in order; ``gated``: after the soak's first 15 %."""
            if gated:
                wait_until(
                    lambda: (
                        bench.soak_step() >= 0.15 * sizes.soak_steps or bench.soak_ended.is_set()
                    ),
                    7200,
                    "the soak's first 15 %",
                    poll=1.0,
                )
                bench.beside_soak.append(bench.soak_step())
                say(f"the other sections start beside the soak, at its step {bench.soak_step()}")
            try:
                for name in lane:
                    if bench.failed.is_set():
                        return
                    say(f"== {name}")
                    bench.section = name
                    began = time.perf_counter()
                    found = getattr(bench, name)()
                    with lock:
                        results["sections"][name] = found
                        results["seconds"][name] = round(time.perf_counter() - began, 1)
                        results["exit_after_done_s"] = bench.exit_after_done
                        args.json.write_text(json.dumps(results, indent=2) + "\n")  # so far
            except BaseException:
                bench.failed.set()
                raise
            finally:
                if gated:
                    bench.beside_soak.append(bench.soak_step())

        if alone_first:
            run_lane(alone_first, gated=False)
        with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
            gates = [beside_soak and "soak" not in lane for lane in lanes]
            for future in [pool.submit(run_lane, *both) for both in zip(lanes, gates, strict=True)]:
                future.result()  # a lane's BenchError, raised here
    results["seconds"]["total"] = round(time.perf_counter() - started, 1)
    results["lanes"] = [alone_first, *lanes] if alone_first else lanes
    with contextlib.suppress(OSError):
        results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    rows = sorted(bench.rows, key=lambda row: known.index(row["section"]))  # stable
    results["table"] = rows
    args.json.write_text(json.dumps(results, indent=2) + "\n")

    info = results["machine"]
    print(
        f"hpctf benchmarks ({results['mode']}), {results['date']}: {info['cpus']} CPUs "
        f"({info.get('cpu', '?')}), Python {info['python']}, TensorFlow "
        f"{info.get('tensorflow-cpu') or info.get('tensorflow', '?')}, "
        f"{results['seconds']['total'] / 60:.1f} min\n"
    )
    print(table(rows))
    if "resolver" in results["sections"]:
        print()
        print(resolver_table(results["sections"]["resolver"]))
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)
