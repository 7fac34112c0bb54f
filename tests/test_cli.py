"""The CLI on the login node: validation errors, render, submit (fake sbatch), run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctf.cli import cli
from tests.conftest import DIGITS, write

GOOD = yaml.safe_load(DIGITS.read_text())


def experiment_text(**changes: object) -> str:
    data = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        if value is DELETE:
            target.pop(last, None)
        else:
            target[last] = value
    return yaml.safe_dump(data)


DELETE = object()

# (name, experiment text, extra args, what the one-line message must contain)
BAD_CASES = [
    ("unknown top key", experiment_text(nmae="x"), [], "nmae: unknown key (did you mean 'name'?)"),
    ("unknown nested key", experiment_text(resources__gpus="1"), [], "resources.gpus: unknown key"),
    ("negative nodes", experiment_text(resources__nodes=-1), [], "resources.nodes"),
    ("zero nodes", experiment_text(resources__nodes=0), [], "resources.nodes"),
    ("nodes not a number", experiment_text(resources__nodes="two"), [], "resources.nodes"),
    (
        "bad time",
        experiment_text(resources__time="1h"),
        [],
        "resources.time: '1h' is not a Slurm time",
    ),
    ("zero time", experiment_text(resources__time="0"), [], "resources.time"),
    (
        "missing entry",
        experiment_text(train__entry=DELETE),
        [],
        "train.entry: required key is missing",
    ),
    ("entry not module:function", experiment_text(train__entry="digits"), [], "train.entry"),
    (
        "steps and epochs",
        experiment_text(train__epochs=3),
        [],
        "exactly one of train.steps or train.epochs",
    ),
    ("zero batch", experiment_text(train__global_batch_size=0), [], "train.global_batch_size"),
    ("bad name", experiment_text(name="my run; rm -rf /"), [], "name"),
    ("unknown site", experiment_text(site="nowhere"), [], "unknown site 'nowhere'"),
    ("bad env name", experiment_text(env={"BAD-NAME": "1"}), [], "env"),
    ("checkpoint keep zero", experiment_text(checkpoint__keep=0), [], "checkpoint.keep"),
    ("yaml syntax", "name: [unclosed\n", [], "invalid YAML"),
    ("empty file", "", [], "the file is empty"),
    ("top level list", "- a\n- b\n", [], "expected a mapping"),
    ("bad --set form", experiment_text(), ["--set", "resources.nodes"], "expected KEY.PATH=VALUE"),
    ("--set wrong type", experiment_text(), ["--set", "resources.nodes=many"], "resources.nodes"),
    (
        "--set unknown key",
        experiment_text(),
        ["--set", "resources.nodez=2"],
        "resources.nodez: unknown key",
    ),
    (
        "partition with space",
        experiment_text(resources__partition="a b"),
        [],
        "resources.partition",
    ),
]


@pytest.mark.parametrize(
    ("text", "extra", "expected"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES]
)
@pytest.mark.parametrize("command", ["submit", "render"])
def test_bad_experiment_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path,
    runs_root: Path,
    fake_sbatch: Path,
    command: str,
    text: str,
    extra: list[str],
    expected: str,
) -> None:
    experiment = write(tmp_path / "exp" / "experiment.yaml", text)
    args = [command, str(experiment), "--site", "local-slurm", *extra]
    if "unknown site" in expected:
        args.remove("--site")
        args.remove("local-slurm")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert "Traceback" not in result.output
    if "--set" not in extra and "unknown site" not in expected:
        assert str(experiment) in lines[0]  # names the file
    assert not runs_root.exists()
    assert not fake_sbatch.exists()


def test_error_names_the_line(tmp_path: Path, runs_root: Path) -> None:
    experiment = write(tmp_path / "e.yaml", experiment_text(resources__nodes=-3))
    result = CliRunner().invoke(cli, ["render", str(experiment), "--site", "local-slurm"])
    line_no = next(
        i for i, text in enumerate(experiment.read_text().splitlines(), 1) if "nodes: -3" in text
    )
    assert f"{experiment}:{line_no}: resources.nodes" in result.output


def test_render_prints_script_and_writes_nothing(runs_root: Path) -> None:
    result = CliRunner().invoke(cli, ["render", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=2\n" in result.output
    assert "#SBATCH --partition=debug\n" in result.output
    assert "srun --kill-on-bad-exit=1" in result.output
    assert not runs_root.exists()


def test_set_overrides_experiment(runs_root: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "render",
            str(DIGITS),
            "--site",
            "local-slurm",
            "--set",
            "resources.nodes=4",
            "--set",
            "resources.time=1-00:00",
        ],
    )
    assert "#SBATCH --nodes=4\n" in result.output
    assert "#SBATCH --time=1-00:00\n" in result.output


def test_render_output_creates_run_dir(tmp_path: Path, runs_root: Path, fake_sbatch: Path) -> None:
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        cli, ["render", str(DIGITS), "--site", "local-slurm", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = runs_root.iterdir()
    assert out.read_text() == (run_dir / "job.sbatch").read_text()
    assert f"RUN_DIR='{run_dir}'\n" in out.read_text()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["experiment"]["resources"]["nodes"] == 2
    assert not fake_sbatch.exists()


def test_submit_calls_sbatch_parsable_and_records_job(runs_root: Path, fake_sbatch: Path) -> None:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    assert "submitted job 4242" in result.output
    (run_dir,) = runs_root.iterdir()
    assert fake_sbatch.read_text().split() == ["--parsable", str(run_dir / "job.sbatch")]
    events = [json.loads(p.read_text()) for p in sorted((run_dir / "journal").iterdir())]
    assert [e["event"] for e in events] == ["created", "submitted"]
    assert events[1]["job_id"] == "4242"


def test_dry_run_writes_nothing_and_only_asks_sbatch_test_only(
    runs_root: Path, fake_sbatch: Path
) -> None:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("#!/bin/bash\n")
    assert "Slurm accepts this job" in result.output
    assert not runs_root.exists()
    (call,) = fake_sbatch.read_text().splitlines()
    assert call.split()[0] == "--test-only"  # never a real submission


def test_dry_run_reports_what_sbatch_test_only_refuses(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = write(
        tmp_path / "bin" / "sbatch",
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\n"
        "exit 1\n",
    ).parent
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", "--dry-run"])
    assert result.exit_code == 2
    assert "Invalid account" in result.output
    assert not runs_root.exists()


def test_dry_run_without_sbatch_on_path_still_renders(
    runs_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=2" in result.output
    assert "test-only" not in result.output


def test_sbatch_failure_is_reported_in_one_line(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = write(
        tmp_path / "bin" / "sbatch",
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: debug' >&2\nexit 1\n",
    ).parent
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 2
    assert (
        "sbatch failed (exit 1): sbatch: error: invalid partition specified: debug" in result.output
    )


def test_status_of_a_non_run_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a run directory" in result.output


def test_login_path_never_imports_tensorflow(runs_root: Path) -> None:
    code = (
        "import sys\n"
        "from hpctf.cli import cli\n"
        f"try:\n    cli(['render', {str(DIGITS)!r}, '--site', 'local-slurm'])\n"
        "except SystemExit:\n    pass\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
        "print('NO_TF')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "NO_TF" in proc.stdout, proc.stderr
