"""The rendered batch script: valid shell, quoted values, hostile input inert or refused."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.render import ENVIRONMENT
from tests.conftest import DIGITS, write

HOSTILE = "$(touch pwned) `touch pwned2` 'single' \"double\" * ; -rf & | > out"


def render_to(tmp_path: Path, **experiment_changes: object) -> Path:
    data = yaml.safe_load(DIGITS.read_text())
    data.update(experiment_changes)
    data["train"]["python_path"] = [str(DIGITS.parent)]
    experiment = write(tmp_path / "experiment.yaml", yaml.safe_dump(data))
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        cli, ["render", str(experiment), "--site", "local-slurm", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out


def test_script_is_valid_bash(tmp_path: Path, runs_root: Path) -> None:
    script = render_to(tmp_path, env={"HOSTILE": HOSTILE})
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(
    shutil.which("shellcheck") is None and not os.environ.get("CI"), reason="no shellcheck"
)
def test_script_passes_shellcheck(tmp_path: Path, runs_root: Path) -> None:
    script = render_to(tmp_path, env={"HOSTILE": HOSTILE, "NCCL_DEBUG": "INFO"})
    proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_hostile_env_value_reaches_the_job_literally(tmp_path: Path, runs_root: Path) -> None:
    """Execute the script with srun replaced by a recorder; nothing in the value runs."""
    script = render_to(tmp_path, env={"HOSTILE": HOSTILE})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = bin_dir / "srun"
    recorder.write_text(
        '#!/bin/bash\nprintf "%s" "$HOSTILE" > "$RECORD"\nprintf "%s\\n" "$@" > "$RECORD.argv"\n'
    )
    recorder.chmod(0o755)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    record = tmp_path / "record"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "SLURM_JOB_ID": "99",
        "SLURM_JOB_NODELIST": "node1",
    }
    proc = subprocess.run(
        ["bash", str(script)], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert record.read_text() == HOSTILE
    assert list(workdir.iterdir()) == []  # no pwned files, no redirect target
    argv = (tmp_path / "record.argv").read_text().splitlines()
    assert argv[:1] == ["--kill-on-bad-exit=1"] and argv[-3:-1] == ["hpctf", "worker"]


def test_newline_in_env_value_is_refused(tmp_path: Path, runs_root: Path) -> None:
    data = yaml.safe_load(DIGITS.read_text())
    data["env"] = {"BAD": "a\nb"}
    experiment = write(tmp_path / "e.yaml", yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["render", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 2 and "newline" in result.output


def test_unsafe_runs_root_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "my runs"
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(root))
    result = CliRunner().invoke(
        cli, ["render", str(DIGITS), "--site", "local-slurm", "-o", str(tmp_path / "j")]
    )
    assert result.exit_code == 2
    assert "cannot go into an #SBATCH line" in result.output
    assert not root.exists() and not (tmp_path / "j").exists()


def test_environment_is_strict() -> None:
    with pytest.raises(jinja2.UndefinedError):
        ENVIRONMENT.from_string("{{ missing }}").render()
    assert ENVIRONMENT.from_string("{{ v | sh }}").render(v="a b") == "'a b'"
