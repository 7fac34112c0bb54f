"""The resolver section: hpctf's cluster_spec against TF's SlurmClusterResolver."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from harness import HERE, BenchError, Harness, tail


class ResolverBench(Harness):
    """One section's measurements, over the shared harness."""

    def resolver(self) -> dict[str, Any]:
        work = self.folder("resolver")
        out = work / "resolver.json"
        argv = [
            sys.executable,
            str(HERE / "bench_tfconfig.py"),
            "--scale",
            ",".join(map(str, self.sizes.resolver_nodes)),
            "--tasks",
            "1,4",
            "--repeat",
            str(self.sizes.resolver_repeat),
            "--json",
            str(out),
        ]
        log = work / "resolver.log"
        with log.open("wb") as handle:
            proc = subprocess.run(
                argv, env=self.env(work), stdout=handle, stderr=subprocess.STDOUT, check=False
            )
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"bench_tfconfig.py failed (exit {proc.returncode}):\n{tail(log)}")
        data: dict[str, Any] = json.loads(out.read_text())
        rows = data["rows"]
        at_4000 = [r for r in rows if r["nodes"] == 4000]
        slowest = max((r["hpctf"]["median_ms"] for r in at_4000), default=0.0)
        always_right = all(r["hpctf"]["right"] and r["hpctf"]["unique"] for r in rows)
        data["goal_ms_at_4000_max"] = 20
        data["hpctf_slowest_ms_at_4000"] = slowest
        data["hpctf_always_right"] = always_right
        data["met"] = bool(at_4000) and slowest <= 20 and always_right
        tf_4000 = [r["tf"] for r in at_4000 if "median_ms" in r.get("tf", {})]
        tf_wrong = sum(1 for r in rows if not r.get("tf", {}).get("right", False))
        self.row(
            benchmark="resolver: 4,000 nodes, 1 and 4 tasks/node (slowest)",
            hpctf=f"{slowest:.1f} ms, {'always right' if always_right else 'WRONG answers'}",
            baseline=(
                f"TF SlurmClusterResolver {max(t['median_ms'] for t in tf_4000):.1f} ms; "
                f"wrong in {tf_wrong} of {len(rows)} layouts"
                if tf_4000
                else "TF SlurmClusterResolver: not measured"
            ),
            result=f"{slowest:.1f} ms",
            goal="<= 20 ms, always right",
            met=data["met"],
        )
        return data
