"""The compatibility smoke on the oldest TensorFlow hpctf supports (README "Supported versions"):
a second virtual environment with ``tensorflow-cpu`` of that version from the package index,
made by the test on its first run and kept between runs (``$HPCTF_COMPAT_CACHE``, by default
``~/.cache/hpctf-compat``, one directory per TensorFlow version, Python version and package
list), holding TensorFlow
and hpctf's dependencies but not hpctf: the checkout's hpctf runs there through PYTHONPATH.

There: the canaries and fallbacks of hpctf/compute/compat/, then the digits example on 2 local
workers with asynchronous checkpoints and learning-rate scaling, interrupted with Ctrl-C after
its first checkpoint and resumed with ``hpctf resubmit``: DONE, every step logged once, the probe
line with every capability on in each rank log of both starts (tests/compat_smoke.py).
Select it alone with ``-m compat``; leave it out with ``-m "not compat"``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import compat_smoke
from tests.conftest import REPO

pytestmark = [pytest.mark.tf, pytest.mark.compat]

OLDEST_TENSORFLOW = "2.16.2"
# hpctf's own dependencies (pyproject.toml), the digits example's, and the canaries' runner.
PACKAGES = [
    f"tensorflow-cpu=={OLDEST_TENSORFLOW}",
    "click>=8.1",
    "jinja2>=3.1",
    "pydantic>=2.6",
    "python-hostlist>=1.23",
    "PyYAML>=6.0",
    "scikit-learn>=1.3",
    "pytest>=8",
]
BUILD_TIMEOUT_S = 900


def compat_venv(version: str) -> Path:
    """The cached environment for ``version``, made now when it is missing or was left half
    made (its ``.complete`` file is written last)."""
    cache = Path(os.environ.get("HPCTF_COMPAT_CACHE", Path.home() / ".cache" / "hpctf-compat"))
    python = ".".join(platform.python_version_tuple()[:2])
    wanted = hashlib.sha256("\n".join(PACKAGES).encode()).hexdigest()[:8]  # a new list: anew
    venv = cache / f"tensorflow-cpu-{version}-python{python}-{wanted}"
    complete = venv / ".complete"
    if complete.exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The registry's TensorFlow, not a machine's pinned constraints for the newest one.
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *PACKAGES],
        capture_output=True,
        text=True,
        env=env,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if pip.returncode != 0:
        pytest.fail(f"cannot make {venv} from the package index:\n{pip.stderr[-3000:]}")
    complete.write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return venv


def test_the_oldest_tensorflow_trains_interrupted_and_resumed(tmp_path: Path) -> None:
    venv = compat_venv(OLDEST_TENSORFLOW)
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    tests = ["tests/test_compat_canaries.py", "tests/test_compat_fallbacks.py"]
    canaries = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not compat", *tests],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
        check=False,
    )
    assert canaries.returncode == 0, canaries.stdout[-4000:]
    runs = tmp_path / "runs"
    runs.mkdir()
    extra = ("checkpoint.asynchronous=true", "train.scale_learning_rate=true")
    # The first checkpoint at step 15, then 585 steps (seconds, not a fraction of one) in which
    # the Ctrl-C lands: 45 steps had all run before it on a quiet machine ("interrupt: exit 0").
    seen = compat_smoke.interrupted_and_resumed(
        python, runs, steps=600, extra=extra, env=env, every=15
    )
    (probe,) = seen["probe"]  # type: ignore[misc]
    assert probe.startswith(f"tensorflow {OLDEST_TENSORFLOW}, keras 3."), probe
    assert " off " not in probe, probe
    rank_0 = (Path(str(seen["run_dir"])) / "logs" / "rank-0.log").read_text()
    assert rank_0.count("learning rate scaled by 2 replicas: 0.01 -> 0.02") == 2
    assert rank_0.count("checkpoints are written while training goes on") == 2
