"""Secrets as a type (issue #42): a value is secret because its file marks it (``!secret``,
``{secret: ...}``) or a rule finds it; from the parse on it prints as ``***``; every output a
run writes is redacted of its values; the workers read them from secrets.env, never from their
environment at exec."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core import secrets
from hpctf.core.run import notifications
from hpctf.core.run.rundir import RunDir
from hpctf.core.secrets import is_secret, is_secret_name, redact, reveal, uri_credentials
from tests.conftest import DIGITS, HPCTF, files_holding, run_dir_from
from tests.fake_slurm import FakeSlurm

MARKED = "host=db.internal user=ml sslkey=0xC0FFEE-marked"
BY_NAME = "hf_primary_7d1e0b9a"
AT_PASSWORD = "p@ss@word-91c"


@pytest.mark.parametrize(
    "name",
    ["MY_APIKEY", "HF_TOKEN_PRIMARY", "SLACK_WEBHOOK_URL", "GITHUB_PAT", "AWS_SECRET_ACCESS_KEY",
     "DB_PASSWORD", "wandb_api_key", "AZURE_CLIENT_CREDENTIALS"],
)  # fmt: skip
def test_a_name_that_says_credential_is_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["TF_CPP_MIN_LOG_LEVEL", "NCCL_IB_HCA", "KEYBOARD", "DATA_PATH", "MONKEY_PATCH"]
)
def test_a_name_that_does_not_is_not(name: str) -> None:
    assert not is_secret_name(name)


def test_uri_credentials_whole_userinfo_and_a_password_holding_at() -> None:
    assert uri_credentials("https://ghp_TOKEN123@github.com/x.git") == ["ghp_TOKEN123"]
    assert uri_credentials(f"http://alice:{AT_PASSWORD}@mlflow:5000/x") == [AT_PASSWORD]
    assert redact(f"see http://alice:{AT_PASSWORD}@mlflow:5000/x now") == (
        "see http://alice:***@mlflow:5000/x now"
    )
    assert redact("https://ghp_TOKEN123@github.com/x.git") == "https://***@github.com/x.git"
    assert uri_credentials("mail bob@example.com, https://example.com/a@b") == []


def test_a_remembered_value_is_redacted_everywhere_in_the_process() -> None:
    assert redact(f"connect {MARKED} failed") == f"connect {MARKED} failed"
    secrets.remember([MARKED, "abc"])  # too short to redact by value: left alone
    assert redact(f"connect {MARKED} failed; abc") == "connect *** failed; abc"
    said = notifications.message("r", "/runs/r", "failed", f"ValueError: no {MARKED}")
    assert MARKED not in json.dumps(said) and "no ***" in said["text"]


def test_a_value_no_credential_has_is_not_redacted_by_value() -> None:
    """A name rule's false find (USE_AUTH=true, MAX_TOKENS=4096) keeps its value out of files
    others read, but every "true" or "4096" of a log is not replaced."""
    secrets.remember(["true", "4096", "Off", "tok-1234567"])
    said = redact("flag true, batch 4096, mode Off, tok-1234567")
    assert said == "flag true, batch 4096, mode Off, ***"


def experiment_with(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "experiment.yaml"
    path.write_text(DIGITS.read_text() + extra)
    (tmp_path / "digits.py").write_text((DIGITS.parent / "digits.py").read_text())
    return path


def test_marked_values_are_secret_types_in_every_form(tmp_path: Path, runs_root: Path) -> None:
    """``!secret`` in the file, ``{secret: ...}`` and ``--set env.X=!secret ...``: each kept
    out of job.sbatch and config.json, in secrets.env alone; the config holds the type."""
    experiment = experiment_with(
        tmp_path, f"env:\n  DB_CONN: !secret '{MARKED}'\n  PORT: !secret 5432\n  SEEN: plain\n"
    )
    result = CliRunner().invoke(
        cli,
        ["submit", str(experiment), "--site", "local", "--dry-run",
         "--set", "env.OTHER={secret: other-marked-41}", "--set", "env.THIRD=!secret third-77x"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for value in (MARKED, "other-marked-41", "third-77x"):
        assert value not in result.output
    rendered = CliRunner().invoke(
        cli, ["render", str(experiment), "--site", "local-slurm", "--set", "env.X=!secret yz12"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert MARKED not in rendered.output and "yz12" not in rendered.output
    assert "unset DB_CONN PORT X" in rendered.output and "export SEEN='plain'" in rendered.output


def test_a_secret_mark_on_a_list_is_one_line(tmp_path: Path) -> None:
    experiment = experiment_with(tmp_path, "env:\n  DB_CONN: !secret [a, b]\n")
    result = subprocess.run(
        [*HPCTF, "validate", str(experiment), "--site", "local"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "!secret takes one value" in result.stderr


def test_a_wrong_type_does_not_echo_the_secret(tmp_path: Path) -> None:
    experiment = experiment_with(tmp_path, f"env:\n  HF_TOKEN:\n    nested: {BY_NAME}\n")
    result = subprocess.run(
        [*HPCTF, "validate", str(experiment), "--site", "local"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "env" in result.stderr, result.stderr
    assert BY_NAME not in result.stderr


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# The script holds no value (its snapshot would then be kept 0400, as it should): digests.
USER_SCRIPT = f"""
import hashlib
import os

