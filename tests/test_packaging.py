"""The wheel carries templates/ and site_configs/: an installed hpctf renders from anywhere."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import DIGITS, REPO, tools_required


def test_installed_wheel_finds_its_templates_and_sites(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("hpctf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hpctf/templates/sbatch.sh.j2" in names
    assert "hpctf/site_configs/local-slurm.yaml" in names
    # hpctf ui's page, served from the package (no CDN): its files and uPlot's license.
    static = "hpctf/login/dashboard/static/"
    for name in ("index.html", "app.js", "charts.js", "style.css", "uPlot.iife.min.js",
                 "uPlot.min.css", "LICENSE-uPlot"):  # fmt: skip
        assert static + name in names, name
    target = tmp_path / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    where = subprocess.run(
        [sys.executable, "-c", "import hpctf; print(hpctf.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target))  # the installed copy, not the checkout
    proc = subprocess.run(
        [sys.executable, "-m", "hpctf", "render", str(DIGITS), "--site", "local-slurm"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=debug" in proc.stdout
    init = subprocess.run(
        [sys.executable, "-m", "hpctf", "init", "new-experiment"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert init.returncode == 0, init.stderr
    assert (elsewhere / "new-experiment" / "train.py").exists()


# Distributions that install the `tensorflow` module (they overwrite each other's files).
TENSORFLOW_DISTRIBUTIONS = frozenset(
    {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "intel-tensorflow"}
)
# The installs the README documents: tf, gpu, keras2 and gpu,keras2. gpu is not resolved on its
# own: its requirements are a subset of gpu,keras2's, which hold one TensorFlow package, and
# tensorflow[and-cuda] is one (each resolution of tensorflow[and-cuda] takes ~30 s here).
DOCUMENTED_INSTALLS = ("tf", "keras2", "gpu,keras2")


def _requirements(extras: str) -> list[str]:
    """hpctf's dependencies and those of ``extras`` (comma-separated), from pyproject.toml: what
    ``pip install hpctf[extras]`` asks for, without building hpctf to find out."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    return [*project["dependencies"], *(r for e in extras.split(",") for r in optional[e])]


def _resolved(extras: str, report: Path) -> list[str]:
    """What ``pip install hpctf[extras]`` would install into an empty environment (a dry run:
    metadata only, nothing downloaded but what the resolver needs)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            *_requirements(extras),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        message = f"pip cannot resolve hpctf[{extras}]: {proc.stderr.strip()[-2000:]}"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)  # no package index here (offline)
    data = json.loads(report.read_text())
    names = (re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower() for item in data["install"])
    return sorted(name for name in names if name in TENSORFLOW_DISTRIBUTIONS)


def test_each_documented_install_holds_one_tensorflow(tmp_path: Path) -> None:
    """Every install the README documents resolves to exactly one TensorFlow package (tf with
    keras2 would be two: tf_keras requires `tensorflow`; doctor and the preflight refuse it)."""
    with ThreadPoolExecutor(len(DOCUMENTED_INSTALLS)) as pool:
        found = dict(
            zip(
                DOCUMENTED_INSTALLS,
                pool.map(
                    lambda extras: _resolved(extras, tmp_path / f"{extras}.json"),
                    DOCUMENTED_INSTALLS,
                ),
                strict=True,
            )
        )
    cpu = "tensorflow-cpu" if platform.machine() == "x86_64" else "tensorflow"
    assert found == {"tf": [cpu], "keras2": ["tensorflow"], "gpu,keras2": ["tensorflow"]}
