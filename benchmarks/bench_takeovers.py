"""The crash section's soak of warm-standby takeovers (hpctf.compute.start.standby): what every
process of the run holds, sampled before each SIGKILL of the standby run's rounds, so that a
leak across takeovers shows as growth from the first taken-over start to the last.

Sampled from /proc: each keeper (``hpctf standby RUN_DIR``, no ``--child``; it lives for the
whole allocation) its threads, RSS and open descriptors; each idle standby the same (what a
standby costs a node); rank 1's worker (the standby that took
over) its threads and RSS; the processes whose command line names the run; the entries left in
the workers' temporary directory (``hpctf-rank*``: a killed worker's own directory, removed by
its keeper) and the standby sockets' folders.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

# Flat: what a keeper holds does not move; a worker's threads within TF's and gRPC's growing
# pools (bench_soak.GROWING_POOLS: +2 each) and its RSS within bench_soak's 64 MB.
KEEPER_RSS_MB = 8.0
WORKER_THREADS = 4
WORKER_RSS_MB = 64.0


def _status(pid: int) -> dict[str, str]:
    found = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            found[key] = value.strip()
    return found


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _holdings(pid: int) -> dict[str, float]:
    status = _status(pid)
    rss_kb = float(status.get("VmRSS", "0 kB").split()[0])
    fds = 0
    with contextlib.suppress(OSError):
        fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return {
        "threads": int(status.get("Threads", "0")),
        "rss_mb": round(rss_kb / 1024, 1),
        "fds": fds,
    }


def sample(run_dir: Path, worker: int) -> dict[str, Any]:
    """What the run's processes hold now; ``worker``: rank 1's worker process."""
    named = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and bytes(run_dir) in _argv(int(p.name))
    ]
    # The keepers and standbys themselves, not the srun that started them (its argv names
    # the same command).
    pythons = [
        pid
        for pid in named
        if b"standby" in _argv(pid) and not Path(os.fsdecode(_argv(pid)[0])).name.startswith("srun")
    ]
    keepers = sorted(pid for pid in pythons if b"--child" not in _argv(pid))
    working = {int(pid) for log in (run_dir / "logs").glob("rank-*.log") for pid in _pids(log)}
    idle = [pid for pid in pythons if b"--child" in _argv(pid) and pid not in working]
    tmp = Path(_environ(worker).get("TMPDIR") or "/tmp")
    left = sorted(p.name for p in tmp.glob("hpctf-rank*")) if tmp.is_dir() else []
    return {
        "keepers": {pid: _holdings(pid) for pid in keepers},
        "worker": _holdings(worker),
        "idle_standbys": [_holdings(pid) for pid in idle],
        "processes": len(named),
        "tmp_entries": len(left),
        "standby_folders": len(list(tmp.glob("hpctf-standby-*"))) if tmp.is_dir() else 0,
    }


def _pids(rank_log: Path) -> list[str]:
    """The pid of the rank's latest worker (its log's last ``host ... pid N`` line)."""
    found = re.findall(r"rank \d+: host \S+ pid (\d+) ", rank_log.read_text(errors="replace"))
    return found[-1:]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def verdict(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Growth from the first sample taken in a taken-over start (the second) to the last, and
    whether it is flat; None-free with fewer than two such samples (nothing to compare)."""
    taken = samples[1:]
    if len(taken) < 2:
        return {"takeovers": len(taken), "flat": None}
    first, last = taken[0], taken[-1]
    keepers = first["keepers"].keys() & last["keepers"].keys()
    keeper_growth = {
        str(pid): {
            k: round(last["keepers"][pid][k] - first["keepers"][pid][k], 1)
            for k in ("threads", "rss_mb", "fds")
        }
        for pid in sorted(keepers)
    }
    worker_growth = {
        k: round(last["worker"][k] - first["worker"][k], 1) for k in ("threads", "rss_mb")
    }
    flat = (
        len(keepers) == len(first["keepers"]) > 0  # the same keepers all along
        and all(
            g["threads"] == 0 and g["fds"] == 0 and g["rss_mb"] <= KEEPER_RSS_MB
            for g in keeper_growth.values()
        )
        and worker_growth["threads"] <= WORKER_THREADS
        and worker_growth["rss_mb"] <= WORKER_RSS_MB
        and last["processes"] <= first["processes"]
        and last["tmp_entries"] <= first["tmp_entries"]
        and last["standby_folders"] <= first["standby_folders"]
    )
    return {
        "takeovers": len(taken),
        "first": first,
        "last": last,
        "keeper_growth": keeper_growth,
        "worker_growth": worker_growth,
        "flat": flat,
    }


def summary(result: dict[str, Any]) -> str:
    """One line for the report's row."""
    if result["flat"] is None:
        return f"{result['takeovers']} takeover(s): too few to compare"
    first, last = result["first"], result["last"]
    parts = []
    for pid in result["keeper_growth"]:
        was, now = first["keepers"][int(pid)], last["keepers"][int(pid)]
        parts.append(
            f"threads {was['threads']}->{now['threads']} RSS {was['rss_mb']:.0f}->"
            f"{now['rss_mb']:.0f} MB fds {was['fds']}->{now['fds']}"
        )
    keepers = ", ".join(parts)
    idle = [f"{s['rss_mb']:.0f} MB" for s in last["idle_standbys"]]
    return (
        f"{result['takeovers']} takeovers: keepers {keepers}; idle standbys {', '.join(idle)}; "
        f"rank 1's worker threads "
        f"{first['worker']['threads']}->{last['worker']['threads']}, RSS "
        f"{first['worker']['rss_mb']:.0f}->{last['worker']['rss_mb']:.0f} MB; processes "
        f"{first['processes']}->{last['processes']}, tmp entries "
        f"{first['tmp_entries']}->{last['tmp_entries']}"
    )