def sha(name):
    return hashlib.sha256(os.environ[name].encode()).hexdigest()

with open("/proc/self/environ", "rb") as f:
    at_exec = f.read()
print("seen in os.environ:", sha("DB_CONN") == {_sha(MARKED)!r},
      sha("HF_TOKEN_PRIMARY") == {_sha(BY_NAME)!r})
found = [os.environ[n].encode() in at_exec for n in ("DB_CONN", "HF_TOKEN_PRIMARY")]
print("in the environment at exec:", any(found))
print("the user prints", os.environ["DB_CONN"])
raise ConnectionError(f"cannot reach the database with {{os.environ['HF_TOKEN_PRIMARY']}}")
"""


@pytest.mark.tf
def test_a_run_writes_no_secret_where_others_read(tmp_path: Path, runs_root: Path) -> None:
    """A local script run with a marked secret, one found by its name and a tracking URI whose
    password holds ``@``; the script prints one and raises with another in its message. The
    worker sees both in os.environ and neither in its environment at exec; no file of the run
    that others may read holds any, nor does ``status`` or ``logs``."""
    script = tmp_path / "leaky.py"
    script.write_text(USER_SCRIPT)
    proc = subprocess.run(
        [*HPCTF, "submit", str(script), "--site", "local",
         "--set", f"env.DB_CONN=!secret {MARKED}", "--set", f"env.HF_TOKEN_PRIMARY={BY_NAME}",
         "--set", f"tracking.mlflow.tracking_uri=http://alice:{AT_PASSWORD}@127.0.0.1:9/x",
         "--set", "resources.tasks_per_node=1"],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
    )  # fmt: skip
    values = (MARKED, BY_NAME, AT_PASSWORD)
    run = run_dir_from(proc.stdout)
    log = (run / "logs" / "rank-0.log").read_text()
    assert "seen in os.environ: True True" in log, log
    assert "in the environment at exec: False" in log, log
    assert (
        "the user prints ***" in log
        and "ConnectionError: cannot reach the database with ***" in log
    )
    assert proc.returncode != 0 and not any(v in proc.stdout + proc.stderr for v in values)
    holding = files_holding(run, *values)
    assert holding == {"secrets.env": 0o600}, holding
    for command in (["status", str(run)], ["logs", str(run)], ["status", str(run), "--json"]):
        said = subprocess.run([*HPCTF, *command], capture_output=True, text=True, check=False)
        assert said.stdout and not any(v in said.stdout + said.stderr for v in values), command
    config = RunDir(run).load_config()  # the owner reads them back, of the secret type
    assert is_secret(config.experiment.env["DB_CONN"])
    assert reveal(config.experiment.env["DB_CONN"]) == MARKED
    assert os.environ.get("DB_CONN") is None


def test_a_sweep_writes_no_secret_where_others_read(
    tmp_path: Path, runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """A grid sweep given secrets by --set (by name, and marked): sweep.json records the
    overrides with the values as ***; of every file of the sweep directory only each point's
    secrets.env (0600) holds them, and each point's config reads them back."""
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\nMaxJobCount = 10000\n")
    result = CliRunner().invoke(
        cli,
        ["sweep", str(DIGITS), "--site", "local-slurm", "--grid", "train.seed=0,1",
         "--set", f"env.HF_TOKEN_PRIMARY={BY_NAME}", "--set", f"env.DB_CONN=!secret {MARKED}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (sweep,) = runs_root.iterdir()
    assert not any(v in result.output for v in (BY_NAME, MARKED))
    recorded = json.loads((sweep / "sweep.json").read_text())
    assert "env.HF_TOKEN_PRIMARY=***" in recorded["set"]
    holding = files_holding(sweep, BY_NAME, MARKED)
    assert holding and all(
        path.endswith("/secrets.env") and mode == 0o600 for path, mode in holding.items()
    ), holding
    point = RunDir(Path(recorded["points"][0]["run_dir"])).load_config()
    assert reveal(point.experiment.env["DB_CONN"]) == MARKED
