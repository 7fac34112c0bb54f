"""This process's thread count and resident memory, for the progress records.

A worker must keep both flat over a run of 10^5 steps; recording them with every logged step
makes a leak visible in ``metrics.jsonl`` long before the process dies of it.
"""

from __future__ import annotations

from pathlib import Path


def parse_status(text: str) -> dict[str, float]:
    """``threads`` and ``rss_mb`` from the text of /proc/<pid>/status (missing keys left out)."""
    usage: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Threads":
            usage["threads"] = int(value)
        elif key == "VmRSS":  # "  123456 kB"
            usage["rss_mb"] = round(int(value.split()[0]) / 1024, 1)
    return usage


def process_usage(status: Path = Path("/proc/self/status")) -> dict[str, float]:
    """This process's usage; empty where /proc does not exist (macOS)."""
    try:
        return parse_status(status.read_text())
    except OSError:
        return {}
