"""benchmarks/run.py at CI size (--tiny): every benchmark runs, so none can rot.

No time is asserted (the numbers of a tiny run on a shared machine, lanes at once, say
nothing about speed), but every figure must be consistent with the others and with what the
run was asked to do: ratios are the quotients of their sides, counts match the sizes, the
preemption keeps the step it promises, the checkpoint holds what the model weighs.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

RUN = REPO / "benchmarks" / "run.py"
SECTIONS = {
    "login", "listing", "sweep", "resolver", "runtime", "preemption", "crash", "lost_node",
    "first_step", "stall", "soak", "remote", "search", "dashboard",
}  # fmt: skip
PHASES = ["worker_up", "tensorflow_imported", "strategy", "restored", "first_step"]


def positive(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)


def close(value: float, expected: float) -> bool:
    """Equal up to the rounding of the JSON (4 decimals on both sides)."""
    return math.isclose(value, expected, rel_tol=2e-3, abs_tol=2e-4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """One tiny run for every check below: its JSON and its stdout. It runs without the
    session's SLURM_CONF: the 22.05 test cluster's, set in this process once a Slurm test of
    the same xdist worker ran first, would send the sweep's submit to that cluster instead of
    the stand-in sbatch a tiny run uses (seen in CI: the check below depends on test order)."""
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "bench.json"
    env = {name: value for name, value in os.environ.items() if name != "SLURM_CONF"}
    proc = subprocess.run(
        [sys.executable, str(RUN), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=folder,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text()), proc.stdout


def check_run_reports_every_section(tiny: tuple[dict[str, Any], str]) -> None:
    results, stdout = tiny
    assert results["mode"] == "tiny"
    assert results["date"] and positive(results["machine"]["cpus"])
    assert set(results["sections"]) == SECTIONS
    seconds = results["seconds"]
    assert set(seconds) == SECTIONS | {"total"} and positive(*seconds.values())
    # Lanes at once: the total is at least the longest lane, at most everything in a row.
    lanes = results["lanes"]
    assert sorted(itertools.chain(*lanes)) == sorted(SECTIONS)
    longest = max(sum(seconds[name] for name in lane) for lane in lanes)
    assert longest - 1 <= seconds["total"] <= sum(seconds[name] for name in SECTIONS) + 1
    table = results["table"]
    assert [row["section"] for row in table] == [
        *["login"] * 3,
        *["listing"] * 4,  # status from no index (cold), status, runs, status SWEEP
        # the 2,500-point plan, the 1,000-point submit, its files, its status, the dry run
        *["sweep"] * 5,
        "resolver",
        *["runtime"] * 2,  # against a loop of 10 steps per call (the goal's), the tutorial's
        *["preemption"] * 3,
        # SIGKILL of a rank on the real Slurm test cluster: the baseline, the warm standby, the
        # soak of its takeovers (or one row, skipped, without Slurm)
        *["crash"] * (1 if "skipped" in results["sections"]["crash"] else 3),
        "lost_node",  # a lost node with a spare on a 3-node test cluster (or skipped)
        *["first_step"] * 10,  # the ratio, then the phase table (9 rows)
        *["stall"] * 3,
        "soak",
        "remote",  # status of 1,000 runs through a real sshd, against the login side
        "search",  # TPE + ASHA against the full grid, node-hours from sacct
        *["dashboard"] * 2,  # hpctf ui's first paint and a refresh, in headless chromium
    ]
    assert all(isinstance(row["met"], bool | None) for row in table)
    assert "| benchmark | hpctf | against | result | goal | met |" in stdout
    assert "| nodes x tasks/node |" in stdout
    # Every `hpctf submit` that ran to the end: its workers' exit after DONE, measured.
    lags = results["exit_after_done_s"]
    assert set(lags) == {
        "runtime/hpctf-0",
        "stall/digits",
        "stall/dense-sync-0",
        "stall/dense-async-0",
        "soak/soak",
    }
    assert all(lag >= -0.1 for lag in lags.values())


def check_login_and_resolver(tiny: tuple[dict[str, Any], str]) -> None:
    sections = tiny[0]["sections"]
    login = sections["login"]
    baseline = login["baseline"]
    assert login["runs"] == 1 and len(baseline["times_s"]) == 1 and positive(baseline["median_s"])
    assert set(login["commands"]) == {"hpctf render", "hpctf submit --dry-run", "hpctf status RUN"}
    for command in login["commands"].values():
        assert len(command["times_s"]) == 1 and positive(command["median_s"])
        assert close(command["ratio"], command["median_s"] / baseline["median_s"])
        spread = command["round_ratios"]
        assert spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"]
        assert close(spread["median"], command["times_s"][0] / baseline["times_s"][0])
    assert login["met"] == all(c["ratio"] <= 0.1 for c in login["commands"].values())

    resolver = sections["resolver"]
    rows = resolver["rows"]
    assert sorted((r["nodes"], r["tasks_per_node"]) for r in rows) == sorted(
        (n, t) for n in (10, 4000) for t in (1, 4) for _ in range(2)
    )
    for row in rows:
        assert row["workers"] == row["nodes"] * row["tasks_per_node"]
        assert positive(row["hpctf"]["median_ms"]) and row["hpctf"]["right"] is True
        assert positive(row["tf"]["median_ms"]) and isinstance(row["tf"]["right"], bool)
    # TF's resolver sorts hosts as strings: node[1-10] is never in Slurm's order.
    unpadded = [r for r in rows if r["names"].startswith("node")]
    assert unpadded and not any(r["tf"]["right"] for r in unpadded)
    slowest = max(r["hpctf"]["median_ms"] for r in rows if r["nodes"] == 4000)
    assert resolver["hpctf_slowest_ms_at_4000"] == slowest
    assert resolver["met"] == (slowest <= 20)


def check_runtime(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    runtime, sizes = results["sections"]["runtime"], results["sizes"]
    assert positive(runtime["hpctf_steps_per_s"], runtime["plain_steps_per_s"])
    assert close(runtime["ratio"], runtime["hpctf_steps_per_s"] / runtime["plain_steps_per_s"])
    timed = (
        sizes["runtime_steps"] // sizes["runtime_log_every"] - runtime["warmup_windows_left_out"]
    )
    for side in ("hpctf_windows", "plain_windows", "plain_per_call_windows"):
        (windows,) = runtime[side]  # one round
        assert len(windows) == timed == 2 and positive(*windows)
    for prefix in ("", "plain_per_call_"):
        (per_round,) = runtime[f"{prefix}per_round_ratio"]
        assert close(per_round, runtime[f"{prefix}ratio"])  # one round: the same medians
    per_call = runtime["plain_per_call_steps_per_s"]
    assert close(runtime["plain_per_call_ratio"], runtime["hpctf_steps_per_s"] / per_call)
    # The main row: against the hand-written loop of 10 steps per call (issue #34).
    assert runtime["met"] == (runtime["plain_per_call_ratio"] >= 0.99)
    assert "wide" not in runtime  # the full run's second model: not at CI size


def check_preemption_and_restart(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    preemption = results["sections"]["preemption"]
    after = results["sizes"]["preempt_after"]
    assert set(preemption["signals"]) == {"SIGUSR2", "SIGTERM"}
    for signalled in preemption["signals"].values():
        assert signalled["exit_codes"] == [75, 75]
        assert signalled["step_at_signal"] >= after
        # The ranks agree every 10 steps (train.preemption_check_every_steps), so the saved
        # step is the next check; +1: the step in flight when the signal went out. The step
        # at the signal is the last one metrics.jsonl held just before the kill: it lags the
        # training by the records' write and the steps run meanwhile (about 1.6 ms a step).
        gap = signalled["saved_step"] - signalled["step_at_signal"]
        assert gap == signalled["steps_after_signal_before_save"] and 0 <= gap <= 11 + 5
        assert signalled["saved_step"] % 10 == 0
        assert (
            signalled["steps_lost"] == 0 == signalled["last_step_trained"] - signalled["saved_step"]
        )
        exits = signalled["signal_to_exit_s_per_rank"]
        assert positive(*exits) and signalled["signal_to_exit_s"] == max(exits)
        # No rank exits before the chief's checkpoint is complete (a barrier after the save).
        assert 0 < signalled["signal_to_checkpoint_s"] <= min(exits) + 0.05
    restart = preemption["restart"]
    assert restart["resumed_message_in_log"] is True
    assert restart["resumed_from_step"] == preemption["signals"]["SIGUSR2"]["saved_step"]
    assert close(restart["ratio"], restart["restart_median_s"] / restart["cold_start_median_s"])
    for run in restart["restart_runs"] + restart["cold_start_runs"]:
        assert list(run) == PHASES  # rank 0's log still says each
        assert [run[name] for name in PHASES] == sorted(run.values())
    spans = [f"{a}->{b}" for a, b in itertools.pairwise(["launch", *PHASES])]
    for side in ("restart_phases_s", "cold_start_phases_s"):
        assert list(restart[side]) == spans, restart[side]
        total = restart["restart_median_s" if side.startswith("restart") else "cold_start_median_s"]
        assert close(sum(restart[side].values()), total)  # one round: the phases add up
    assert preemption["met"] == (
        preemption["signals"]["SIGUSR2"]["steps_lost"] == 0 and restart["met"]
    )


def check_crash(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    crash = results["sections"]["crash"]
    if "skipped" in crash:  # no Slurm here: only where it is not required
        assert not os.environ.get("HPCTF_REQUIRE_SLURM") and not os.environ.get("CI"), crash
        assert crash["met"] is None
        return
    # The warm standby's run, its baseline's (train.warm_standby: false) in the same section.
    baseline = crash["baseline"]
    assert crash["warm_standby"] and not baseline["warm_standby"]
    assert crash["ratio_to_baseline"] == round(
        crash["kill_to_first_step_median_s"] / baseline["kill_to_first_step_median_s"], 3
    )
    for found in crash["rounds"]:  # each restart taken over: no TensorFlow import in it
        assert found["worker_phases"].startswith("standby takeover "), found
    for found in baseline["rounds"]:
        assert "standby takeover" not in found["worker_phases"], found
    sizes = results["sizes"]
    _check_crash_rounds(baseline, sizes["crash_rounds"])
    _check_crash_rounds(crash, sizes["takeover_rounds"])
    soak = crash["takeover_soak"]  # sampled before each kill and after the last takeover
    assert soak["takeovers"] == sizes["takeover_rounds"]
    assert soak["flat"] is (None if soak["takeovers"] < 2 else soak["flat"])


def _check_crash_rounds(crash: dict[str, Any], rounds: int) -> None:
    every = crash["every_seconds"]
    assert len(crash["rounds"]) == rounds
    for found in crash["rounds"]:
        # Resumed from the newest checkpoint before the kill, which came between two saves.
        assert 0 < found["restored_step"] <= found["trained_at_kill"]
        assert found["lost_steps"] == found["trained_at_kill"] - found["restored_step"]
        assert 0 < found["lost_s"] <= every + 1.0
        # The phases follow each other from the kill to the first step: they add up.
        phases = found["phases_s"]
        names = list(phases)
        assert names[0].startswith("the kill -> ") and names[-1].endswith(" -> its first step")
        assert all(span >= 0 for span in phases.values()), phases
        assert math.isclose(sum(phases.values()), found["kill_to_first_step_s"], abs_tol=0.02)
        assert "tensorflow import" in found["worker_phases"]
    backs = [r["kill_to_first_step_s"] for r in crash["rounds"]]
    assert crash["kill_to_first_step_median_s"] == round(statistics.median(backs), 2)
    assert crash["met"] == (
        crash["kill_to_first_step_median_s"] <= crash["goal_back_s"]
        and crash["lost_max_s"] <= every
    )


def check_lost_node(tiny: tuple[dict[str, Any], str]) -> None:
    lost = tiny[0]["sections"]["lost_node"]
    if "skipped" in lost:  # no Slurm here: only where it is not required
        assert not os.environ.get("HPCTF_REQUIRE_SLURM") and not os.environ.get("CI"), lost
        assert lost["met"] is None
        return
    assert lost["same_job"] and re.fullmatch(r"node[23]", lost["node"]), lost
    assert positive(lost["slurm_detection_s"], lost["down_to_first_step_s"], lost["lost_s"])
    total = lost["slurm_detection_s"] + lost["down_to_first_step_s"]
    assert abs(total - lost["loss_to_first_step_s"]) <= 0.02
    assert lost["met"] == (
        lost["down_to_first_step_s"] <= lost["goal_hpctf_s"]
        and lost["lost_s"] <= lost["every_seconds"]
    )


def check_first_step(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    first, sizes = results["sections"]["first_step"], results["sizes"]
    assert first["workers"] == sizes["first_step_workers"]
    assert len(first["hpctf_s"]) == len(first["plain_s"]) == sizes["first_step_rounds"]
    assert close(first["ratio"], first["hpctf_median_s"] / first["plain_median_s"])
    assert close(first["cpu_ratio"], first["hpctf_cpu_median_s"] / first["plain_cpu_median_s"])
    # What hpctf's worker (hpctf.compute.process.startup_clock) and the plain script say they
    # did before step 1, in the order they did it; the phases add up to the total.
    hpctf_phases = ["python+hpctf", "config", "node checks", "tensorflow import"]
    hpctf_phases += ["keras and hpctf loop import", "join", "session", "model", "restore"]
    hpctf_phases += ["input and step function", "first step"]
    plain_phases = ["python", "tensorflow import", "join", "model", "input and step function"]
    for side, phases in (("hpctf", hpctf_phases), ("plain", [*plain_phases, "first step"])):
        assert list(first[f"{side}_phases_s"]) == phases
        for run in first[f"{side}_runs"]:
            assert run["step"] == 1 and list(run["phases"]) == phases
            assert math.isclose(sum(run["phases"].values()), run["total_s"], abs_tol=0.06)
            assert len(run["every_rank_total_s"]) == first["workers"]
            # Counted from the process's start, so at most what the harness saw from before
            # it started the process (plus the line's rounding and the harness's polling).
            assert 1.0 < run["total_s"] <= run["seen_from_outside_s"] + 0.02
            assert run["phases"]["tensorflow import"] > 0.5  # TensorFlow was imported there
            assert run["cpu_s"] > 0.5  # the process's own CPU time, TensorFlow's import in it
    assert first["met"] == (first["ratio"] <= 1.05)
    # The phase table adds up to each side's median phases, row by row.
    table = first["phase_table"]
    assert len(table) == 9 and table[0]["phase"].startswith("python")
    for side in ("hpctf", "plain"):
        shown = sum(row[f"{side}_s"] or 0 for row in table)
        assert math.isclose(shown, sum(first[f"{side}_phases_s"].values()), abs_tol=0.01)


def check_stall(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    stall, sizes = results["sections"]["stall"], results["sizes"]
    width, depth = sizes["dense_width"], sizes["dense_depth"]
    # bench_entries.dense_stack: 64 features in, 10 logits out, float32.
    params = (64 + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * 10
    assert stall["dense"]["weights_mb"] == round(4 * params / 1e6, 2)
    for model, steps, every in (
        ("digits", sizes["stall_steps"], sizes["stall_every"]),
        ("dense", sizes["dense_steps"], sizes["dense_every"]),
    ):
        found = stall[model]
        assert found["steps"] == steps and found["checkpoint_every_steps"] == every
        assert found["saves"] == len(found["save_s_all"]) == steps // every
        assert positive(found["save_s"], found["step_s"], found["weights_mb"])
        assert found["save_s"] == round(statistics.median(found["save_s_all"][1:]), 4)
        assert found["save_s"] < found["run_s"] and found["step_s"] < found["run_s"]
        # Both sides rounded in the JSON (save_s to 0.1 ms, step_s to 10 us, the quotient to
        # 0.01): the quotient of the rounded sides is off by at most their relative errors
        # (1.5 % for a save of 3.3 ms), plus the quotient's own rounding.
        quotient = found["save_s"] / found["step_s"]
        bound = quotient * (0.00005 / found["save_s"] + 0.000005 / found["step_s"]) + 0.005
        assert abs(found["save_in_steps"] - quotient) <= bound * 1.01, (found, quotient)
        # Adam: the weights and two slots for each, and a little more.
        assert 3 * found["weights_mb"] - 0.02 <= found["checkpoint_mb"] <= 4 * found["weights_mb"]
    # The Dense stack saved both ways, alternated: the same checkpoint, and the ratio of the
    # stalls is the quotient of its sides.
    pairs = list(zip(stall["dense_async"], stall["dense_sync"], strict=True))
    assert len(pairs) == sizes["stall_rounds"] and stall["dense"] == stall["dense_sync"][0]
    ratios = [a["save_s"] / s["save_s"] for a, s in pairs]
    assert all(close(r, x) for r, x in zip(ratios, stall["async_over_sync_rounds"], strict=True))
    assert close(stall["async_over_sync"], statistics.median(ratios))
    for found, sync in pairs:
        # The same tensors, bit for bit; the index's object graph is a few hundred bytes
        # smaller when written from the host copies (measured, TF 2.21).
        assert math.isclose(found["checkpoint_mb"], sync["checkpoint_mb"], rel_tol=0.02)
        assert found["saves"] == sync["saves"]


def check_sweep(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    sweep, rounds = results["sections"]["sweep"], results["sizes"]["sweep_rounds"]
    assert sweep["points"] == 2500
    for side in ("sweep_wall_s", "sweep_cpu_s", "render_wall_s", "render_cpu_s"):
        assert len(sweep[side]) == rounds and positive(*sweep[side])
    # A process's CPU time cannot exceed its wall time by much (one thread does the work).
    cpu, wall = sweep["sweep_cpu_s"], sweep["sweep_wall_s"]
    assert all(c <= w * 1.5 + 0.05 for c, w in zip(cpu, wall, strict=True))
    # The submit (--tiny: 20 points to a stand-in sbatch): every phase timed in every round,
    # within the whole; a point holds its own files only (its code a link to the one snapshot
    # of the sweep); then `hpctf status SWEEP` of it (a tiny run leaves the page cache alone).
    submit = sweep["submit"]
    assert submit["points"] == results["sizes"]["submit_points"] == 20
    assert len(submit["wall_s"]) == rounds and submit["slurm"] is False
    status = submit["status"]
    assert positive(status["wall_s"], status["cpu_s"], status["help_wall_s"])
    assert status["cold"] is False and "opens" in status["calls"]
    for phases, wall in zip(submit["phases_s"], submit["wall_s"], strict=True):
        assert {"planning", "rendering", "creation", "sbatch", "records", "total"} <= set(phases)
        assert positive(*phases.values()) and phases["total"] <= wall
        assert sum(v for k, v in phases.items() if k != "total") <= phases["total"]
    assert submit["files_per_point"] == 9 and submit["shared_files"] >= 3
    dry = sweep["dry_run"]
    assert dry["points"] == results["sizes"]["sweep_dry_points"] == 2000
    assert positive(dry["wall_s"], dry["cpu_s"]) and 10 < dry["peak_rss_mb"] < 1000


def check_listing(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    listing, sizes = results["sections"]["listing"], results["sizes"]
    assert (listing["run_count"], listing["point_count"]) == (
        sizes["listing_runs"],
        sizes["listing_points"],
    )
    for name in ("cold_status", "status", "runs", "sweep_status"):
        found = listing[name]
        assert len(found["samples"]) == sizes["listing_rounds"]
        assert positive(found["wall_s"], found["cpu_s"], found["rss_mb"])
        assert found["met"] == (
            found["wall_s"] <= (1.0 if name == "sweep_status" else 2.0) and found["rss_mb"] <= 300
        )
    assert listing["sweep_cold"] is False  # a tiny run leaves the page cache alone
    assert positive(*listing["first_status"].values())
    assert positive(*listing["first_status_all"].values())
    assert len(listing["index_whole_after_s"]) == sizes["listing_rounds"]


def check_soak(tiny: tuple[dict[str, Any], str]) -> None:
    results = tiny[0]
    soak, sizes = results["sections"]["soak"], results["sizes"]
    steps = sizes["soak_steps"]
    assert soak["steps"] == soak["end_step"] == steps and soak["done"] is True
    assert soak["logged_samples"] == steps // sizes["soak_log_every"]
    every = sizes["soak_log_every"]
    assert soak["start_step"] == max(every, math.ceil(steps / 20 / every) * every)  # from 5 %
    assert soak["threads_start"] >= 10  # TensorFlow's own pools: a real count, not a stub
    assert 100 < soak["rss_mb_start"] < 10_000 and 100 < soak["rss_mb_end"] < 10_000
    assert positive(soak["steps_per_s_start"], soak["steps_per_s_end"])
    # Only the full run puts other sections beside the soak; tiny's lanes leave it its end.
    assert soak["other_sections_ran_at_steps"] == [] and soak["end_window_alone"] is True
    added = soak["threads_added_by_name"]
    assert all(isinstance(n, str) and isinstance(c, int) and c > 0 for n, c in added.items())
    pools = [c for n, c in added.items() if n in ("collective_ops", "event_engine")]
    others = sum(c for n, c in added.items() if n not in ("collective_ops", "event_engine"))
    assert soak["threads_flat"] == (
        soak["threads_end"] <= soak["threads_start"] + 2
        or (bool(added) and others <= 2 and all(c <= 2 for c in pools))
    )
    assert soak["rss_flat"] == (soak["rss_mb_end"] - soak["rss_mb_start"] <= 64)
    assert soak["met"] == (soak["threads_flat"] and soak["rss_flat"] and soak["steps_per_s_flat"])


def check_remote(tiny: tuple[dict[str, Any], str]) -> None:
    remote = tiny[0]["sections"]["remote"]
    assert positive(remote["median_ssh_s"], remote["median_login_s"], remote["runs"])
    assert remote["met"] == (remote["median_ssh_s"] <= remote["goal_s"])


def check_search(tiny: tuple[dict[str, Any], str]) -> None:
    search, sizes = tiny[0]["sections"]["search"], tiny[0]["sizes"]
    if "skipped" in search:  # no Slurm here, and none required
        return
    points = (round(1 / sizes["search_x_step"]) + 1) * sizes["search_depths"]
    assert search["grid_points"] == points and search["trials"] == sizes["search_trials"]
    assert positive(search["grid_node_hours"], search["search_node_hours"])
    assert close(search["ratio"], search["search_node_hours"] / search["grid_node_hours"])
    assert search["grid_starts"] >= points and search["search_starts"] >= 1
    assert sum(search["trial_states"].values()) == sizes["search_trials"]
    assert search["reached"] == (search["search_best"] <= search["grid_best"] + 1e-4)
    assert search["met"] == (search["ratio"] <= 1 / 3 and search["reached"])


def check_dashboard(tiny: tuple[dict[str, Any], str]) -> None:
    dashboard, sizes = tiny[0]["sections"]["dashboard"], tiny[0]["sizes"]
    if "skipped" in dashboard:  # no chromium here: only where the full test command is not run
        assert not os.environ.get("HPCTF_REQUIRE_SLURM") and not os.environ.get("CI"), dashboard
        assert dashboard["met"] is None
        return
    rounds = sizes["dashboard_rounds"]
    assert dashboard["run_count"] == sizes["dashboard_runs"] == dashboard["rows_shown"]
    assert len(dashboard["first_paint_s"]) == rounds and len(dashboard["refresh_s"]) == 3 * rounds
    assert positive(*dashboard["first_paint_s"], *dashboard["refresh_s"])
    # The page's own clock is inside this side's wall clock around the navigation.
    assert all(
        p <= w + 0.05
        for p, w in zip(dashboard["first_paint_s"], dashboard["first_paint_wall_s"], strict=True)
    )
    for row, goal in (("first_paint", 1.0), ("refresh", 0.5)):
        found = dashboard[row]
        assert close(found["ratio"], found["seconds"] / found["baseline_s"])
        assert found["met"] == (found["seconds"] <= goal)
    assert dashboard["met"] == (dashboard["first_paint"]["met"] and dashboard["refresh"]["met"])


CHECKS = [
    check_run_reports_every_section,
    check_login_and_resolver,
    check_runtime,
    check_preemption_and_restart,
    check_crash,
    check_lost_node,
    check_first_step,
    check_stall,
    check_sweep,
    check_listing,
    check_soak,
    check_remote,
    check_search,
    check_dashboard,
]


@pytest.mark.tf
def test_soak_names_the_threads_that_grew(tmp_path: Path) -> None:
    """The soak's sampler (no TensorFlow): a real process found by its command line, its
    threads read by name from /proc, and growth counted from a step on."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_soak
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    runs = tmp_path / "runs"
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "worker", str(runs / "a-run")]
    )
    try:
        deadline = time.monotonic() + 10  # the child's command line, once it has exec'd
        while bench_soak.workers_of(runs) != [sleeper.pid] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bench_soak.workers_of(runs) == [sleeper.pid]
        assert bench_soak.workers_of(tmp_path / "elsewhere") == []
        names = bench_soak.thread_names(sleeper.pid)
        assert sum(names.values()) == len(os.listdir(f"/proc/{sleeper.pid}/task")) >= 1
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not bench_soak.thread_names(sleeper.pid)  # gone: nothing, no error
    sampler = bench_soak.ThreadSampler(runs, lambda: 0)
    sampler.samples = [
        {"step": 10, "pools": {1: {"python": 100, "collective_ops": 3}}},
        {"step": 50, "pools": {1: {"python": 101, "collective_ops": 3}, 2: {"python": 90}}},
        {"step": 90, "pools": {1: {"python": 101, "collective_ops": 5, "event_engine": 1},
                               2: {"python": 89}}},
    ]  # fmt: skip
    # From step 50: worker 1 gained 2 collective_ops and an event_engine, worker 2 lost one.
    assert sampler.growth(50) == {"collective_ops": 2, "event_engine": 1}
    # From step 10: worker 2 was not there yet, so only worker 1 is compared.
    assert sampler.growth(10) == {"collective_ops": 2, "event_engine": 1, "python": 1}
    assert sampler.growth(60) == {}  # one sample: no growth to tell


