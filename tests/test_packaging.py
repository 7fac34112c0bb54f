"""The wheel carries templates/ and site_configs/: an installed hpctf renders from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import DIGITS, REPO


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
