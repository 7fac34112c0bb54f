"""The install the README gives until hpctf is on PyPI (issue #20 item 5): the wheel and sdist
built from a clone, the wheel installed into a fresh venv with only the login node's light
dependencies (no TensorFlow), the installed ``hpctf`` answering ``--version`` and ``validate``
from another directory, then the local demo (``make demo``'s command, a few steps) run by it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from tests.conftest import DIGITS, REPO, run_dir_from

# What `pip install hpctf` brings on a login node (pyproject's dependencies) and what they
# need, at the versions of this environment: pip finds them in its cache or local index.
LIGHT = ["click", "jinja2", "markupsafe", "pydantic", "pydantic-core", "annotated-types",
         "typing-extensions", "typing-inspection", "python-hostlist", "pyyaml"]  # fmt: skip


def run(*argv: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.tf  # the demo at its end
def test_the_built_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    hatchling = Path(sys.executable).parent / "hatchling"
    run(hatchling, "build", "-t", "wheel", "-t", "sdist", "-d", dist)
    (wheel,) = dist.glob("hpctf-*-py3-none-any.whl")
    (sdist,) = dist.glob("hpctf-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(n.endswith("/templates/sbatch.sh.j2") for n in names)
    assert not any("/.venv/" in n for n in names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)  # this pip installs into it
    python = venv / "bin" / "python"
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in LIGHT]
    pip = [sys.executable, "-m", "pip", "--python", python]
    run(*pip, "install", "-q", "--no-deps", wheel, *pins)
    run(*pip, "check")  # the wheel's own requirements: all met by the light ones
    installed = run(*pip, "list", "--format=freeze").lower()
    assert "tensorflow" not in installed

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    env.pop("PYTHONPATH", None)
    version = run(venv / "bin" / "hpctf", "--version", cwd=elsewhere, env=env)
    assert version.strip() == f"hpctf, version {importlib.metadata.version('hpctf')}"
    ok = run(venv / "bin" / "hpctf", "validate", DIGITS, "--site", "local", cwd=elsewhere, env=env)
    assert ok.startswith(f"ok: {DIGITS} on site local: 2 node(s)")
    api = "import hpctf, sys; print(hpctf.Run.__module__, 'tensorflow' in sys.modules)"
    assert run(python, "-c", api, cwd=elsewhere, env=env).split() == [
        "hpctf.python_api.run_api", "False"
    ]  # fmt: skip
    assert not (tmp_path / "runs").exists()

    # The local demo, from this install: TensorFlow and the example's scikit-learn are this
    # environment's (a path line in a .pth, after the venv's own site-packages, so hpctf is the
    # wheel's and nested .pth files, the editable install's among them, are not read), not
    # installed again (hundreds of MB).
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(purelib.strip()) / "hpctf-test-deps.pth").write_text(sysconfig.get_paths()["purelib"])
    where = "import hpctf; print(hpctf.__file__)"
    assert run(python, "-c", where, cwd=elsewhere, env=env).startswith(str(venv))
    small = ["resources.nodes=1", "train.steps=10", "checkpoint.every_steps=10",
             "train.preflight=off"]  # fmt: skip
    sets = [arg for value in small for arg in ("--set", value)]
    demo = run(venv / "bin" / "hpctf", "submit", DIGITS, "--site", "local", *sets,
               cwd=elsewhere, env=env)  # fmt: skip
    run_dir = run_dir_from(demo)
    assert run_dir.parent == tmp_path / "runs"
    assert json.loads((run_dir / "DONE").read_text())["step"] == 10
    assert json.loads((run_dir / "config.json").read_text())["python"] == str(python)
