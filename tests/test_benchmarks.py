"""benchmarks/run.py at CI size (--tiny): every benchmark runs, so none can rot.

Structure only: the numbers of a tiny run on a shared machine say nothing about speed, so no
time is asserted here, only that each section measured something and reported it.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

RUN = REPO / "benchmarks" / "run.py"
SECTIONS = {"login", "resolver", "runtime", "preemption", "stall", "soak"}


def positive(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)


@pytest.mark.tf
def test_every_benchmark_runs_at_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "tiny"
    assert results["date"] and positive(results["machine"]["cpus"])
    assert set(results["sections"]) == SECTIONS
    assert positive(*results["seconds"].values())
    sections = results["sections"]

    login = sections["login"]
    assert login["runs"] == 5 and positive(login["baseline"]["median_s"])
    assert set(login["commands"]) == {"hpctf render", "hpctf submit --dry-run", "hpctf status RUN"}
    for command in login["commands"].values():
        assert positive(command["median_s"], command["ratio"]) and len(command["times_s"]) == 5

    rows = sections["resolver"]["rows"]
    assert {(r["nodes"], r["tasks_per_node"]) for r in rows} == {
        (n, t) for n in (10, 1000, 4000, 10000) for t in (1, 4)
    }
    for row in rows:
        assert row["workers"] == row["nodes"] * row["tasks_per_node"]
        assert positive(row["hpctf"]["median_ms"]) and row["hpctf"]["right"] is True
        assert positive(row["tf"]["median_ms"]) and isinstance(row["tf"]["right"], bool)
    assert isinstance(sections["resolver"]["met"], bool)

    runtime = sections["runtime"]
    assert positive(runtime["hpctf_steps_per_s"], runtime["plain_steps_per_s"], runtime["ratio"])
    assert runtime["hpctf_windows"][0] and runtime["plain_windows"][0]

    preemption = sections["preemption"]
    assert set(preemption["signals"]) == {"SIGUSR2", "SIGTERM"}
    for signalled in preemption["signals"].values():
        assert signalled["exit_codes"] == [75, 75] and signalled["steps_lost"] >= 0
        assert positive(signalled["signal_to_exit_s"], signalled["saved_step"])
        assert positive(
            signalled["signal_to_checkpoint_s"], *signalled["signal_to_exit_s_per_rank"]
        )
    restart = preemption["restart"]
    assert restart["resumed_message_in_log"] is True
    assert positive(restart["restart_median_s"], restart["cold_start_median_s"], restart["ratio"])
    phases = ["launch", "worker_up", "tensorflow_imported", "strategy", "restored", "first_step"]
    spans = [f"{a}->{b}" for a, b in itertools.pairwise(phases)]
    for side in ("restart_phases_s", "cold_start_phases_s"):  # rank 0's log still says each
        assert list(restart[side]) == spans, restart[side]

    for model in ("digits", "dense"):
        stall = sections["stall"][model]
        assert stall["saves"] >= 2
        assert positive(
            stall["save_s"], stall["step_s"], stall["weights_mb"], stall["checkpoint_mb"]
        )

    soak = sections["soak"]
    assert soak["steps"] == soak["end_step"] == 2000 and soak["done"] is True
    assert positive(soak["threads_start"], soak["threads_end"], soak["rss_mb_start"])
    assert positive(soak["rss_mb_end"], soak["steps_per_s_start"], soak["steps_per_s_end"])

    table = results["table"]
    assert {row["section"] for row in table} == SECTIONS
    assert all(isinstance(row["met"], bool | None) for row in table)
    assert "| benchmark | hpctf | against | result | goal | met |" in proc.stdout
    assert "| nodes x tasks/node |" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu"], "--gpu needs NVIDIA GPUs, and this machine has none"),
        (["--only", "nonsense"], "unknown section(s) nonsense; choose from login, resolver"),
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
