"""The compatibility smoke: the digits example on 2 local workers in a given Python environment,
interrupted (Ctrl-C) after its first checkpoint and resumed with ``hpctf resubmit``, checked to
end DONE with every step logged once and the capability probe's line in every rank log.

Used by ``tests/test_compat_smoke.py`` on the oldest supported TensorFlow and by hand on any
other (the environment must hold hpctf, TensorFlow and scikit-learn)::

    python tests/compat_smoke.py /tmp/tf216/bin/python [STEPS [KEY=VALUE ...]]
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits" / "experiment.yaml"
PROBE_LINE = re.compile(r"rank \d+: (tensorflow \S+, keras \S+.*: failure detection .*)$", re.M)


def _checkpoints(run_dir: Path) -> list[int]:
    return sorted(
        int(p.name.split("-")[1].split(".")[0]) for p in run_dir.glob("checkpoints/*.index")
    )


def interrupted_and_resumed(
    python: str,
    runs_root: Path,
    steps: int = 60,
    extra: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    every: int | None = None,
) -> dict[str, object]:
    """Run the smoke with ``python``'s hpctf (``extra``: more ``--set`` values; ``env``: the
    processes' environment, by default this one's; ``every``: the checkpoint interval, by default
    a third of the steps); returns what it saw, raises AssertionError with the launcher's output
    when something is wrong. The interrupt comes after the first checkpoint: the steps after it
    must outlast the poll and the agreement (on a quiet machine 30 digits steps did not)."""
    hpctf = [python, "-m", "hpctf"]
    every = every or max(steps // 3, 1)
    env = {**(os.environ if env is None else env), "HPCTF_RUNS_ROOT": str(runs_root)}
    sets = [f"train.steps={steps}", "train.log_every_steps=1", f"checkpoint.every_steps={every}"]
    sets += extra
    started = time.monotonic()
    launcher = subprocess.Popen(
        [
            *hpctf,
            "submit",
            str(DIGITS),
            "--site",
            "local",
            *(a for s in sets for a in ("--set", s)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=runs_root,
    )
    assert launcher.stdout is not None
    first = ""
    while not (found := re.search(r"^run directory: (\S+)$", first, re.M)):
        line = launcher.stdout.readline()
        assert line, first + launcher.communicate(timeout=120)[0]
        first += line
    run_dir = Path(found.group(1))
    deadline = time.monotonic() + 240
    while not _checkpoints(run_dir):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise AssertionError("no first checkpoint:\n" + first + launcher.communicate()[0])
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)
    out = first + launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 130, f"interrupt: exit {launcher.returncode}\n{out}"
    interrupted = time.monotonic()
    resumed = subprocess.run(
        [*hpctf, "resubmit", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (run_dir / "DONE").exists(), resumed.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["step"] for r in records if "loss" in r]
    assert sorted(logged) == list(range(1, steps + 1)), f"steps lost or repeated: {logged}"
    probes = {}
    for rank_log in sorted((run_dir / "logs").glob("rank-*.log")):
        lines = PROBE_LINE.findall(rank_log.read_text())
        assert len(lines) == 2, f"{rank_log}: {len(lines)} probe lines in 2 starts"
        probes[rank_log.name] = lines[-1]
    assert len(probes) == 2, probes
    saved = re.search(r"cancelled at checkpoint step (\d+)", out)
    return {
        "run_dir": str(run_dir),
        "saved_at": int(saved.group(1)) if saved else None,
        "steps_logged_once": len(logged),
        "probe": sorted(set(probes.values())),
        "seconds": [round(interrupted - started, 1), round(time.monotonic() - interrupted, 1)],
    }


if __name__ == "__main__":
    root = Path(tempfile.mkdtemp(prefix="hpctf-compat-"))  # kept: the run's logs are there
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    print(json.dumps(interrupted_and_resumed(sys.argv[1], root, steps, tuple(sys.argv[3:]))))
