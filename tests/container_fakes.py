"""Fake container runtimes for the container tests (tests/test_containers.py,
tests/test_container_arrays.py): recorders first on PATH that "enter" an image, a fake worker
inside it, a site that names them, and a pass-through apptainer for the real test cluster."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.conftest import write

IMAGE_ENV = {"WANDB_API_KEY": "from-image", "NCCL_DEBUG": "from-image", "IMAGE_ONLY": "1"}

# The runtimes, as far as the batch script depends on them. Both take the image's environment
# over the host's (pyxis: "their existing values in the image take precedence"; apptainer: the
# image's %environment), except what --container-env names (pyxis) or APPTAINERENV_<NAME> sets
# (apptainer).
_RUNTIME = r"""
import json, os, sys
RECORDS = os.environ["HPCTF_TEST_RECORDS"]
IMAGE_BIN = os.environ["HPCTF_TEST_IMAGE_BIN"]
IMAGE_ENV = json.loads(os.environ["HPCTF_TEST_IMAGE_ENV"])


def record(tool, **fields):
    with open(os.path.join(RECORDS, tool + ".jsonl"), "a") as handle:
        handle.write(json.dumps({"argv": sys.argv[1:], "inside": os.environ.get(
            "HPCTF_TEST_IMAGE"), **fields}) + "\n")


def enter(image, mounts, workdir, command, keep=(), overrides=None):
    env = dict(os.environ)
    env.update({k: v for k, v in IMAGE_ENV.items() if k not in keep})
    env.update(overrides or {})
    env["PATH"] = IMAGE_BIN + os.pathsep + env["PATH"]
    env["HPCTF_TEST_IMAGE"] = image
    env["HPCTF_TEST_MOUNTS"] = mounts
    os.chdir(workdir)
    os.execvpe(command[0], command, env)
"""

SRUN = (
    _RUNTIME
    + r"""
args = sys.argv[1:]
options = {}
while args and args[0].startswith("--"):
    name, _, value = args.pop(0)[2:].partition("=")
    options[name] = value
record("srun")
os.environ.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"})
if "container-image" in options:  # pyxis
    keep = [n for n in options.get("container-env", "").split(",") if n]
    enter(options["container-image"], options["container-mounts"],
          options["container-workdir"], args, keep)
os.execvp(args[0], args)
"""
)

APPTAINER = (
    _RUNTIME
    + r"""
args = sys.argv[1:]
assert args.pop(0) == "exec", args
flags = {"nv": False}
while args[0].startswith("--"):
    flag = args.pop(0)[2:]
    flags[flag] = True if flag == "nv" else args.pop(0)
image, command = args[0], args[1:]
record("apptainer")
overrides = {k[len("APPTAINERENV_"):]: v for k, v in os.environ.items()
             if k.startswith("APPTAINERENV_")}
enter(image, flags["bind"], flags["pwd"], command, overrides=overrides)
"""
)

SCONTROL = _RUNTIME + '\nrecord("scontrol")\n'

# The image's python3: records what the worker would see, then ends as a preempted worker.
WORKER = (
    _RUNTIME
    + r"""
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
run_dir = sys.argv[-1]
record("worker", cwd=os.getcwd(), mounts=os.environ["HPCTF_TEST_MOUNTS"],
       env={k: os.environ.get(k) for k in ("WANDB_API_KEY", "NCCL_DEBUG", "IMAGE_ONLY")})
journal.record_saved_on_warning(
    RunDir(__import__("pathlib").Path(run_dir)), os.environ["SLURM_JOB_ID"], 0, "USR2")
sys.exit(75)
"""
)


def tool(path: Path, body: str) -> None:
    write(path, f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def records(directory: Path, name: str) -> list[dict[str, Any]]:
    path = directory / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def container_site(sites: Path, runtime: str) -> str:
    name = f"test-{runtime}"
    write(
        sites / f"{name}.yaml",
        f"""name: {name}
extends: local-slurm
python: {sys.executable}
env: {{NCCL_DEBUG: WARN}}
container:
  runtime: {runtime}
  image: /images/hpctf-tf.img
  mounts: [/data/sets, "/datasets:/data:ro"]
  env: [WANDB_API_KEY]
""",
    )
    return name


# A pass-through apptainer for the real cluster: records where and how it was called, applies
# APPTAINERENV_<NAME> as Apptainer does, and runs the command on the node itself.
PASS_THROUGH = r"""
import json, os, sys
args = sys.argv[1:]
name = f"apptainer-{os.environ.get('SLURM_PROCID')}-{os.getpid()}.json"
with open(os.path.join(os.environ["HPCTF_TEST_RECORDS"], name), "w") as handle:
    json.dump({"argv": args, "node": os.environ.get("SLURMD_NODENAME")}, handle)
while args and args[0] != os.environ["HPCTF_TEST_IMAGE"]:
    args.pop(0)
env = dict(os.environ, HPCTF_TEST_INSIDE="1")
env.update({k[len("APPTAINERENV_"):]: v for k, v in os.environ.items()
            if k.startswith("APPTAINERENV_")})
os.execve(args[1], args[1:], env)
"""


def job_environment(
    tmp_path: Path, login_env: dict[str, str], recorded: Path, slurm: dict[str, str]
) -> dict[str, str]:
    """A batch script's environment as Slurm would give it (``slurm``: its SLURM_* values),
    with the fake srun, apptainer and scontrol first on PATH and the fake image's worker."""
    host_bin, image_bin = tmp_path / "host-bin", tmp_path / "image-bin"
    tool(host_bin / "srun", SRUN)
    tool(host_bin / "apptainer", APPTAINER)
    tool(host_bin / "scontrol", SCONTROL)
    tool(image_bin / "python3", WORKER)
    return {
        **login_env,
        "PATH": f"{host_bin}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_RESTART_COUNT": "0",
        **slurm,
        "WANDB_API_KEY": "from-host",
        "HPCTF_TEST_RECORDS": str(recorded),
        "HPCTF_TEST_IMAGE_BIN": str(image_bin),
        "HPCTF_TEST_IMAGE_ENV": json.dumps(IMAGE_ENV),
    }
