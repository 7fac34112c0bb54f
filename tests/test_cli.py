"""The CLI on the login node: validation errors, render, submit (fake sbatch), run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS, REPO, run_dir_from, write

GOOD = yaml.safe_load(DIGITS.read_text())
# Experiments written to a scratch directory still find digits.py (the entry is checked).
GOOD["train"]["python_path"] = [str(DIGITS.parent)]


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

# (name, experiment text, extra args, what the one-line message must contain). Every message
# must also name the experiment file; --site local-slurm is added unless the case names a site.
BAD_CASES = [
    ("unknown top key", experiment_text(nmae="x"), [], "nmae: unknown key (did you mean 'name'?)"),
    (
        "unknown nested key",
        experiment_text(resources__nodez=1),
        [],
        "resources.nodez: unknown key (did you mean 'nodes'?)",
    ),
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
    ("time with days too many", experiment_text(resources__time="1-2-3"), [], "resources.time"),
    ("bad mem", experiment_text(resources__mem="4 GB"), [], "resources.mem: '4 GB' is not a"),
    (
        "bad mail type",
        experiment_text(resources__mail_type=["END", "SOMETIMES"]),
        [],
        "resources.mail_type.1",
    ),
    (
        "bad dependency",
        experiment_text(resources__dependency="after:last"),
        [],
        "resources.dependency: 'after:last' is not a Slurm dependency",
    ),
    (
        "bad exclusive",
        experiment_text(resources__exclusive="maybe"),
        [],
        "resources.exclusive: 'maybe' is not one of true, false, user, mcs",
    ),
    ("partition with space", experiment_text(resources__partition="a b"), [], "partition"),
    ("account injection", experiment_text(resources__account="x --nodes=9"), [], "account"),
    (
        "extra_sbatch overriding --nodes",
        experiment_text(resources__extra_sbatch=["--nodes=3"]),
        [],
        "resources.extra_sbatch.0: '--nodes=3' would override --nodes, which hpctf manages",
    ),
    (
        "extra_sbatch -N2",
        experiment_text(resources__extra_sbatch=["--hold", "-N2"]),
        [],
        "resources.extra_sbatch.1: '-N2' is --nodes",
    ),
    (
        "time shorter than the preemption warning",
        experiment_text(resources__time="4"),
        [],
        "resources.time: 4 (240 s) must be longer than site local-slurm's preemption.warning",
    ),
    (
        "extra_sbatch --no-requeue",
        experiment_text(resources__extra_sbatch=["--no-requeue"]),
        [],
        "would override --no-requeue, which hpctf manages: hpctf requeues preempted jobs",
    ),
    (
        "extra_sbatch abbreviated --signal",
        experiment_text(resources__extra_sbatch=["--sig=USR2@60"]),
        [],
        "would override --signal",
    ),
    (
        "extra_sbatch smuggling a second option",
        experiment_text(resources__extra_sbatch=["--hold --nodes=4"]),
        [],
        "one sbatch option per item",
    ),
    (
        "missing entry",
        experiment_text(train__entry=DELETE),
        [],
        "train: give exactly one of train.entry (module:function) or train.script",
    ),
    (
        "entry not module:function",
        experiment_text(train__entry="digits"),
        [],
        "train.entry: 'digits' is not module:function: name the module and the function "
        "returning hpctf.Task (e.g. digits:build); to run a script as it is, give train.script",
    ),
    (
        "entry a .py file",
        experiment_text(train__entry="seed_fit.py"),
        [],
        "train.entry: 'seed_fit.py' is a file: to run a script as it is, give it as train.script",
    ),
    (
        "misspelled train.args key",
        experiment_text(train__args={"hidden": 8, "learning_rat": 0.1}),
        [],
        "train.args.learning_rat: unknown argument of build() (did you mean 'learning_rate'?); "
        "build() takes hidden, learning_rate, validation_fraction",
    ),
    (
        "train.args key from --set",
        experiment_text(),
        ["--set", "train.args.lrr=0.1"],
        "train.args.lrr: unknown argument of build(); build() takes hidden, learning_rate, "
        "validation_fraction (from --set train.args.lrr=0.1)",
    ),
    (
        "entry module missing",
        experiment_text(train__entry="digitz:build"),
        [],
        "train.entry: module digitz not found",
    ),
    (
        "entry function missing",
        experiment_text(train__entry="digits:biuld"),
        [],
        "train.entry: " + str(DIGITS.parent / "digits.py") + " defines no biuld",
    ),
    (
        "steps and epochs",
        experiment_text(train__epochs=3),
        [],
        "exactly one of train.steps or train.epochs",
    ),
    ("zero batch", experiment_text(train__global_batch_size=0), [], "train.global_batch_size"),
    (
        "batch not split over the replicas",
        experiment_text(resources__nodes=3, train__global_batch_size=64),
        [],
        "train.global_batch_size: 64 is not divisible by the 3 replicas",
    ),
    ("bad name", experiment_text(name="my run; rm -rf /"), [], "name: 'my run; rm -rf /' is not"),
    ("unknown site", experiment_text(site="nowhere"), [], "site: unknown site 'nowhere'"),
    ("no site at all", experiment_text(site=DELETE), [], "site: no site given"),
    ("bad env name", experiment_text(env={"BAD-NAME": "1"}), [], "env"),
    ("reserved env name", experiment_text(env={"RUN_DIR": "/x"}), [], "RUN_DIR is set by hpctf"),
    ("newline in env value", experiment_text(env={"A": "x\ny"}), [], "newline"),
    (
        "setup line read as a mapping",
        "setup:\n- echo a: b\n" + experiment_text(),
        [],
        "setup.0: this line reads as a YAML mapping",
    ),
    (
        "mail_user without mail_type",
        experiment_text(resources__mail_user="me@example.org"),
        [],
        "resources.mail_user: mail_user without mail_type",
    ),
    ("checkpoint keep zero", experiment_text(checkpoint__keep=0), [], "checkpoint.keep"),
    (
        "restart every 0 steps",
        experiment_text(train__restart_every_steps=0),
        [],
        "train.restart_every_steps: Input should be greater than or equal to 1",
    ),
    (
        "planned restarts on a local site",
        experiment_text(train__restart_every_steps=100),
        ["--site", "local"],
        "train.restart_every_steps: needs a Slurm site, which requeues the job; site local",
    ),
    ("yaml syntax", "name: [unclosed\n", [], "invalid YAML"),
    ("duplicate key", "name: a\nname: b\n", [], ":2: invalid YAML: key 'name' given twice"),
    ("empty file", "", [], "the file is empty"),
    ("top level list", "- a\n- b\n", [], "expected a mapping"),
    ("bad --set form", experiment_text(), ["--set", "resources.nodes"], "expected KEY.PATH=VALUE"),
    (
        "--set wrong type",
        experiment_text(),
        ["--set", "resources.nodes=many"],
        "resources.nodes: Input should be a valid integer",
    ),
    (
        "--set unknown key",
        experiment_text(),
        ["--set", "resources.nodez=2"],
        "resources.nodez: unknown key (did you mean 'nodes'?)",
    ),
    (
        "--set extra_sbatch -N 4",
        experiment_text(),
        ["--set", "resources.extra_sbatch=[-N 4]"],
        "(from --set resources.extra_sbatch=[-N 4])",
    ),
    ("--site unknown", experiment_text(), ["--site", "nowhere"], "--site: unknown site 'nowhere'"),
]


@pytest.mark.parametrize(
    ("text", "extra", "expected"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES]
)
@pytest.mark.parametrize("command", ["validate", "render", "submit", "submit --dry-run"])
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
    names_site = "site:" in expected or "--site" in extra
    site = [] if names_site else ["--site", "local-slurm"]
    result = CliRunner().invoke(cli, [*command.split(), str(experiment), *site, *extra])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert "Traceback" not in result.output
    # Names the file first, or the flag whose value was wrong.
    assert lines[0].startswith((f"Error: {experiment}", "Error: --site", "Error: --set"))
    assert not runs_root.exists()
    assert not fake_sbatch.exists()  # not even sbatch --test-only


# (name, bytes put into the experiment's name value, what the one-line message must contain).
UNREADABLE_BYTES = [
    ("NUL", b"\x00", "invalid YAML: unprintable character U+0000 at column 10"),
    ("BEL", b"\x07", "invalid YAML: unprintable character U+0007 at column 10"),
    ("DEL", b"\x7f", "invalid YAML: unprintable character U+007F at column 10"),
    ("invalid UTF-8", b"\xff", "not UTF-8 text: byte 0xff at column 10"),
    ("Latin-1", b"\xe9", "not UTF-8 text: byte 0xe9 at column 10"),
    ("truncated UTF-8", b"\xe2\x82", "not UTF-8 text: byte 0xe2 at column 10"),
]


@pytest.mark.parametrize(
    ("bad", "expected"), [c[1:] for c in UNREADABLE_BYTES], ids=[c[0] for c in UNREADABLE_BYTES]
)
@pytest.mark.parametrize("command", ["validate", "render", "submit --dry-run"])
def test_control_characters_and_bad_bytes_exit_2_with_file_and_line(
    tmp_path: Path, runs_root: Path, fake_sbatch: Path, command: str, bad: bytes, expected: str
) -> None:
    text = experiment_text().encode()
    assert text.count(b"\nname: digits\n") == 1
    experiment = tmp_path / "exp" / "experiment.yaml"
    experiment.parent.mkdir()
    experiment.write_bytes(text.replace(b"\nname: digits\n", b"\nname: dig" + bad + b"its\n"))
    line_no = text[: text.index(b"\nname: digits\n")].count(b"\n") + 2
    result = CliRunner().invoke(cli, [*command.split(), str(experiment), "--site", "local-slurm"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: {experiment}:{line_no}: {expected}"), lines[0]
    assert "Traceback" not in result.output
    assert not runs_root.exists()
    assert not fake_sbatch.exists()


def test_every_problem_at_once_one_line_each(tmp_path: Path, runs_root: Path) -> None:
    sites = tmp_path / "sites"
    write(sites / "mine.yaml", "name: mine\nscheduler: slurm\nruns_root: /r\ngpus_per_node: -1\n")
    text = experiment_text(
        site="mine", resources__nodes=0, resources__time="soon", checkpoint__kepe=2
    )
    experiment = write(tmp_path / "e.yaml", text)
    result = CliRunner().invoke(
        cli, ["validate", str(experiment)], env={"HPCTF_SITE_PATH": str(sites)}
    )
    assert result.exit_code == 2
    lines = result.output.replace("Error: ", "").splitlines()
    assert len(lines) == 4, result.output
    keys = {line.split(": ")[1] for line in lines}
    assert keys == {"resources.nodes", "resources.time", "checkpoint.kepe", "gpus_per_node"}
    assert sum(line.startswith(f"{experiment}:") for line in lines) == 3
    assert any(line.startswith(f"{sites / 'mine.yaml'}:4: gpus_per_node") for line in lines)


def test_error_names_the_line(tmp_path: Path, runs_root: Path) -> None:
    experiment = write(tmp_path / "e.yaml", experiment_text(resources__nodes=-3))
    result = CliRunner().invoke(cli, ["render", str(experiment), "--site", "local-slurm"])
    line_no = next(
        i for i, text in enumerate(experiment.read_text().splitlines(), 1) if "nodes: -3" in text
    )
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {experiment}:{line_no}: resources.nodes")


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
    assert result.exit_code == 0, result.output
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
    # The comment names the run: a submit killed during sbatch leaves a job hpctf finds.
    comment = f"--comment={slurm_comment(run_dir)}"
    assert fake_sbatch.read_text().split() == ["--parsable", comment, str(run_dir / "job.sbatch")]
    events = RunDir(run_dir).events()
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


@pytest.mark.parametrize(
    ("said", "status", "whose"),
    [
        ("sbatch: error: Batch job submission failed: Invalid partition name specified", 2, "user"),
        ("sbatch: error: invalid partition specified: debug", 2, "user"),
        (
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
            "(connect failure)",
            3,
            "environment",
        ),
        ("sbatch: error: Socket timed out on send/recv operation", 3, "environment"),
    ],
    ids=["refused", "refused-lowercase", "controller-down", "timeout"],
)
def test_sbatch_failure_is_one_line_by_whose_fault_and_leaves_no_run_dir(
    tmp_path: Path,
    runs_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    said: str,
    status: int,
    whose: str,
) -> None:
    """Slurm refusing the request is the user's mistake (exit 2); Slurm failing is the
    environment's (exit 3). Either way the run directory made for the job is gone again."""
    bin_dir = write(tmp_path / "bin" / "sbatch", f"#!/bin/sh\necho '{said}' >&2\nexit 1\n").parent
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == status, (whose, result.output)
    assert result.output.strip().splitlines() == [f"Error: sbatch failed (exit 1): {said}"]
    assert not runs_root.exists() or not any(runs_root.iterdir())


