"""A run directory others can write: hpctf follows no link it did not make (a planted link is
refused in one line and the file it points at survives), reads only regular files of a bounded
size, and `hpctf plot` of someone else's run writes into the caller's directory, not the run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core import safe_files
from hpctf.core.run.rundir import RunDir
from hpctf.core.secrets import is_secret, reveal
from tests.conftest import DIGITS, HPCTF, files_holding, other_user
from tests.fake_slurm import FakeSlurm, new_run

THESIS = b"\\documentclass{article} my thesis, five years of it\n"


def with_loss(path: Path) -> None:
    with (path / "metrics.jsonl").open("a") as handle:
        for step in range(10, 110, 10):
            handle.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")


def test_plot_refuses_a_planted_link_and_the_victim_file_survives(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    path = new_run(runs_root, fake_slurm)
    with_loss(path)
    victim = tmp_path / "thesis.tex"
    victim.write_bytes(THESIS)
    (path / "loss.png").symlink_to(victim)
    result = CliRunner().invoke(cli, ["plot", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"Error: {path / 'loss.png'} is a symbolic link, which hpctf")
    assert victim.read_bytes() == THESIS and (path / "loss.png").is_symlink()


def test_appends_and_atomic_writes_refuse_links_fifos_and_directories(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(THESIS)
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(victim)
    with pytest.raises(safe_files.LinkRefused, match="is a symbolic link"):
        safe_files.open_append(link)
    with pytest.raises(safe_files.LinkRefused, match="is a symbolic link"):
        safe_files.write_atomic(link, "x")
    fifo = tmp_path / "rank-0.log"
    os.mkfifo(fifo)
    with pytest.raises(safe_files.LinkRefused, match="not a regular file"):
        safe_files.open_append(fifo)  # no reader: it would block forever
    (tmp_path / "journal").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(safe_files.LinkRefused, match="journal is a symbolic link"):
        RunDir(tmp_path).record("created", experiment="e", site="s", run_dir=str(tmp_path))
    assert victim.read_bytes() == THESIS and list((tmp_path / "elsewhere").iterdir()) == []
    plain = tmp_path / "plain.jsonl"
    with safe_files.open_append(plain) as handle:
        handle.write(b"one\n")
    with safe_files.open_append(plain) as handle:
        handle.write(b"two\n")
    assert plain.read_bytes() == b"one\ntwo\n"


def test_plot_of_another_users_run_writes_here_and_follows_nothing(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    """A run owned by a second unix user, who planted loss.png -> the caller's thesis: the
    caller's `hpctf plot RUN` (a real process) writes ./NAME-loss.png and the thesis stays."""
    pytest.importorskip("matplotlib")
    owner = other_user()
    path = new_run(runs_root, fake_slurm)
    with_loss(path)
    victim = tmp_path / "thesis.tex"
    victim.write_bytes(THESIS)
    (path / "loss.png").symlink_to(victim)
    for below in [path, *path.rglob("*")]:
        os.lchown(below, owner.pw_uid, owner.pw_gid)
    here = tmp_path / "here"
    here.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "hpctf", "plot", str(path)],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{fake_slurm.bin}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    written = here / f"{path.name}-loss.png"
    assert result.stdout == f"wrote {written}\n"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert victim.read_bytes() == THESIS and (path / "loss.png").is_symlink()


# --- bounded reads ------------------------------------------------------------------------------


def hpctf(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctf", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def test_dev_zero_a_fifo_a_directory_and_a_huge_file_as_the_experiment_are_one_line(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "experiment.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"a: " + b"x" * (2 << 20) + b"\n")
    cases = [
        ("/dev/zero", "/dev/zero: a YAML file is a character device, not a file"),
        (str(fifo), f"{fifo}: a YAML file is a FIFO, not a file"),
        (str(huge), f"{huge}: a YAML file is 2,097,156 bytes, over the limit of 1,048,576 bytes"),
    ]
    for path, line in cases:
        started = time.monotonic()
        result = hpctf("validate", path, timeout=30)
        took = time.monotonic() - started
        assert (result.returncode, result.stderr) == (2, f"Error: {line}\n"), path
        assert took < 10, took  # the interpreter's start is most of it


