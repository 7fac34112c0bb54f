"""What benchmarks/run.py prints and records about a run: the machine and the tables."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from harness import REPO, milliseconds

# --- the driver -------------------------------------------------------------------------------


def gpus_here() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists; empty without the tool or the driver."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        proc = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
        info["cpu"] = model.group(1).strip() if model else platform.processor()
    with contextlib.suppress(OSError, AttributeError, ValueError):
        meminfo = Path("/proc/meminfo").read_text()
        found = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
        info["memory_gb"] = round(int(found.group(1)) / 1024**2, 1) if found else None
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    for package in ("tensorflow-cpu", "tensorflow", "keras"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[package] = importlib.metadata.version(package)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["hpctf_commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    return info


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = [
        "| benchmark | hpctf | against | result | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(
            f"| {row['benchmark']} | {row['hpctf']} | {row['baseline']} | {row['result']} "
            f"| {row['goal']} | {met} |"
        )
    return "\n".join(lines)


def resolver_table(data: dict[str, Any]) -> str:
    """Every resolver layout, hpctf beside TF's resolver."""
    lines = [
        "| nodes x tasks/node | names | hpctf cluster_spec | TF SlurmClusterResolver |",
        "|---|---|---|---|",
    ]
    for row in data["rows"]:
        ours, theirs = row["hpctf"], row.get("tf", {})
        ok = "right" if ours["right"] and ours["unique"] else "WRONG"
        if "error" in theirs:
            tf_text = f"failed: {theirs['error'][:60]}"
        elif theirs:
            verdict = (
                "right"
                if theirs["right"]
                else f"{theirs['wrong_ranks']:,} of {row['workers']:,} ranks wrong"
            )
            tf_text = f"{milliseconds(theirs['median_ms'])}, {verdict}"
        else:
            tf_text = "not measured"
        lines.append(
            f"| {row['nodes']:,} x {row['tasks_per_node']} | {row['names']} "
            f"| {milliseconds(ours['median_ms'])}, {ok} | {tf_text} |"
        )
    return "\n".join(lines)