@pytest.mark.slurm  # its crash, lost_node and search sections start test clusters of their own
@pytest.mark.tf
def test_tiny_run_of_every_section(tiny: tuple[dict[str, Any], str]) -> None:
    """Every check on one tiny run (about 100 s in two lanes). One test, not one per section:
    pytest-xdist gives each worker its own module fixture, and split across two workers the
    tiny run ran twice. A failure names every check that failed."""
    failed = []
    for check in CHECKS:
        try:
            check(tiny)
        except AssertionError as exc:
            failed.append(f"{check.__name__}: {exc}")
    assert not failed, "\n\n".join(failed)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu"], "--gpu needs NVIDIA GPUs, and this machine has none"),
        (["--only", "nonsense"], "unknown section(s) nonsense; choose from login, listing, sweep"),
    ],
    ids=["gpu-without-gpus", "unknown-section"],
)
def test_refuses_cleanly(tmp_path: Path, args: list[str], message: str) -> None:
    if args == ["--gpu"] and shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is here: this machine may have GPUs")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--tiny", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_no_two_sections_define_the_same_method() -> None:
    """Each section is a mixin of one Bench class (benchmarks/run.py): a method two sections
    define is one section's only, and the other's calls reach it (a lost_node run once called
    the dashboard's ``_measure``)."""
    import ast

    owners: dict[str, list[str]] = {}
    for path in sorted((REPO / "benchmarks").glob("bench_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        owners.setdefault(item.name, []).append(path.name)
    shared = {name: files for name, files in owners.items() if len(files) > 1}
    assert not shared, shared