def test_a_fifo_in_the_sites_directory_hangs_neither_sites_nor_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    os.mkfifo(sites / "stuck.yaml")
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(tmp_path / "runs"))
    listed = hpctf("sites", timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert "stuck" in listed.stdout and "a FIFO, not a file" in listed.stdout
    status = hpctf("status", timeout=30)
    assert status.returncode == 0, status.stderr


def test_a_fifo_in_the_journal_is_a_damaged_entry_not_a_hang(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    os.mkfifo(path / "journal" / "99999999999999999999-1-ended.json")
    events, damaged = RunDir(path).read_journal()
    assert [e["event"] for e in events] == ["created", "submitted"]
    assert damaged == [
        f"{path}/journal/99999999999999999999-1-ended.json: a journal entry is a FIFO, not a file"
    ]


def test_an_error_quotes_at_most_200_characters_of_a_value(tmp_path: Path) -> None:
    result = hpctf("validate", str(DIGITS), "--set", "resources.nodes=x" + "9" * 100_000)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert len(result.stderr) < 700, result.stderr[:700]  # the path, the key, two 200s


# --- validation that knows the limits -----------------------------------------------------------


def digits_with(tmp_path: Path, text: str) -> Path:
    """The digits example with ``text`` appended to its experiment file (YAML's last key wins
    nowhere: the keys appended are new ones)."""
    copy = tmp_path / "digits"
    shutil.copytree(DIGITS.parent, copy)
    experiment = copy / "experiment.yaml"
    original = experiment.read_text(encoding="utf-8")
    experiment.write_text(original + text, encoding="utf-8")
    return experiment


def validate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["validate", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("train.steps", str(10**30), "train.steps: Input should be less than or equal to"),
        ("train.log_every_steps", str(10**30), "train.log_every_steps: Input should be less"),
        ("checkpoint.every_steps", str(10**19), "checkpoint.every_steps: Input should be less"),
        ("train.args.lr", ".nan", "train.args.lr is nan, which the frozen config"),
        ("train.args.lr", "-.inf", "train.args.lr is -inf, which the frozen config"),
        ("train.args.lr", "[1, {a: .inf}]", "train.args.lr[1].a is inf, which the frozen"),
        ("train.seed", str(2**63), "train.seed: Input should be less than or equal to"),
    ],
)
def test_values_past_what_a_run_can_take_are_one_line_at_validate(
    key: str, value: str, expected: str
) -> None:
    code, output = validate(str(DIGITS), "--set", f"{key}={value}")
    assert code == 2 and output.count("\n") == 1, output
    assert expected in output, output


def test_epochs_past_the_bound(tmp_path: Path) -> None:
    experiment = digits_with(tmp_path, "")
    text = experiment.read_text().replace("  steps: 300\n", f"  epochs: {10**7}\n")
    experiment.write_text(text)
    code, output = validate(str(experiment))
    assert code == 2 and "train.epochs: Input should be less than or equal to 1000000" in output
    experiment.write_text(text.replace(f"epochs: {10**7}", "epochs: 3"))
    assert validate(str(experiment))[0] == 0


def test_a_thousand_extends_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "s0.yaml").write_text("name: s0\nextends: local\n")
    for n in range(1, 1000):
        (sites / f"s{n}.yaml").write_text(f"name: s{n}\nextends: s{n - 1}.yaml\n")
    result = hpctf("validate", str(DIGITS), "--site", str(sites / "s999.yaml"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "RecursionError" not in result.stderr
    assert "extends: a chain of more than 32 sites, starting at" in result.stderr
    (sites / "s20.yaml").write_text("name: s20\nextends: local\n")
    assert hpctf("validate", str(DIGITS), "--site", str(sites / "s40.yaml")).returncode == 0


# --- secrets ------------------------------------------------------------------------------------

URI_PASSWORD = "Pw-uri-9f3e1c"
TOKEN = "tok-5b8a2d7e41"
SECRETS_YAML = (
    "tracking:\n"
    "  mlflow:\n"
    f"    tracking_uri: http://alice:{URI_PASSWORD}@mlflow.invalid:5000\n"
    "env:\n"
    f"  HF_TOKEN: {TOKEN}\n"
    "  PLAIN_SETTING: visible\n"
)


def test_secrets_stay_in_owner_only_files_and_out_of_the_script(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    experiment = digits_with(tmp_path, SECRETS_YAML)
    result = CliRunner().invoke(cli, ["submit", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    assert URI_PASSWORD not in result.output and TOKEN not in result.output
    (path,) = runs_root.iterdir()
    assert "warning" not in result.output
    # secrets.env alone holds them: config.json and the snapshot's experiment file say ***.
    assert files_holding(path, URI_PASSWORD, TOKEN) == {"secrets.env": 0o600}
    frozen = json.loads((path / "config.json").read_text())
    assert frozen["experiment"]["env"]["HF_TOKEN"] == "***"
    assert "alice:***@" in frozen["experiment"]["tracking"]["mlflow"]["tracking_uri"]
    assert "HF_TOKEN: ***" in next(path.glob("code/*/experiment.yaml")).read_text()
    # Whoever may read secrets.env (the run's owner: worker, resubmit, sweep) gets the values.
    config = RunDir(path).load_config()
    token = config.experiment.env["HF_TOKEN"]
    assert is_secret(token) and reveal(token) == TOKEN and str(token) == "***"
    assert config.experiment.tracking.mlflow is not None
    assert URI_PASSWORD in str(config.experiment.tracking.mlflow.tracking_uri)
    script = (path / "job.sbatch").read_text()
    assert "export PLAIN_SETTING='visible'" in script
    assert '. "$RUN_DIR/secrets.env" || exit 1' in script and "HF_TOKEN" in script
    # What the batch script sources sets the variable (a real shell).
    shell = subprocess.run(
        ["bash", "-c", f'RUN_DIR={path}; . "$RUN_DIR/secrets.env"; printf %s "$HF_TOKEN"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout == TOKEN
    # A resubmit that extends the run and takes the code again rewrites config.json and the
    # snapshot: still redacted, the values still in secrets.env alone, the script unchanged.
    fake_slurm.answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    again = CliRunner().invoke(
        cli, ["resubmit", "--update-code", "--set", "train.steps=400", str(path)]
    )
    assert again.exit_code == 0, again.output
    assert URI_PASSWORD not in again.output and TOKEN not in again.output
    assert files_holding(path, URI_PASSWORD, TOKEN) == {"secrets.env": 0o600}
    assert (path / "job.sbatch").read_text() == script
    extended = RunDir(path).load_config()
    assert extended.experiment.train.steps == 400
    assert reveal(extended.experiment.env["HF_TOKEN"]) == TOKEN


def test_a_python_source_holding_a_secret_stays_owner_only_and_submit_names_it(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    experiment = digits_with(tmp_path, SECRETS_YAML)
    (experiment.parent / "keys.py").write_text(f"HF = {TOKEN!r}\n")
    result = CliRunner().invoke(cli, ["submit", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "holds a secret" in line]
    assert warned == [
        f"warning: {experiment.parent / 'keys.py'} holds a secret of this run's config, kept "
        "in the code snapshot readable by you alone (0400): move it into env: under a secret "
        "name"
    ]
    (path,) = runs_root.iterdir()
    held = files_holding(path, URI_PASSWORD, TOKEN)
    (copy,) = [k for k in held if k.startswith("code/")]
    assert copy.endswith("/keys.py") and held == {"secrets.env": 0o600, copy: 0o400}


def test_render_o_holds_no_secret_and_takes_the_umask(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    experiment = digits_with(tmp_path, SECRETS_YAML)
    out = tmp_path / "job.sh"
    old = os.umask(0o077)
    try:
        result = CliRunner().invoke(
            cli, ["render", str(experiment), "--site", "local-slurm", "-o", str(out)]
        )
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert out.stat().st_mode & 0o777 == 0o700
    assert TOKEN not in out.read_text() and URI_PASSWORD not in out.read_text()
    (path,) = runs_root.iterdir()
    assert (path / "job.sbatch").stat().st_mode & 0o777 == 0o700


def test_a_uri_password_is_redacted_in_log_lines_tracker_parameters_and_errors(
    tmp_path: Path,
) -> None:
    import logging

    from hpctf.compute.records.tracking.tracker import flat_params
    from hpctf.compute.start.runtime import _RankFormatter
    from hpctf.login.resolving.loader import load_config

    url = f"http://alice:{URI_PASSWORD}@mlflow.invalid:5000"
    record = logging.LogRecord(
        "hpctf.worker",
        logging.WARNING,
        "",
        0,
        "tracker failed: %s",
        (f"HTTPConnectionPool: Max retries exceeded with url {url}/api/2.0",),
        None,
    )
    line = _RankFormatter(0).format(record)
    assert URI_PASSWORD not in line and "http://alice:***@mlflow.invalid:5000/api" in line
    experiment = digits_with(tmp_path, SECRETS_YAML)
    config = load_config(experiment, "local-slurm", [], os.environ).config
    params = flat_params(config)
    assert params["tracking.mlflow.tracking_uri"] == "http://alice:***@mlflow.invalid:5000"
    assert not any(TOKEN in v or URI_PASSWORD in v for v in params.values())
    error = hpctf("validate", str(experiment), "--set", f"resources.nodes={url}")
    assert error.returncode == 2 and URI_PASSWORD not in error.stderr, error.stderr
    assert "http://alice:***@mlflow.invalid" in error.stderr


# --- terminal-safe output -----------------------------------------------------------------------

HOSTILE_TIME = "2026-12-01T00:00:00\x1b[2J\x1b]0;owned\x07\rfake\u202e"


def test_control_characters_from_a_journal_reach_no_terminal(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    for n, (name, entry) in enumerate(
        (
            ("started", {"event": "started", "time": HOSTILE_TIME, "job_id": "4242", "step": 0}),
            (
                "ended",
                {
                    "event": "ended",
                    "time": HOSTILE_TIME,
                    "job_id": "4242",
                    "step": 0,
                    "exit_code": 1,
                    "reason": "failed\x1b[31m",
                },
            ),
        )
    ):
        (path / "journal" / f"0999999999999999999{n}-1-{name}.json").write_text(json.dumps(entry))
    (path / "logs" / "rank-0.log").write_text("hpctf worker starting\n")
    fake_slurm.answer("squeue", "")
    outputs = [
        CliRunner().invoke(cli, ["status", str(path)]).output,
        CliRunner().invoke(cli, ["status"]).output,
        CliRunner().invoke(cli, ["runs", str(runs_root)]).output,
    ]
    for output in outputs:
        assert "\x1b" not in output and "\r" not in output and "\u202e" not in output, output
    # An end reason no hpctf wrote reads as a failure (the history types it), never shown raw.
    assert "from step 0: failed at step 0" in outputs[0], outputs[0]
    from hpctf.core.run.history.runstate import Start
    from hpctf.login.watching.logs import separator

    header = separator(1, Start(job_id="1", step=0, started_at=HOSTILE_TIME), 0)
    assert header.count("\n") == 1 and "\x1b" not in header and "\\x0dfake" in header


# --- journal order ------------------------------------------------------------------------------


def test_a_clock_stepped_back_23_s_leaves_a_finished_run_done(
    runs_root: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctf.core.run import journal

    path = new_run(runs_root, fake_slurm)
    run = RunDir(path)
    now = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: now)
    journal.record_started(run, "4242", "node1", "USR1")
    monkeypatch.setattr(time, "time_ns", lambda: now - 23 * 10**9)  # the clock steps back
    journal.record_ended(run, "4242", 0, "done")
    assert [e["event"] for e in run.events()] == ["created", "submitted", "started", "ended"]
    fake_slurm.answer("squeue", "")
    result = CliRunner().invoke(cli, ["status", "--json", str(path)])
    (document,) = json.loads(result.stdout)["runs"]
    assert document["state"] == "done" and document["elapsed_s"] >= 0


def test_two_writers_whose_clocks_are_60_s_apart_keep_the_order_they_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir(tmp_path)
    base = time.time_ns()
    clocks = {"login": base + 60 * 10**9, "node": base}  # the login node is a minute ahead
    order = ["login", "node", "node", "login", "node"]
    for n, writer in enumerate(order):
        monkeypatch.setattr(time, "time_ns", lambda w=writer, n=n: clocks[w] + n)
        run.record("signalled", job_id="1", signal=f"{writer}-{n}")
    assert [e["signal"] for e in run.events()] == [f"{w}-{n}" for n, w in enumerate(order)]


# --- the code snapshot --------------------------------------------------------------------------


def test_the_snapshot_leaves_credentials_out_and_names_a_file_over_the_cap(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    experiment = digits_with(tmp_path, "")
    project = experiment.parent
    planted = {
        ".env": "HF_TOKEN=x\n",
        ".netrc": "machine a login b password c\n",
        ".secrets/db.yaml": "password: c\n",
        ".aws/config.ini": "[default]\n",
        "kaggle.json": '{"key": "c"}\n',
        "server.pem": "-----BEGIN PRIVATE KEY-----\n",
        "db_password.txt": "c\n",
        "conf/.hidden.yaml": "a: 1\n",
    }
    for name, text in planted.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "vocab.json").write_bytes(b"[" + b"1," * (2 << 20) + b"1]")
    result = CliRunner().invoke(cli, ["submit", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    (copy,) = (path / "code").glob("0-*")
    copied = {str(f.relative_to(copy)) for f in copy.rglob("*") if f.is_file()}
    assert copied == {"digits.py", "experiment.yaml"}, copied
    assert (
        f"warning: {project / 'vocab.json'} is over the 1 MiB hpctf copies per file and is not "
        "in the run's code snapshot" in result.stderr
    )


def test_twenty_thousand_source_files_are_one_line_naming_the_counts(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    experiment = digits_with(tmp_path, "")
    many = experiment.parent / "generated"
    many.mkdir()
    for n in range(20_000):
        (many / f"m{n}.py").write_bytes(b"")
    result = CliRunner().invoke(cli, ["submit", str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "train.python_path holds more than 5,000 source-like files (" in result.output
    assert f"most in {experiment.parent}), the most hpctf copies into each run" in result.output
    assert not runs_root.exists() or list(runs_root.iterdir()) == []


# --- small ones ---------------------------------------------------------------------------------


def test_a_dead_writers_temp_checkpoint_directories_go_and_checkpoints_stay(
    tmp_path: Path,
) -> None:
    from hpctf.core.run.checkpoint_files import on_disk, remove_dead_temps
    from tests.fake_slurm import fake_checkpoint

    fake_checkpoint(tmp_path, 100)
    (tmp_path / "ckpt-200_temp" / "part-00000-of-00001").mkdir(parents=True)
    (tmp_path / "ckpt-200_temp" / "part-00000-of-00001" / "x").write_bytes(b"d")
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "keep").write_bytes(b"k")
    (tmp_path / "ckpt-300_temp").symlink_to(victim)
    assert remove_dead_temps(tmp_path) == ["ckpt-200_temp", "ckpt-300_temp"]
    assert on_disk(tmp_path) == {100: str(tmp_path / "ckpt-100")}
    assert (victim / "keep").read_bytes() == b"k"  # a link removed, never followed
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-100.data-00000-of-00001",
        "ckpt-100.index",
        "elsewhere",
    ]


def test_a_death_by_signal_reads_as_its_name_and_128_plus_n() -> None:
    from hpctf.core.errors import exit_text, shell_status
    from hpctf.core.run.history.runstate import run_state
    from tests.journal_records import ended, started

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.kill()
    assert proc.wait(timeout=30) == -9
    assert shell_status(proc.returncode) == 137
    assert exit_text(proc.returncode) == exit_text(137) == "exit 137, SIGKILL"
    assert exit_text(1) == "exit 1" and exit_text(None) == "exit ?"
    state = run_state([started(), ended("failed", 0, 137)])
    assert state.why == "exit 137, SIGKILL"  # "failed" once: the state says it


def test_a_real_local_run_keeps_its_secrets_out_of_every_log_and_shared_file(
    runs_root: Path, tmp_path: Path
) -> None:
    """MLflow at a port nobody listens on, its URI holding a password, and a token in env: the
    run trains; the rank log (which quotes the tracker's URL) and the test's output hold
    neither secret; only owner-only files do."""
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    experiment = digits_with(
        tmp_path, SECRETS_YAML.replace("mlflow.invalid:5000", f"127.0.0.1:{port}")
    )
    settings = ["resources.nodes=1", "train.steps=6", "train.log_every_steps=1",
                "checkpoint.every_steps=6"]  # fmt: skip
    # The entry writes what the worker's environment holds, hashed: the token reaches it.
    seen = tmp_path / "seen-token.sha256"
    (experiment.parent / "envcheck.py").write_text(
        "import hashlib, os, pathlib\nimport digits\n\n\n"
        "def build(**args):\n"
        f"    pathlib.Path({str(seen)!r}).write_text(\n"
        "        hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())\n"
        "    return digits.build(**args)\n"
    )
    settings = ["resources.nodes=1", "train.steps=6", "train.log_every_steps=1",
                "checkpoint.every_steps=6", "train.entry=envcheck:build"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "hpctf", "submit", str(experiment), "--site", "local"]
        + [arg for setting in settings for arg in ("--set", setting)],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen.read_text() == hashlib.sha256(TOKEN.encode()).hexdigest()
    (path,) = runs_root.iterdir()
    log = (path / "logs" / "rank-0.log").read_text()
    assert f"http://alice:***@127.0.0.1:{port}" in log  # the tracker's failure, redacted
    for text in (proc.stdout, proc.stderr, log):
        assert URI_PASSWORD not in text and TOKEN not in text
    # Every file of the run directory (logs, journal, config, snapshot, tracking): only
    # secrets.env holds either secret.
    assert files_holding(path, URI_PASSWORD, TOKEN) == {"secrets.env": 0o600}


def test_resubmit_of_a_local_run_another_launcher_owns_says_how_to_stop_it_there(
    runs_root: Path, tmp_path: Path
) -> None:
    import socket

    from hpctf.core.run import ownership

    out = tmp_path / "job.sh"
    made = CliRunner().invoke(cli, ["render", str(DIGITS), "--site", "local", "-o", str(out)])
    assert made.exit_code == 0, made.output
    (path,) = runs_root.iterdir()
    launcher = subprocess.Popen(["sleep", "60"])  # a live process standing for its launcher
    try:
        claim = ownership.Claim("local", socket.gethostname(), launcher.pid, os.getuid(), 0.0)
        assert ownership.take(path, claim, lambda c: False) is None
        result = CliRunner().invoke(cli, ["resubmit", str(path)])
    finally:
        launcher.kill()
        launcher.wait()
    assert result.exit_code == 2
    assert result.output == (
        f"Error: a local run (pid {launcher.pid} on {socket.gethostname()}) owns {path}; wait "
        "for it, or stop its launcher (Ctrl-C in its terminal, or kill its pid)\n"
    )


def test_a_local_launcher_gone_without_its_end_is_failed_and_logs_f_returns(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (or SIGKILL) kept the local launcher from writing its ``ended`` record: the
    run is not shown running for ever, and ``logs -f`` ends."""
    import socket

    from hpctf.core.run import journal, ownership

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    made = CliRunner().invoke(
        cli, ["render", str(DIGITS), "--site", "local", "-o", str(tmp_path / "job.sh")]
    )
    assert made.exit_code == 0, made.output
    (path,) = runs_root.iterdir()
    launcher = subprocess.Popen(["sleep", "60"])
    claim = ownership.Claim("local", socket.gethostname(), launcher.pid, os.getuid(), 0.0)
    assert ownership.take(path, claim, lambda c: False) is None
    journal.record_started(RunDir(path), str(launcher.pid), socket.gethostname(), "USR1")
    (path / "logs" / "rank-0.log").write_text("step 1/300\n")

    def shown() -> dict[str, object]:
        result = CliRunner().invoke(cli, ["status", "--json", str(path)])
        (document,) = json.loads(result.stdout)["runs"]
        return document

    try:
        assert shown()["state"] == "running"  # its launcher lives
    finally:
        launcher.kill()
        launcher.wait()
    document = shown()
    assert document["state"] == "failed"
    assert f"the local launcher (pid {launcher.pid} on {socket.gethostname()}) is gone" in str(
        document["why"]
    )
    started = time.monotonic()
    follow = hpctf("logs", "-f", str(path), timeout=60)
    assert follow.returncode == 0, follow.stderr
    assert "step 1/300" in follow.stdout and time.monotonic() - started < 20


def test_sweep_points_share_one_copy_of_the_code(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\nMaxJobCount = 10000\n")
    experiment = digits_with(tmp_path, "")
    result = CliRunner().invoke(
        cli, ["sweep", str(experiment), "--site", "local-slurm", "--grid", "train.seed=0,1,2"]
    )
    assert result.exit_code == 0, result.output
    (sweep,) = runs_root.iterdir()
    # One snapshot for the sweep, named by its content; each point's code/ a link to it.
    (shared,) = (sweep / "code").iterdir()
    assert sorted(p.name for p in shared.iterdir()) == ["0-digits", "SNAPSHOT.json"]
    assert (shared / "0-digits" / "digits.py").stat().st_mode & 0o777 == 0o444
    points = sorted(sweep.glob("digits-seed*"))
    assert len(points) == 3
    for point in points:
        assert (point / "code").is_symlink() and (point / "code").resolve() == shared
        # What is the point's own, and nothing else: 8 entries and the directory itself.
        own = sorted(str(p.relative_to(point)) for p in point.rglob("*"))
        assert [p for p in own if not p.startswith("journal/")] == [
            "checkpoints", "code", "config.json", "job.sbatch", "journal", "logs",
        ]  # fmt: skip
        assert [e["event"] for e in RunDir(point).events()] == ["created", "submitted"]
        config = json.loads((point / "config.json").read_text())
        assert config["experiment"]["train"]["python_path"] == [str(shared / "0-digits")]
        assert (point / "config.json").stat().st_mode & 0o777 == 0o600
    # status reads the snapshot through the link, as for a single run.
    shown = CliRunner().invoke(cli, ["status", str(points[1])])
    assert f"code: {experiment.parent}: 2 files, " in shown.output, shown.output

    # resubmit --update-code of one point: a copy of its own; the others keep the shared one.
    (experiment.parent / "digits.py").write_text(
        (experiment.parent / "digits.py").read_text() + "\n# changed\n"
    )
    fake_slurm.answer("sbatch", "4300\n")
    resubmitted = CliRunner().invoke(cli, ["resubmit", str(points[0]), "--update-code"])
    assert resubmitted.exit_code == 0, resubmitted.output
    assert not (points[0] / "code").is_symlink()
    assert (points[0] / "code/0-digits/digits.py").read_text().endswith("# changed\n")
    assert json.loads((points[0] / "config.json").read_text())["experiment"]["train"][
        "python_path"
    ] == [str(points[0] / "code" / "0-digits")]
    assert not (shared / "0-digits" / "digits.py").read_text().endswith("# changed\n")
    assert (points[1] / "code").resolve() == shared
    # Removing a point leaves the others whole.
    shutil.rmtree(points[2])
    assert (points[1] / "code/0-digits/digits.py").is_file()


def test_a_shared_snapshot_is_named_by_its_content(tmp_path: Path) -> None:
    from hpctf.core.run import snapshot

    code = tmp_path / "src"
    write_file = code / "model.py"
    code.mkdir()
    write_file.write_text("A = 1\n")
    store = tmp_path / "sweep" / "code"
    first, sources = snapshot.take_shared([str(code)], store)
    again, _ = snapshot.take_shared([str(code)], store)
    assert again == first and sorted(p.name for p in store.iterdir()) == [first.name]
    assert sources[0].copy == str(first / "0-src") and (first / "0-src/model.py").is_file()
    write_file.write_text("A = 2\n")
    changed, _ = snapshot.take_shared([str(code)], store)
    assert changed != first and (first / "0-src/model.py").read_text() == "A = 1\n"
    assert (changed / "0-src/model.py").read_text() == "A = 2\n"
    assert store.stat().st_mode & 0o022 == 0  # nobody else may swap a point's code here
    run = tmp_path / "sweep" / "point"
    run.mkdir()
    snapshot.link(run, changed)
    assert [s.copy for s in snapshot.read(run)] == [str(changed / "0-src")]


def test_a_run_directory_moved_mid_run_is_an_environment_fault_and_no_stub_is_left(
    runs_root: Path, tmp_path: Path
) -> None:
    settings = ["resources.nodes=1", "train.steps=1000000", "train.log_every_steps=1"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hpctf", "submit", str(DIGITS), "--site", "local"]
        + [arg for setting in settings for arg in ("--set", setting)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = list(runs_root.glob("*/metrics.jsonl")) if runs_root.exists() else []
            if found and found[0].stat().st_size > 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail("no step logged within 120 s")
        path = found[0].parent
        moved = path.with_name(path.name + "-moved")
        path.rename(moved)
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
        launcher.wait()
    assert not path.exists()  # not recreated as a stub holding a journal
    log = (moved / "logs" / "rank-0.log").read_text()
    assert f"the run directory {path} is gone (moved or removed while the job ran)" in log, log[
        -2000:
    ]
    assert "a bug in hpctf" not in log and "a bug in hpctf" not in err
    assert launcher.returncode == 3, out + err


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB tmpfs of its own (root only), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_local_run_whose_disk_fills_between_saves_ends_failed_and_logs_f_returns(
    small_tmpfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs_root = small_tmpfs / "runs"
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(runs_root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = ["resources.nodes=1", "train.steps=1000000", "train.log_every_steps=1"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hpctf", "submit", str(DIGITS), "--site", "local"]
        + [arg for setting in settings for arg in ("--set", setting)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = list(runs_root.glob("*/metrics.jsonl")) if runs_root.exists() else []
            if found and found[0].stat().st_size > 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail("no step logged within 120 s")
        with (small_tmpfs / "filler").open("wb") as filler:  # the disk fills between saves
            try:
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
            except OSError:
                pass
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
        launcher.wait()
    path = found[0].parent
    assert launcher.returncode == 3, out + err
    assert "a bug in hpctf" not in out + err
    said = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(said) == 1 and "No space left on device" in said[0], err
    status = hpctf("status", "--json", str(path))
    (document,) = json.loads(status.stdout)["runs"]
    assert document["state"] == "failed", document
    print(f"{said[0]}\nstatus: {document['state']}: {document['why']}")
    follow = hpctf("logs", "-f", str(path), timeout=60)
    assert follow.returncode == 0, follow.stderr


def test_a_planted_far_future_entry_does_not_pin_the_journals_order() -> None:
    from hpctf.core.run.journal_entries import next_stamp

    now = 1_800_000_000 * 10**9
    planted = ["99999999999999999999-1-submitted.json", f"{now + 5 * 10**9:020d}-7-started.json"]
    assert next_stamp(planted, now) == now + 5 * 10**9 + 1  # 5 s ahead: followed
    assert next_stamp(planted[:1], now) == now  # far ahead: not followed
    assert next_stamp([".x.json.tmp", "notes.txt"], now) == now


def test_status_redacts_a_uri_password_from_run_data(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    from hpctf.core.run import journal

    path = new_run(runs_root, fake_slurm)
    run = RunDir(path)
    journal.record_started(run, "4242", "node1", "USR1")
    line = "train.py:9: ConnectionError: http://bob:hunter2-xyz@db.invalid/x refused"
    journal.record_user_code_failed(run, "4242", "node1", 0, "ConnectionError", "train.py:9", line)
    journal.record_ended(run, "4242", 65, "failed")
    fake_slurm.answer("squeue", "")
    for args in (["status", str(path)], ["status", "--json", str(path)], ["status"]):
        output = CliRunner().invoke(cli, args).output
        assert "hunter2-xyz" not in output, output
    assert "http://bob:***@db.invalid/x" in CliRunner().invoke(cli, ["status", str(path)]).output


def test_the_doctor_script_holding_a_site_token_is_yours_alone(
    runs_root: Path, tmp_path: Path
) -> None:
    from hpctf.core.settings.sites import load_named_site
    from hpctf.login.doctor.doctor_commands import doctor_config, prepare_directory

    sites = tmp_path / "sites"
    sites.mkdir()
    for name, env_yaml in (("tok", {"HF_TOKEN": TOKEN}), ("plain", {"OMP_NUM_THREADS": "2"})):
        (sites / f"{name}.yaml").write_text(
            json.dumps({"name": name, "scheduler": "slurm", "runs_root": str(runs_root),
                        "env": env_yaml})
        )  # fmt: skip
    env = {**os.environ, "HPCTF_SITE_PATH": str(sites)}
    old = os.umask(0o022)
    try:
        for name, mode in (("tok", 0o700), ("plain", 0o755)):
            config = doctor_config(load_named_site(name, env), 1, 60, env)
            script = prepare_directory(config, tmp_path / f"doctor-{name}", 60)
            assert script.stat().st_mode & 0o777 == mode, name
    finally:
        os.umask(old)


@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "sparse-2g"])
def test_special_files_in_a_run_hang_no_reader(
    planted: str, runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """A FIFO, /dev/zero (through a link) or a 2 GB sparse file planted as DONE, metrics.jsonl,
    secrets.env and rank 0's log: status, runs, logs and status --json each end in bounded
    time and memory, the run's row kept, the planted file said once at most."""
    path = new_run(runs_root, fake_slurm)
    (path / "logs").mkdir(exist_ok=True)
    for name in ("DONE", "metrics.jsonl", "secrets.env", "logs/rank-0.log"):
        target = path / name
        target.unlink(missing_ok=True)
        if planted == "fifo":
            os.mkfifo(target)
        elif planted == "dev-zero":
            target.symlink_to("/dev/zero")
        else:
            with target.open("wb") as handle:
                handle.truncate(2 << 30)
    for args in (["status", str(path)], ["runs"], ["status"], ["logs", str(path)],
                 ["status", "--json", str(path)]):  # fmt: skip
        began = time.monotonic()
        proc = subprocess.run(
            ["prlimit", f"--as={3 << 30}", *HPCTF, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert time.monotonic() - began < 30, args
        assert proc.returncode in (0, 2, 3), (args, proc.stdout[-500:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert len(proc.stderr.splitlines()) <= 1, (args, proc.stderr)


def peak_rss_mb(argv: list[str]) -> tuple[int, subprocess.CompletedProcess[str]]:
    """The peak resident memory of ``argv``, in MB, measured by a Python of its own whose one
    child it is (ru_maxrss of RUSAGE_CHILDREN: pytest's own children would count here)."""
    probe = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stdout.write(done.stdout)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
        "sys.exit(done.returncode)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    return int(proc.stdout.splitlines()[-1]), proc


def test_status_of_a_run_with_200_mb_of_metrics_stays_under_150_mb(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """A run logging every step for months: 200 MB of metrics.jsonl (1.85 GB of memory for
    `status RUN` once). Its tail is read, line by line, keys interned: measured here 104 MB
    for status, 127 MB for status --json, whose document holds every loss it read."""
    path = new_run(runs_root, fake_slurm)
    train = {"loss": 0.5, "steps_per_s": 97.9, "rss_mb": 687.9, "threads": 123, "total_steps": 1}
    rows = []
    for n in range(8000):
        rows.append(json.dumps({"step": n, **train}))
        if n % 10 == 0:
            rows.append(json.dumps({"step": n, "eval": {"loss": 0.6, "accuracy": 0.86}}))
    block = ("\n".join(rows) + "\n").encode()
    with (path / "metrics.jsonl").open("wb") as handle:
        for _ in range((200 << 20) // len(block) + 1):
            handle.write(block)
    assert (path / "metrics.jsonl").stat().st_size > 200 << 20
    for args in (["status", str(path)], ["status", "--json", str(path)]):
        peak, proc = peak_rss_mb([*HPCTF, *args])
        assert proc.returncode == 0, proc.stderr
        assert peak < 150, (args, peak)  # 180 MB before the lines were read one by one


def test_a_truncated_log_is_said_and_read_again_from_its_start(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """logrotate's copytruncate under `logs -f`: the follower noticed nothing for 47 s, then
    went on mid-line, 12,000 steps later; now it says so and reads the log from its start."""
    from hpctf.core.run.history import read_history
    from hpctf.login.watching.logs import LogReader

    path = new_run(runs_root, fake_slurm)
    (path / "logs").mkdir(exist_ok=True)
    log = path / "logs" / "rank-0.log"
    log.write_text("".join(f"step {n}\n" for n in range(1, 2001)))
    run = RunDir(path)
    reader = LogReader(run, 0, None)
    history = read_history(run)
    assert "".join(reader.read(history)).endswith("step 2000\n")
    with log.open("r+") as handle:  # copytruncate: the file emptied in place
        handle.truncate(0)
    with log.open("a") as handle:
        handle.write("step 7800\nstep 7801\n")
    again = "".join(reader.read(history))
    assert "was truncated to 20 bytes after 18,893 were read" in again.splitlines()[0]
    assert again.splitlines()[1:] == ["step 7800", "step 7801"]


@pytest.mark.parametrize("command", ["resubmit", "cancel"])
def test_another_users_run_is_theirs_to_resubmit_or_cancel(
    command: str, runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """In a shared runs root: a resubmit would sbatch their job.sbatch as you, a cancel record
    their run cancelled. One line naming the owner, exit 2, nothing submitted or written."""
    owner = other_user()
    path = new_run(runs_root, fake_slurm)
    for item in [path, *path.rglob("*")]:
        os.lchown(item, owner.pw_uid, owner.pw_gid)
    before = sorted(p.name for p in (path / "journal").iterdir())
    submitted = len(fake_slurm.calls("sbatch"))
    proc = hpctf(command, str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"{path} is hpctf-other's run: hpctf {command} acts only on runs of your own" in line
    assert sorted(p.name for p in (path / "journal").iterdir()) == before
    assert len(fake_slurm.calls("sbatch")) == submitted
