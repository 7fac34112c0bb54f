"""``train.script``: the user's own script as it is, on every task (login checks, the worker's
runner, and one real local run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.compute.cluster.spec import cluster_spec
from hpctf.compute.script.entry import call_script, exit_status, script_environment
from hpctf.core.run.rundir import RunDir
from tests.conftest import write

SCRIPT = """\
import os, sys
print("argv", sys.argv[1:], "name", __name__, "cwd", os.getcwd())
if os.environ["HPCTF_IS_CHIEF"] == "1":
    with open("chief.txt", "w") as out:
        out.write(os.environ["HPCTF_NUM_WORKERS"])
"""


def _experiment(tmp_path: Path, train: str) -> Path:
    write(tmp_path / "exp" / "train.py", SCRIPT)
    return write(
        tmp_path / "exp" / "experiment.yaml",
        f"name: fit\nresources:\n  nodes: 2\ntrain:\n{train}",
    )


def test_name_resources_and_script_alone_are_an_experiment(tmp_path: Path, runs_root: Path) -> None:
    experiment = _experiment(tmp_path, "  script: train.py\n  script_args: [--epochs, '2']\n")
    result = CliRunner().invoke(cli, ["validate", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    assert "2 node(s)" in result.output and not runs_root.exists()


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        (
            "  script: train.py\n  entry: m:f\n",
            "give exactly one of train.entry (module:function) or train.script",
        ),
        ("  script: train.py\n  steps: 10\n", "train.steps is for train.entry"),
        (
            "  script: train.py\n  restart_every_steps: 10\n",
            "train.restart_every_steps is for train.entry",
        ),
        ("  script: train.sh\n", "'train.sh' is not a .py file"),
        ("  script: missing.py\n", "missing.py is not a file"),
        (
            "  entry: seed_fit\n  steps: 1\n  global_batch_size: 1\n",
            "to run a script as it is, give train.script",
        ),
        (
            "  entry: seed_fit.py\n  steps: 1\n  global_batch_size: 1\n",
            "is a file: to run a script as it is, give it as train.script",
        ),
        ("  entry: m:f\n  steps: 1\n", "train.global_batch_size is required with train.entry"),
        (
            "  entry: m:f\n  steps: 1\n  global_batch_size: 1\n  keras: 2\n",
            "train.keras: 2 is for train.script",
        ),
    ],
    ids=[
        "both",
        "steps",
        "restarts",
        "not-py",
        "missing",
        "no-colon",
        "py-entry",
        "no-batch",
        "keras2",
    ],
)
def test_script_mistakes_are_one_line(
    tmp_path: Path, runs_root: Path, train: str, expected: str
) -> None:
    experiment = _experiment(tmp_path, train)
    result = CliRunner().invoke(cli, ["validate", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not runs_root.exists()


def test_script_outside_python_path_is_refused(tmp_path: Path, runs_root: Path) -> None:
    write(tmp_path / "elsewhere" / "train.py", SCRIPT)
    experiment = _experiment(tmp_path, "  script: ../elsewhere/train.py\n")
    result = CliRunner().invoke(cli, ["validate", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 2 and "outside train.python_path" in result.output


@pytest.mark.parametrize("command", ["validate", "render", "submit --dry-run"])
def test_a_py_file_is_an_experiment_made_on_the_fly(
    tmp_path: Path, runs_root: Path, fake_sbatch: Path, command: str
) -> None:
    script = write(tmp_path / "my seed_fit.py", SCRIPT)
    result = CliRunner().invoke(
        cli,
        [*command.split(), str(script), "--site", "local-slurm", "--set", "resources.nodes=2"],
    )
    assert result.exit_code == 0, result.output
    if command != "validate":
        assert "#SBATCH --nodes=2" in result.output
        assert "#SBATCH --job-name=my-seed_fit" in result.output
    assert not runs_root.exists()


def test_a_py_file_without_a_site_asks_for_site(tmp_path: Path, runs_root: Path) -> None:
    script = write(tmp_path / "train.py", SCRIPT)
    result = CliRunner().invoke(cli, ["validate", str(script)])
    assert result.exit_code == 2
    assert f"{script}: site: no site given; pass --site, one of: " in result.output


def test_the_frozen_config_runs_the_snapshot_copy(tmp_path: Path, runs_root: Path) -> None:
    experiment = _experiment(tmp_path, "  script: train.py\n")
    output = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        cli, ["render", str(experiment), "--site", "local-slurm", "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    (run_path,) = runs_root.iterdir()
    frozen = RunDir(run_path).load_config().experiment.train
    assert frozen.script is not None and Path(frozen.script).is_relative_to(run_path / "code")
    assert Path(frozen.script).read_text() == SCRIPT


@pytest.mark.parametrize(
    ("code", "status"),
    [(None, 0), (0, 0), (75, 75), (1, 1), (5, 5), ("boom", 1), (True, 1), (124, 1), (70, 1)],
)
def test_exit_status_keeps_75_and_hpctfs_own_statuses_apart(code: object, status: int) -> None:
    assert exit_status(code) == status


def test_call_script_runs_main_with_args_and_returns_its_exit(tmp_path: Path) -> None:
    script = write(
        tmp_path / "s.py",
        "import sys\nassert __name__ == '__main__'\nsys.exit(int(sys.argv[1]))\n",
    )
    assert call_script(str(script), ["75"]) == 75
    done = write(tmp_path / "d.py", "x = 1\n")
    assert call_script(str(done), []) is None
    raising = write(tmp_path / "r.py", "raise KeyError('mine')\n")
    with pytest.raises(KeyError, match="mine"):
        call_script(str(raising), [])


def test_script_environment_names_run_checkpoints_rank_and_chief(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path, "  script: train.py\n")
    from hpctf.login.resolving.loader import load_config

    config = load_config(experiment, "local-slurm", [], {**os.environ}).config
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "2",
    }
    spec = cluster_spec(env, (20000, 30000), "{host}")
    found = script_environment(config, RunDir(tmp_path / "run"), spec)
    assert found == {
        "HPCTF_RUN_DIR": str(tmp_path / "run"),
        "HPCTF_CHECKPOINT_DIR": str(tmp_path / "run" / "script_checkpoints"),
        "HPCTF_SOURCE_DIR": str(tmp_path / "exp"),
        "HPCTF_RANK": "1",
        "HPCTF_NUM_WORKERS": "2",
        "HPCTF_IS_CHIEF": "0",
    }


@pytest.mark.tf
def test_a_script_runs_as_main_on_every_local_task(tmp_path: Path, runs_root: Path) -> None:
    """The real thing, without Slurm: 2 local tasks run the script from the snapshot, in the
    run directory, with its arguments; the chief writes DONE and the journal says done."""
    script = write(tmp_path / "src" / "train.py", SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctf",
            "submit",
            str(script),
            "--site",
            "local",
            "--set",
            "resources.tasks_per_node=2",
            "--set",
            'train.script_args=["a", "b c"]',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_path,) = runs_root.iterdir()
    assert (run_path / "chief.txt").read_text() == "2"
    assert json.loads((run_path / "DONE").read_text())["step"] is None
    logs = "".join(p.read_text() for p in sorted((run_path / "logs").iterdir()))
    # The chief works in the run directory, the other rank in a scratch directory of its own.
    assert logs.count("argv ['a', 'b c'] name __main__ cwd " + str(run_path) + "\n") == 1, logs
    assert logs.count("argv ['a', 'b c'] name __main__ cwd ") == 2, logs
    assert re.search(r"cwd /\S+/rank-1-cwd\n", logs), logs
    assert [e["event"] for e in RunDir(run_path).events()][-1] == "ended"


def test_copy_of_maps_a_source_file_into_its_copy_and_keeps_a_copy() -> None:
    from hpctf.core.run.snapshot import Source, copy_of

    sources = [Source("/src/a", "/run/code/0-a", 1, 1), Source("/src", "/run/code/1-src", 2, 2)]
    assert copy_of("/src/a/train.py", sources) == "/run/code/0-a/train.py"
    assert copy_of("/src/b/train.py", sources) == "/run/code/1-src/b/train.py"
    # resubmit --update-code: the frozen path is already a copy, whose name a new copy keeps
    assert copy_of("/run/code/0-a/train.py", sources) == "/run/code/0-a/train.py"


def test_keras_2_without_tf_keras_is_one_line_before_the_script() -> None:
    from hpctf.compute.script.entry import check_keras
    from hpctf.core.errors import UserError
    from hpctf.core.settings.train import Train

    settings = Train(script="fit.py", keras=2)
    check_keras(settings, lambda name: object())
    with pytest.raises(UserError, match=r"train.keras: 2 needs tf_keras, which .* install hpctf"):
        check_keras(settings, lambda name: None)
    check_keras(Train(script="fit.py"), lambda name: None)  # Keras 3 needs no tf_keras
