"""A grid sweep and a search on a container site (pyxis, apptainer): their job array's script
starts each task's workers through the same container lines a single run's script has
(:mod:`hpctf.login.submitting.containers`), with the sweep directory mounted and each task in
its own run directory.

Golden array scripts (``tests/golden-arrays/``, regenerated as tests/test_golden.py's are, with
``HPCTF_REGENERATE_GOLDEN=1``), the dry runs, and one point of a sweep run for real by bash
with the recorders of tests/test_containers.py standing in for srun, pyxis and apptainer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctf import __version__
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.search import Search
from hpctf.login.resolving.loader import load_config
from hpctf.login.sweeps import sweep_commands
from hpctf.login.sweeps.search_start import SearchPlan, array_script
from hpctf.login.sweeps.sweep_dir import SweepDir
from tests.conftest import DIGITS, HPCTF, REPO, require_tool, wait_for_job, write
from tests.container_fakes import (
    PASS_THROUGH,
    container_site,
    job_environment,
    records,
    tool,
)
from tests.fake_slurm import FakeSlurm
from tests.goldens import check_golden
from tests.slurm_jobs import logs_of

GOLDEN = Path(__file__).resolve().parent / "golden-arrays"
ENV = {"HOME": "/home/user"}
SITES = ["ib-pyxis", "ib-apptainer"]
SWEEP = Path("/scratch/user/hpctf-runs/digits-sweep-20250101-000000")
SEARCH = {
    "parameters": {"train.args.learning_rate": {"type": "float", "low": 0.001, "high": 0.1}},
    "trials": 6,
    "parallel": 3,
    "objective": {"metric": "eval.loss", "direction": "minimize"},
}


def check(name: str, text: str) -> None:
    check_golden(GOLDEN, name, text)


def normalised(script: str) -> str:
    script = script.replace(f"hpctf '{__version__}'", "hpctf 'VERSION'")
    return script.replace(str(DIGITS.parent), "<experiment>").replace(str(REPO), "<repo>")


def search_experiment(tmp_path: Path) -> Path:
    path = tmp_path / "experiment.yaml"
    text = DIGITS.read_text().replace(
        "train:\n", "train:\n  python_path: [" + str(DIGITS.parent) + "]\n", 1
    )
    path.write_text(text + "sweep: " + json.dumps(SEARCH) + "\n")
    return path


@pytest.mark.parametrize("site", SITES)
def test_golden_grid_array_on_a_container_site(site: str) -> None:
    config = load_config(DIGITS, site, (), ENV, python="/usr/bin/python3").config
    run_dirs = [f"{SWEEP}/digits-steps10", f"{SWEEP}/digits-steps20"]
    ((indices, script),) = sweep_commands.array_scripts(config, SWEEP, run_dirs, [0, 1], 1000, 2)
    assert indices == (0, 1)
    check(f"{site}--grid.sbatch", normalised(script))


@pytest.mark.parametrize("site", SITES)
def test_golden_search_array_on_a_container_site(site: str, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    config = load_config(search_experiment(tmp_path), site, (), ENV, python="/usr/bin/python3")
    search = config.config.experiment.sweep
    assert isinstance(search, Search)
    plan = SearchPlan(config.config, search, 6, 3, "test")
    script = normalised(array_script(plan, SWEEP)).replace(str(tmp_path), "<tmp>")
    check(f"{site}--search.sbatch", script)


def test_the_array_lines_are_the_single_runs_with_the_sweep_mounted() -> None:
    """What the goldens hold, said once: the sweep directory and its code store mounted (every
    point's run directory, and a search's study, are in it), each task in its own run
    directory, the container named for it."""
    pyxis = (GOLDEN / "ib-pyxis--grid.sbatch").read_text()
    mounts = f"{SWEEP}:{SWEEP},{SWEEP}/code:{SWEEP}/code:ro,/scratch:/scratch,/datasets:/data:ro"
    assert f"  --container-mounts='{mounts}' \\\n" in pyxis
    assert '  --container-workdir="$RUN_DIR" --container-name="hpctf-${RUN_DIR##*/}" \\\n' in (
        pyxis
    )
    assert "  'python3' -m hpctf worker \"$RUN_DIR\" &\n" in pyxis
    apptainer = (GOLDEN / "ib-apptainer--search.sbatch").read_text()
    assert '  apptainer exec --nv --pwd "$RUN_DIR" \\\n' in apptainer
    assert f"  --bind '{mounts}' \\\n" in apptainer
    assert 'RUN_DIR=$("$PYTHON" -m hpctf search-next "$SWEEP_DIR")' in apptainer


def hpctf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_dry_runs_of_a_sweep_and_a_search_on_a_container_site(
    tmp_path: Path, runtime: str
) -> None:
    sites, runs = tmp_path / "sites", tmp_path / "runs"
    env = {**os.environ, "HOME": str(tmp_path), "HPCTF_SITE_PATH": str(sites),
           "HPCTF_RUNS_ROOT": str(runs)}  # fmt: skip
    site = container_site(sites, runtime)
    write_site_limit(sites / f"{site}.yaml")
    grid = hpctf(env, "sweep", str(DIGITS), "--site", site, "--grid", "train.steps=10,20",
                 "--dry-run")  # fmt: skip
    assert grid.returncode == 0, grid.stderr
    word = "--container-workdir=" if runtime == "pyxis" else "apptainer exec --pwd "
    assert f'  {word}"$RUN_DIR"' in grid.stdout
    assert "#SBATCH --array=0-1" in grid.stdout
    pytest.importorskip("optuna")
    search = hpctf(env, "sweep", str(search_experiment(tmp_path)), "--site", site, "--dry-run")
    assert search.returncode == 0, search.stderr
    assert f'  {word}"$RUN_DIR"' in search.stdout
    assert "#SBATCH --array=0-2" in search.stdout
    assert not runs.exists()


def write_site_limit(site_file: Path) -> None:
    """The site's own MaxArraySize: no scontrol asked."""
    site_file.write_text(site_file.read_text() + "sweep: {max_array_size: 100}\n")


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_a_sweeps_point_runs_in_the_container_in_its_own_run_directory(
    tmp_path: Path, runtime: str, fake_slurm: FakeSlurm
) -> None:
    """``hpctf sweep`` on a container site (sbatch faked), then the array's script run by bash
    as Slurm runs task 1: the worker starts once, in the image, in point 1's run directory,
    with the sweep directory and its code store mounted (point 1's code/ links there); job-end
    requeues from the host, and point 1's journal holds it."""
    sites, runs, recorded = tmp_path / "sites", tmp_path / "runs", tmp_path / "records"
    recorded.mkdir()
    login_env = {**os.environ, "HOME": str(tmp_path / "home"), "HPCTF_SITE_PATH": str(sites),
                 "HPCTF_RUNS_ROOT": str(runs)}  # fmt: skip
    site = container_site(sites, runtime)
    write_site_limit(sites / f"{site}.yaml")
    made = hpctf(login_env, "sweep", str(DIGITS), "--site", site, "--grid",
                 "train.steps=10,20", "--set", "resources.nodes=1")  # fmt: skip
    assert made.returncode == 0, made.stderr
    (sweep,) = runs.iterdir()
    point = sweep / "digits-steps20"
    code_store = sweep / "code"
    assert os.path.realpath(point / "code").startswith(f"{code_store}/")
    job_env = job_environment(tmp_path, login_env, recorded, {
        "SLURM_JOB_ID": "4244", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "1",
    })  # fmt: skip
    job = subprocess.run(
        [require_tool("bash"), str(sweep / "array-0.sbatch")],
        env=job_env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    log = (point / "logs" / "slurm-4244.out").read_text()
    assert job.returncode == 75, job.stdout + job.stderr + log

    (worker,) = records(recorded, "worker")
    assert worker["inside"] == "/images/hpctf-tf.img"
    assert worker["argv"] == ["-m", "hpctf", "worker", str(point)]
    assert worker["cwd"] == str(point)
    assert worker["mounts"].split(",") == [
        f"{sweep}:{sweep}",
        f"{code_store}:{code_store}:ro",
        "/data/sets:/data/sets",
        "/datasets:/data:ro",
    ]
    assert worker["env"]["WANDB_API_KEY"] == "from-host"
    (srun,) = records(recorded, "srun")
    if runtime == "pyxis":
        assert f"--container-name=hpctf-{point.name}" in srun["argv"]
    else:
        (apptainer,) = records(recorded, "apptainer")
        assert apptainer["argv"][:3] == ["exec", "--pwd", str(point)]
    requeue, _release = records(recorded, "scontrol")
    assert requeue == {"argv": ["requeue", "--", "4242_1"], "inside": None}
    events = [e["event"] for e in RunDir(point).events()]
    assert journal.SAVED_ON_WARNING in events and journal.REQUEUED in events, events
    # The point's own script (hpctf resubmit POINT) mounts its run directory and the store.
    own = (point / "job.sbatch").read_text()
    assert f"{point}:{point},{code_store}:{code_store}:ro" in own


def test_the_golden_arrays_pass_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    for path in sorted(GOLDEN.glob("*.sbatch")):
        checked = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, f"{path.name}: {checked.stdout}"


@pytest.mark.slurm
@pytest.mark.tf
def test_an_apptainer_sweep_trains_its_points_on_the_slurm_cluster(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """A grid sweep on an Apptainer site on the real test cluster (no apptainer on this
    machine: a pass-through that records its argv and runs the command on the node): every
    point's task goes through `apptainer exec` once, in its own run directory with the sweep
    directory bound, and trains to the end."""
    recorded, fake_bin, sites = tmp_path / "records", tmp_path / "bin", tmp_path / "sites"
    recorded.mkdir()
    tool(fake_bin / "apptainer", PASS_THROUGH)
    image = "/images/hpctf-tf.sif"
    write(
        sites / "real-apptainer.yaml",
        f"""name: real-apptainer
extends: local-slurm
container: {{runtime: apptainer, image: {image}, python: {sys.executable}}}
""",
    )
    env = {
        **slurm_cluster,
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",  # sbatch passes it to the job
        "HPCTF_SITE_PATH": str(sites),
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_TEST_RECORDS": str(recorded),
        "HPCTF_TEST_IMAGE": image,
    }
    proc = hpctf(
        env, "sweep", str(DIGITS), "--site", "real-apptainer", "--grid", "train.seed=0,1",
        "--set", "resources.nodes=1", "--set", "train.steps=20",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (array,) = re.findall(r"^submitted job array (\d+): 2 point", proc.stdout, re.M)
    (sweep,) = (tmp_path / "runs").iterdir()
    points = [Path(p["run_dir"]) for p in SweepDir.read(sweep).points]
    for task, point in enumerate(points):
        info = wait_for_job(f"{array}_{task}")
        assert info["JobState"] == "COMPLETED", logs_of(point)
        assert json.loads((point / "DONE").read_text())["step"] == 20
    calls = [json.loads(p.read_text()) for p in sorted(recorded.glob("apptainer-*.json"))]
    bind = f"{sweep}:{sweep},{sweep}/code:{sweep}/code:ro"
    assert sorted(c["argv"][2] for c in calls) == sorted(map(str, points))  # --pwd, once each
    for call in calls:
        assert call["argv"][:2] == ["exec", "--pwd"]
        assert call["argv"][call["argv"].index("--bind") + 1] == bind
        assert call["argv"][-5:-1] == [sys.executable, "-m", "hpctf", "worker"]
