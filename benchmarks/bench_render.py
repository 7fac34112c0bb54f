"""Is `hpctf render` fast enough for a login node? Whole processes, timed side by side.

Runs ``hpctf render examples/digits/experiment.yaml --site local-slurm`` and
``python -c "import tensorflow"`` alternately, REPEAT times each, on this machine in this
run, and prints both medians and their ratio. Exits 1 when the ratio is above --max-ratio
(default 0.1: rendering must cost at most a tenth of importing TensorFlow).

    .venv/bin/python benchmarks/bench_render.py [--repeat 7] [--max-ratio 0.1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--max-ratio", type=float, default=0.1)
    args = parser.parse_args()

    script = Path(sys.executable).with_name("hpctf")  # the console script users run
    hpctf = [str(script)] if script.exists() else [sys.executable, "-m", "hpctf"]
    experiment = str(REPO / "examples" / "digits" / "experiment.yaml")
    render = [*hpctf, "render", experiment, "--site", "local-slurm"]
    import_tf = [sys.executable, "-c", "import tensorflow"]
    with tempfile.TemporaryDirectory() as runs:
        env = {**os.environ, "HPCTF_RUNS_ROOT": runs, "TF_CPP_MIN_LOG_LEVEL": "3"}
        run_once(render, env)  # warm the page cache and .pyc files for both, untimed
        run_once(import_tf, env)
        render_times, tf_times = [], []
        for _ in range(args.repeat):  # alternate, so load on the machine hits both alike
            render_times.append(run_once(render, env))
            tf_times.append(run_once(import_tf, env))
    render_median = statistics.median(render_times)
    tf_median = statistics.median(tf_times)
    ratio = render_median / tf_median
    print(
        f"hpctf render             median {render_median:.3f} s  "
        f"({', '.join(f'{t:.3f}' for t in render_times)})"
    )
    print(
        f"python -c 'import tensorflow' median {tf_median:.3f} s  "
        f"({', '.join(f'{t:.3f}' for t in tf_times)})"
    )
    print(f"ratio {ratio:.3f} (limit {args.max_ratio})")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
