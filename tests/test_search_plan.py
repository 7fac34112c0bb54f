"""A search planned on the login node, without Slurm: every problem one line and exit 2 before
anything is written, and a dry run that renders the array of agents and writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hpctf.core.errors import UserError
from tests.conftest import DIGITS, HPCTF
from tests.fake_slurm import FakeSlurm

pytest.importorskip("optuna")

GOOD = {
    "train.args.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
    "train.args.hidden": {"type": "categorical", "choices": [8, 16]},
}


def experiment(tmp_path: Path, parameters: dict[str, object]) -> Path:
    path = tmp_path / "experiment.yaml"
    text = DIGITS.read_text().replace(
        "train:\n", "train:\n  python_path: [" + str(DIGITS.parent) + "]\n", 1
    )
    search = {"parameters": parameters, "trials": 6, "parallel": 4,
              "objective": {"metric": "eval.loss", "direction": "minimize"}}  # fmt: skip
    path.write_text(text + "sweep: " + json.dumps(search) + "\n")
    return path


def hpctf(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
    }
    return subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"train.args.learning_rate": {"type": "float", "low": 0.1, "high": 0.01}},
         "sweep.parameters.train.args.learning_rate: low (0.1) must be below high (0.01)"),
        ({"train.args.widht": {"type": "int", "low": 1, "high": 3}},
         "sweep.parameters.train.args.widht = 1: "),
        ({"train.args.hidden": {"type": "categorical", "choices": ["wide"]}},
         "sweep.parameters.train.args.hidden = 'wide': "),
        ({"resources.nodes": {"type": "int", "low": 1, "high": 2}},
         "sweep.parameters.resources.nodes: a search's parameter may not set resources.*"),
        ({"train.stepz": {"type": "int", "low": 1, "high": 2}},
         "sweep.parameters.train.stepz = 1: "),
    ],
)  # fmt: skip
def test_a_bad_search_is_one_line_and_exit_2(
    tmp_path: Path, parameters: dict[str, object], message: str
) -> None:
    path = experiment(tmp_path, parameters)
    for args in (["validate", str(path)], ["sweep", str(path), "--site", "local-slurm"]):
        proc = hpctf(tmp_path, *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_grid_flags_on_a_search_are_refused(tmp_path: Path) -> None:
    path = experiment(tmp_path, GOOD)
    proc = hpctf(tmp_path, "sweep", str(path), "--grid", "train.seed=1,2", "--site", "local-slurm")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"Error: --grid: {path} has a sweep: section (a search); give its space there "
        "(sweep.parameters, sweep.parallel), or drop the section to sweep a grid"
    ]


def test_a_dry_run_renders_the_array_of_agents_and_writes_nothing(tmp_path: Path) -> None:
    path = experiment(tmp_path, GOOD)
    proc = hpctf(tmp_path, "sweep", str(path), "--site", "local-slurm", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "6 trial(s), tpe sampler, pruner none, minimize eval.loss; one job array of 4" in (
        proc.stdout
    )
    assert "#SBATCH --array=0-3" in proc.stdout
    assert '"$PYTHON" -m hpctf search-next "$SWEEP_DIR" --after-run' in proc.stdout
    assert not (tmp_path / "runs").exists()
    # A local site runs no job array: refused, nothing written.
    proc = hpctf(tmp_path, "sweep", str(path), "--site", "local")
    assert proc.returncode == 2 and "a search's trials are the tasks of a Slurm" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_array_of_agents_passes_shellcheck(tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    proc = hpctf(tmp_path, "sweep", str(experiment(tmp_path, GOOD)), "--site", "local-slurm",
                 "--dry-run")  # fmt: skip
    script = tmp_path / "agents.sh"
    script.write_text("".join(line + "\n" for line in proc.stdout.splitlines()[1:]))
    checked = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_hpctf_sweep_from_python_starts_a_search_as_the_cli_does(
    tmp_path: Path, runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """`hpctf.sweep()` of an experiment with a `sweep:` section said "nothing to sweep: give
    --grid ..." (CLI words, from Python); it goes through the CLI's one start: the search's
    directory, its array submitted, a Sweep that reads as a search. Grid arguments with it
    are refused in the CLI's one line."""
    import hpctf

    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\nMaxJobCount = 10000\n")
    path = experiment(tmp_path, GOOD)
    with pytest.raises(UserError, match="has a sweep: section"):
        hpctf.sweep(path, grid={"train.seed": [1, 2]}, site="local-slurm")
    assert not list(runs_root.glob("*"))
    found = hpctf.sweep(path, site="local-slurm")
    assert found.is_search and (found.path / "study.journal").is_file()
    (call,) = fake_slurm.calls("sbatch")
    assert call.endswith(f"{found.path}/array-0.sbatch")
