"""A site's ``container:`` (pyxis, apptainer): the schema, what extra_sbatch may not say, and
each rendered script run for real by bash.

The run test renders a script with ``hpctf render -o`` (a real run directory with its code
snapshot) and runs it with bash as Slurm would, SLURM_* set, with recorders first on PATH:
``srun`` (for pyxis it also plays the container runtime its --container-* options ask for),
``apptainer`` and ``scontrol``. A container runtime here is a recorder that "enters" an image:
it runs the command with the image's bin directory first on PATH (where the only ``python3`` is
a fake worker), the image's own environment laid over the host's as the real runtime does, and
HPCTF_TEST_IMAGE set. The fake worker records what it saw and ends as a preempted worker does
(a ``preempted`` record, exit 75), so hpctf's job-end requeues the job with ``scontrol
requeue``: the test asserts that call came from outside the container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.sbatch_options import normalize_sbatch_option
from tests.conftest import DIGITS, HPCTF, require_tool, submitted, wait_for_job, write
from tests.container_fakes import (
    PASS_THROUGH,
    container_site,
    job_environment,
    records,
    tool,
)


def hpctf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_script_starts_the_worker_in_the_container_and_requeues_outside_it(
    tmp_path: Path, runtime: str
) -> None:
    sites, runs, recorded = tmp_path / "sites", tmp_path / "runs", tmp_path / "records"
    recorded.mkdir()
    login_env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "HPCTF_SITE_PATH": str(sites),
        "HPCTF_RUNS_ROOT": str(runs),
    }
    site = container_site(sites, runtime)
    script = tmp_path / "job.sbatch"
    made = hpctf(
        login_env, "render", str(DIGITS), "--site", site, "--set", "resources.nodes=1",
        "-o", str(script),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (run_dir,) = runs.iterdir()
    job_env = job_environment(tmp_path, login_env, recorded, {"SLURM_JOB_ID": "4242"})
    job = subprocess.run(
        [require_tool("bash"), str(script)],
        env=job_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert job.returncode == 75, job.stdout + job.stderr

    # The worker: once, inside the image, with the run directory, the code snapshot and the
    # site's mounts, the host's values for the variables the site passes in.
    (worker,) = records(recorded, "worker")
    assert worker["inside"] == "/images/hpctf-tf.img"
    assert worker["argv"] == ["-m", "hpctf", "worker", str(run_dir)]
    assert worker["cwd"] == str(run_dir)
    mounts = worker["mounts"].split(",")
    assert mounts == [
        f"{run_dir}:{run_dir}",
        f"{run_dir}/code:{run_dir}/code:ro",
        "/data/sets:/data/sets",
        "/datasets:/data:ro",
    ]
    frozen = json.loads((run_dir / "config.json").read_text())
    code = frozen["experiment"]["train"]["python_path"]
    assert code and all(p.startswith(f"{run_dir}/code/") for p in code), code
    assert worker["env"] == {
        "WANDB_API_KEY": "from-host",  # named in container.env
        "NCCL_DEBUG": "WARN",  # the site's env, exported by the script
        "IMAGE_ONLY": "1",  # the image's own environment is there too
    }

    # The runtime saw exactly one command, the worker's; nothing of hpctf's own went in.
    (srun,) = records(recorded, "srun")
    assert srun["inside"] is None
    if runtime == "pyxis":
        assert "--mpi=none" in srun["argv"]
        assert f"--container-name=hpctf-{run_dir.name}" in srun["argv"]
        assert "--container-env=WANDB_API_KEY,NCCL_DEBUG,TF_CPP_MIN_LOG_LEVEL" in srun["argv"]
        assert records(recorded, "apptainer") == []
    else:
        (apptainer,) = records(recorded, "apptainer")
        assert apptainer["inside"] is None
        assert "--nv" not in apptainer["argv"]  # this job asks for no GPUs
        worker_command = ["python3", "-m", "hpctf", "worker", str(run_dir)]
        assert apptainer["argv"][-6:] == ["/images/hpctf-tf.img", *worker_command]
        assert not any(a.startswith("--container") for a in srun["argv"])

    # The requeue, and the release of Slurm's hold on the requeued job: scontrol called by
    # job-end on the host, and recorded in the journal.
    requeue, release = records(recorded, "scontrol")
    assert requeue == {"argv": ["requeue", "--", "4242"], "inside": None}
    assert release == {"argv": ["update", "JobId=4242", "StartTime=now+5"], "inside": None}
    events = [e["event"] for e in RunDir(run_dir).events()]
    assert events[-5:] == [
        journal.STARTED,
        journal.SAVED_ON_WARNING,
        journal.ENDED,
        journal.REQUEUED,
        journal.RELEASED,
    ], events
    assert "requeued: " in job.stdout, job.stdout


def test_extra_sbatch_may_not_start_a_container() -> None:
    refused = (
        "--container-image=nvcr.io/nvidia/tensorflow",
        "--container-mounts=/a:/a",
        "--container-name=x",
        "--container-workdir=/w",
        "--container-env=A",
        "--container=/bundle",
        "--no-container-mount-home",
        "--container-i=x",  # sbatch takes any unambiguous prefix
    )
    for item in refused:
        with pytest.raises(ValueError, match=r"set the site's `container:`"):
            normalize_sbatch_option(item)


def write_experiment(tmp_path: Path, extra: str = "") -> Path:
    text = DIGITS.read_text()
    return write(tmp_path / "exp" / "experiment.yaml", text + extra)


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (
            "{runtime: docker, image: x}",
            "container.runtime: Input should be 'pyxis' or 'apptainer'",
        ),
        ("{runtime: pyxis}", "container.image: required key is missing"),
        (
            "{runtime: pyxis, image: x, mounts: ['/a,b']}",
            "container.mounts.0: mount source '/a,b' must be an absolute path "
            "without ',', ':' or spaces",
        ),
        (
            "{runtime: pyxis, image: x, mounts: [data]}",
            "container.mounts.0: mount source 'data' must be an absolute path",
        ),
        (
            "{runtime: apptainer, image: x, mounts: ['/a:/b:rshared']}",
            "container.mounts.0: '/a:/b:rshared': mount option 'rshared' is not one of ro, rw",
        ),
        (
            "{runtime: apptainer, image: x, env: [A-B]}",
            "container.env.0: 'A-B' is not an environment variable name",
        ),
        ("{runtime: pyxis, image: x, volumes: []}", "container.volumes: unknown key"),
    ],
)
def test_a_bad_container_is_one_line_naming_the_key_exit_2(
    tmp_path: Path, container: str, expected: str
) -> None:
    sites = tmp_path / "sites"
    write(sites / "bad.yaml", f"name: bad\nextends: local-slurm\ncontainer: {container}\n")
    env = {**os.environ, "HPCTF_SITE_PATH": str(sites), "HPCTF_RUNS_ROOT": str(tmp_path / "r")}
    proc = hpctf(env, "render", str(DIGITS), "--site", "bad", "-o", str(tmp_path / "job.sbatch"))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"bad.yaml:3: {expected}" in line, line
    assert not (tmp_path / "r").exists() and not (tmp_path / "job.sbatch").exists()


def test_a_container_on_the_local_site_and_a_run_dir_with_a_comma_are_refused(
    tmp_path: Path,
) -> None:
    sites = tmp_path / "sites"
    container = "container: {runtime: pyxis, image: x}\n"
    write(sites / "lc.yaml", f"name: lc\nextends: local\n{container}")
    write(sites / "ok.yaml", f"name: ok\nextends: local-slurm\n{container}")
    env = {**os.environ, "HPCTF_SITE_PATH": str(sites), "HPCTF_RUNS_ROOT": str(tmp_path / "r")}
    local = hpctf(env, "render", str(DIGITS), "--site", "lc")
    assert local.returncode == 2
    assert "container: a container needs scheduler: slurm" in local.stderr
    comma = hpctf({**env, "HPCTF_RUNS_ROOT": str(tmp_path / "a,b")}, "render", str(DIGITS),
                  "--site", "ok")  # fmt: skip
    assert comma.returncode == 2
    (line,) = comma.stderr.strip().splitlines()
    assert "holds ',', ':' or a space, where pyxis splits its mount list" in line
    assert not (tmp_path / "a,b").exists()


@pytest.mark.slurm
@pytest.mark.tf
def test_an_apptainer_run_trains_on_two_slurm_nodes(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """The rendered Apptainer script on the real test cluster: srun starts `apptainer exec` on
    both nodes (here a pass-through that records its argv), the workers train to the end, and
    the run ends done; the batch shell itself never went through apptainer."""
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
    proc = subprocess.run(
        [*HPCTF, "submit", str(DIGITS), "--site", "real-apptainer", "--set", "train.steps=40",
         "--set", "checkpoint.every_steps=20"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id, run_dir = submitted(proc.stdout)
    assert job_id
    info = wait_for_job(job_id)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").iterdir()))
    assert info["JobState"] == "COMPLETED", logs
    assert json.loads((run_dir / "DONE").read_text())["step"] == 40
    calls = [json.loads(p.read_text()) for p in sorted(recorded.glob("apptainer-*.json"))]
    assert [c["node"] for c in calls] == ["node1", "node2"], calls  # one call per rank, no more
    code = f"{run_dir}/code"
    for call in calls:
        assert call["argv"][:2] == ["exec", "--pwd"] and "--nv" not in call["argv"]
        assert call["argv"][call["argv"].index("--bind") + 1] == (
            f"{run_dir}:{run_dir},{code}:{code}:ro"
        )
        assert call["argv"][-6:] == [image, sys.executable, "-m", "hpctf", "worker", str(run_dir)]
    ended = [e for e in RunDir(run_dir).events() if e["event"] == journal.ENDED]
    assert [(e["reason"], e["exit_code"]) for e in ended] == [("done", 0)]