def test_a_full_disk_is_the_environments_fault(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch, fake_sbatch: Path
) -> None:
    import errno

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("os.fsync", no_space)
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], lines
    assert lines[0].startswith(f"Error: cannot write {runs_root}/")
    assert not any(runs_root.iterdir())  # nothing half-made is left
    assert not fake_sbatch.exists()  # nothing submitted


def test_a_bug_in_hpctf_shows_its_traceback_and_asks_for_a_report(tmp_path: Path) -> None:
    """Not a user mistake: the traceback stays, with a line saying whose it is (exit 70)."""
    code = (
        "import sys\n"
        "import hpctf.login.submitting.submit_commands as commands\n"
        "def broken(*args, **kwargs):\n"
        "    raise RuntimeError('an internal bug')\n"
        "commands.load_config = broken\n"
        f"sys.argv = ['hpctf', 'validate', {str(DIGITS)!r}]\n"
        "from hpctf.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 70, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError: an internal bug" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("hpctf: the error above is a bug")


def test_status_of_a_non_run_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["status", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a run directory" in result.output


LOGIN_COMMANDS = [
    ["validate", str(DIGITS), "--site", "local-slurm"],
    ["render", str(DIGITS), "--site", "ib-8gpu", "--explain"],
    ["submit", str(DIGITS), "--site", "local-slurm", "--dry-run"],
    ["schema", "site"],
    ["sites"],
    ["sites", "ib-suffix"],
]


@pytest.mark.parametrize("args", LOGIN_COMMANDS, ids=[" ".join(a[:2]) for a in LOGIN_COMMANDS])
def test_login_commands_never_import_tensorflow(
    args: list[str], runs_root: Path, fake_sbatch: Path, tmp_path: Path
) -> None:
    code = (
        "import sys\n"
        "from hpctf.cli import cli\n"
        f"try:\n    cli({args!r})\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
        "print('NO_TF')\n"
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HPCTF_RUNS_ROOT": str(runs_root)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert "NO_TF" in proc.stdout, proc.stderr


def test_a_compute_node_command_imports_no_login_wing() -> None:
    """`hpctf worker` on every task loads only the compute wing's commands (hpctf.cli.COMPUTE);
    `hpctf status` only its own (hpctf.cli.ALONE: no jinja2, no pydantic, read from a cold
    page cache for every status); the login wing (jinja2, sweeps, doctor) and the batch hooks
    come with any other command."""
    code = (
        "import sys\n"
        "from hpctf.cli import cli\n"
        "def loaded():\n"
        "    return sorted({m.split('.')[1] for m in sys.modules if m.startswith('hpctf.')}\n"
        "                  & {'login', 'batch', 'compute'}), 'jinja2' in sys.modules\n"
        "for args in (['worker', '--help'], ['tfconfig', '--help'], ['status', '--help'],\n"
        "             ['submit', '--help']):\n"
        "    try:\n        cli(args)\n"
        "    except SystemExit as exc:\n        assert not exc.code, exc.code\n"
        "    print(args[0], *loaded())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    said = [line for line in proc.stdout.splitlines() if not line.startswith(("Usage", " "))]
    names = ("worker", "tfconfig", "status", "submit")
    assert [line for line in said if line.split(" ")[0] in names] == [
        "worker ['compute'] False",
        "tfconfig ['compute'] False",
        "status ['compute', 'login'] False",  # compute: the worker's, loaded before
        "submit ['batch', 'compute', 'login'] True",
    ], proc.stdout
    status = (
        "import sys\nfrom hpctf.cli import cli\n"
        "try:\n    cli(['status', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('pydantic' in sys.modules, 'yaml' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", status], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout.splitlines()[-1] == "False False", proc.stdout


def test_init_writes_an_experiment_that_validates(tmp_path: Path, runs_root: Path) -> None:
    target = tmp_path / "My Project!"
    result = CliRunner().invoke(cli, ["init", str(target), "--site", "ib-8gpu"])
    assert result.exit_code == 0, result.output
    experiment = target / "experiment.yaml"
    assert (target / "train.py").is_file()
    text = experiment.read_text()
    assert "name: My-Project" in text and "site: ib-8gpu" in text
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 15  # commented
    env = {"HOME": str(tmp_path)}
    validated = CliRunner().invoke(cli, ["validate", str(experiment)], env=env)
    assert validated.exit_code == 0, validated.output
    assert "on site ib-8gpu: 2 node(s) x 1 task(s), 8 GPU(s) per node" in validated.output
    again = CliRunner().invoke(cli, ["init", str(target)])
    assert again.exit_code == 2 and "--force" in again.output
    assert CliRunner().invoke(cli, ["init", str(target), "--force"]).exit_code == 0


def test_init_refuses_an_unknown_site_and_a_bad_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "x"), "--site", "nowhere"])
    assert result.exit_code == 2 and "unknown site 'nowhere'" in result.output
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "y"), "--name", "a b"])
    assert result.exit_code == 2 and "--name 'a b'" in result.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_validate_writes_nothing_and_says_what_it_checked(
    runs_root: Path, fake_sbatch: Path
) -> None:
    # 4 nodes: the global batch of 64 splits over them (3 would not: validate says so).
    result = CliRunner().invoke(cli, ["validate", str(DIGITS), "--set", "resources.nodes=4"])
    assert result.exit_code == 0, result.output
    assert "ok: " in result.output and "on site local: 4 node(s) x 1 task(s)" in result.output
    assert not runs_root.exists() and not fake_sbatch.exists()


