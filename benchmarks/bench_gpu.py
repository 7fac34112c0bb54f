"""The GPU mode: runtime and checkpoint stall of ResNet-50 (gpu_check.py) on GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from harness import HERE, BenchError, Harness, tail


class GpuBench(Harness):
    """One section's measurements, over the shared harness."""

    def gpu_runtime(self) -> dict[str, Any]:
        """benchmarks/gpu_check.py: ResNet-50 through hpctf's worker against plain TF."""
        work = self.folder("gpu_runtime")
        out = work / "gpu-check.json"
        argv = [sys.executable, str(HERE / "gpu_check.py"), "--json", str(out)]
        argv += ["--rounds", str(self.sizes.gpu_rounds), "--steps", str(self.sizes.gpu_steps)]
        log = work / "gpu-check.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        with log.open("wb") as handle:
            proc = subprocess.run(argv, env=env, stdout=handle, stderr=subprocess.STDOUT)
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"gpu_check.py failed (exit {proc.returncode}):\n{tail(log)}")
        data: dict[str, Any] = json.loads(out.read_text())
        ratio = data["ratio"]
        self.row(
            benchmark=f"GPU runtime: ResNet-50, {data['precision']}, XLA, {data['device']}",
            hpctf=f"{data['hpctf_images_per_s']:.0f} images/s",
            baseline=f"{data['plain_images_per_s']:.0f} images/s (plain TF script)",
            result=f"{ratio:.3f}",
            goal=">= 0.97",
            met=ratio >= 0.97,
        )
        data["goal_ratio_min"] = 0.97
        data["met"] = ratio >= 0.97
        return data

    def gpu_stall(self) -> dict[str, Any]:
        """The checkpoint stall of ResNet-50 (~100 MB of float32 weights) on one GPU."""
        work = self.folder("gpu_stall")
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "0"
        args = {
            "builder": "gpu_check:build",
            "image_size": 224,
            "classes": 1000,
            "examples": 512,
            "shuffle_buffer": 512,
        }
        steps = self.sizes.gpu_steps
        result = self._stall_run(
            work,
            "resnet50",
            args,
            steps,
            10,
            max(20, steps // 6),
            nodes=1,
            train={"mixed_precision": True, "jit_compile": True, "communication": "nccl"},
            gpus=gpus,
        )
        result["model"] = "ResNet-50 (gpu_check:build), mixed_float16, XLA, NCCL"
        return result