@pytest.mark.parametrize("kind", ["experiment", "site"])
def test_schema_is_json_schema_for_editors(kind: str) -> None:
    result = CliRunner().invoke(cli, ["schema", kind])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["additionalProperties"] is False
    if kind == "experiment":
        assert schema["required"] == ["name", "train"]
        resources = schema["$defs"]["Resources"]["properties"]
        assert {"mem", "account", "qos", "constraint", "reservation", "exclusive"} <= set(resources)
        assert {"mail_type", "mail_user", "dependency", "extra_sbatch"} <= set(resources)
    else:
        assert {"extends", "modules", "env", "setup", "venv", "python", "template"} <= set(
            schema["properties"]
        )
        assert "RAW SHELL" in schema["properties"]["setup"]["description"]


def _render(*args: str) -> str:
    result = CliRunner().invoke(cli, ["render", str(DIGITS), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_set_is_typed_by_the_schema(runs_root: Path) -> None:
    script = _render(
        "--site",
        "local-slurm",
        "--set",
        "resources.time=10:00",  # YAML 1.1 would make this the integer 600
        "--set",
        "env.FLAG=yes",  # a string key keeps the text: not True, not "1"
        "--set",
        "env.ZERO=007",
        "--set",
        "resources.exclusive=user",
        "--set",
        "resources.extra_sbatch=[--hold, --nice 5]",
    )
    assert "#SBATCH --time=10:00\n" in script
    assert "export FLAG='yes'\n" in script and "export ZERO='007'\n" in script
    assert "#SBATCH --exclusive=user\n" in script
    assert "#SBATCH --hold\n#SBATCH --nice=5\n" in script


def test_precedence_set_over_experiment_over_site_over_defaults(
    tmp_path: Path, runs_root: Path
) -> None:
    sites = tmp_path / "sites"
    write(
        sites / "mine.yaml",
        "name: mine\nextends: ib-suffix\naccount: proj-1\nqos: long\nmem: 100G\n",
    )
    experiment = write(
        tmp_path / "e.yaml", experiment_text(resources__qos="short", resources__mem="50G")
    )
    result = CliRunner().invoke(
        cli,
        ["render", str(experiment), "--site", "mine", "--set", "resources.mem=10G", "--explain"],
        env={"HPCTF_SITE_PATH": str(sites)},
    )
    assert result.exit_code == 0, result.output
    lines = {
        line.split()[1].split("=")[0]: line
        for line in result.output.splitlines()
        if line.startswith("#SBATCH")
    }
    mine, shipped = sites / "mine.yaml", REPO / "site_configs" / "ib-suffix.yaml"
    assert lines["--mem"].endswith("# <- --set resources.mem=10G")
    assert "--mem=10G " in lines["--mem"]
    assert lines["--qos"].endswith(
        f"# <- experiment {experiment}:{_line(experiment, 'qos:')} (resources.qos)"
    )
    assert lines["--account"].endswith(f"# <- site {mine}:3 (account)")
    assert lines["--constraint"].endswith(
        f"# <- site {shipped}:{_line(shipped, 'constraint:')} (constraint)"
    )
    assert lines["--gres"].startswith("#SBATCH --gres=gpu:4 ")
    assert lines["--time"].startswith("#SBATCH --time=00:15:00 ")  # the experiment's, not 12:00
    # None set: one job per run at a time (Slurm's singleton, the job name being the run's).
    assert lines["--dependency"].startswith("#SBATCH --dependency=singleton ")


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_explain_notes_defaults_env_modules_and_setup(tmp_path: Path, runs_root: Path) -> None:
    experiment = write(
        tmp_path / "e.yaml",
        experiment_text(
            env={"MINE": "1"},
            setup=["echo from the experiment", "export MINE=2"],
            resources__time=DELETE,
        ),
    )
    result = CliRunner().invoke(
        cli,
        ["render", str(experiment), "--site", "ib-8gpu", "--explain"],
        env={"HOME": "/home/u"},
    )
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    site = REPO / "site_configs" / "ib-8gpu.yaml"
    note = {
        line.split("# <- ")[0].strip(): line.split("# <- ")[1] for line in out if "# <- " in line
    }
    assert note["#SBATCH --time=04:00:00"] == f"site {site}:{_line(site, 'time:')} (time)"
    assert (
        note["module load 'cuda/12.4' || exit 1"]
        == f"site {site}:{_line(site, 'cuda/12.4')} (modules.0)"
    )
    assert (
        note["export MINE='1'"] == f"experiment {experiment}:{_line(experiment, 'MINE')} (env.MINE)"
    )
    assert note["PYTHON='/home/u/venvs/hpctf/bin/python'"].startswith(f"site {site}:")
    setup = out.index("echo from the experiment")
    assert out[setup - 1].startswith(f"# setup line(s) below <- experiment {experiment}:")
    assert "export MINE=2" in out  # raw shell gets no trailing note, even where it looks known
    ulimit = next(i for i, line in enumerate(out) if line.startswith("ulimit"))
    assert out[ulimit - 1].startswith(f"# setup line(s) below <- site {site}:")
    # The notes are comments: the explained script is still a valid script.
    script = write(tmp_path / "explained.sh", result.output)
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_resubmit_refuses_a_complete_run_and_a_run_with_a_live_job(
    tmp_path: Path, runs_root: Path, fake_sbatch: Path
) -> None:
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (run_dir,) = runs_root.iterdir()
    scontrol = fake_sbatch.parent / "fakebin" / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'JobId=4242 JobName=digits JobState=RUNNING Restarts=0'\n")
    scontrol.chmod(0o755)
    live = CliRunner().invoke(cli, ["resubmit", str(run_dir)])
    assert live.exit_code == 2
    assert f"job 4242 of {run_dir} is still RUNNING; wait for it, or stop it with" in live.output

    scontrol.write_text("#!/bin/sh\necho 'JobId=4242 JobName=digits JobState=CANCELLED'\n")
    assert CliRunner().invoke(cli, ["resubmit", str(run_dir)]).exit_code == 0
    assert fake_sbatch.read_text().count("--parsable") == 2

    (run_dir / "DONE").write_text("{}\n")
    done = CliRunner().invoke(cli, ["resubmit", str(run_dir)])
    assert done.exit_code == 2 and "is complete" in done.output
    assert fake_sbatch.read_text().count("--parsable") == 2


def test_submits_of_one_experiment_at_once_get_their_own_run_directories(
    tmp_path: Path, runs_root: Path, fake_sbatch: Path
) -> None:
    """Started in the same second they plan the same name: the losers take the next one."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "hpctf", "submit", str(DIGITS), "--site", "local-slurm"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outputs
    run_dirs = {run_dir_from(out) for out, _ in outputs}
    assert len(run_dirs) == 4 and set(runs_root.iterdir()) == run_dirs
    for run_dir in run_dirs:
        assert f"RUN_DIR='{run_dir}'" in (run_dir / "job.sbatch").read_text()
        assert json.loads((run_dir / "config.json").read_text())["experiment"]["name"] == "digits"


def test_init_fit_writes_a_fit_script_experiment_that_validates(
    tmp_path: Path, runs_root: Path
) -> None:
    target = tmp_path / "fitted"
    result = CliRunner().invoke(cli, ["init", str(target), "--fit"])
    assert result.exit_code == 0, result.output
    experiment, script = target / "experiment.yaml", target / "train.py"
    assert "script: train.py" in experiment.read_text()
    text = script.read_text()
    assert "callbacks=hpctf.keras.callbacks()" in text and "model.fit(" in text
    assert ".repeat()" in text and "steps_per_epoch=" in text  # an input that resumes exactly
    validated = CliRunner().invoke(cli, ["validate", str(experiment)])
    assert validated.exit_code == 0, validated.output
    rendered = CliRunner().invoke(cli, ["render", str(experiment)])
    assert rendered.exit_code == 0, rendered.output


def test_a_job_that_may_share_nodes_with_other_users_is_warned_of(
    tmp_path: Path, runs_root: Path, fake_sbatch: Path
) -> None:
    """On a site whose nodes other users' jobs share, a submit that is not exclusive says, in
    one line, that they reach its TensorFlow ports; exclusive (or user) and a site of whole
    nodes say nothing."""
    site = write(
        tmp_path / "shared.yaml", "name: shared\nextends: local-slurm\nshared_nodes: true\n"
    )
    warned = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", str(site)])
    assert warned.exit_code == 0, warned.output
    (line,) = [x for x in warned.stderr.splitlines() if "share" in x]
    assert line.startswith("warning: on site shared other users' jobs may share this job's nodes")
    assert "resources.exclusive: true" in line
    for args in (["--site", str(site), "--set", "resources.exclusive=user"],
                 ["--site", "local-slurm"]):  # fmt: skip
        quiet = CliRunner().invoke(cli, ["submit", str(DIGITS), *args])
        assert quiet.exit_code == 0 and "share" not in quiet.stderr, quiet.output
