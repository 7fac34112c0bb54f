"""The rendered batch script: valid shell, quoted values, hostile input inert or refused.

Hostile values are proven inert by running the rendered script with bash, with srun, module,
the venv's activate script and its python replaced by recorders: what the job receives is
compared with what the config said, byte for byte.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctf.cli import cli
from hpctf.core.errors import UserError
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.sbatch_options import MANAGED as MANAGED_OPTIONS
from hpctf.core.settings.sbatch_options import normalize_sbatch_option
from hpctf.login.templating import ENVIRONMENT, sbatch_value, shell_quote
from tests.conftest import DIGITS, ENTRIES_PATH, require_tool, write

HOSTILE = "$(touch pwned) `touch pwned2` 'single' \"double\" * ; -rf & | > out ${HOME} \\ !x ~"
# No $ here: $ in a path is refused (only $NAME expands in site paths), tested below.
HOSTILE_DIR = "v 'q' \"d\" * `touch pwned3` ; & [x] -rf"


def experiment_file(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(DIGITS.read_text())
    data["train"]["python_path"] = [str(DIGITS.parent)]
    data.update(changes)
    return write(tmp_path / "exp" / "experiment.yaml", yaml.safe_dump(data))


def render_to(tmp_path: Path, *args: str, **experiment_changes: object) -> Path:
    out = tmp_path / "job.sbatch"
    experiment = experiment_file(tmp_path, **experiment_changes)
    result = CliRunner().invoke(
        cli, ["render", str(experiment), "--site", "local-slurm", "-o", str(out), *args]
    )
    assert result.exit_code == 0, result.output
    return out


def recorder(path: Path, body: str) -> None:
    write(path, f"#!/bin/bash\n{body}\n").chmod(0o755)


def nul_list(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def test_hostile_values_reach_the_job_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Site env, experiment env, --set env, args, venv path and runs_root, all hostile."""
    venv = tmp_path / HOSTILE_DIR
    record = tmp_path / "record"
    record.mkdir()
    recorder(venv / "bin" / "python", 'printf "%s\\0" "$@" > "$RECORD/python.$3"')
    write(venv / "bin" / "activate", 'printf "%s" "$VIRTUAL_ENV_MARK" > "$RECORD/activated"\n')
    runs = tmp_path / "runs*[x]"  # glob characters are fine for sbatch and inert in the script
    sites = tmp_path / "sites"
    site = {
        "name": "hostile",
        "scheduler": "slurm",
        "runs_root": str(runs),
        "venv": str(venv),
        "modules": ["mod/1.0"],
        "env": {"HOSTILE_SITE": HOSTILE, "DASH": "-n"},
    }
    write(sites / "hostile.yaml", yaml.safe_dump(site))
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    monkeypatch.delenv("HPCTF_RUNS_ROOT", raising=False)
    args = {"text": HOSTILE, "dash": "--help", "list": [HOSTILE, "-x"]}
    data = yaml.safe_load(DIGITS.read_text())
    # An entry that takes **args: any name passes `hpctf validate`'s check of train.args.
    data["train"]["entry"] = "entries:crash_at_start"
    data["train"]["python_path"] = ENTRIES_PATH
    data["train"]["args"] = args
    data["env"] = {"HOSTILE_EXP": HOSTILE}
    experiment = write(tmp_path / "exp" / "experiment.yaml", yaml.safe_dump(data))
    script = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        cli,
        [
            "render",
            str(experiment),
            "--site",
            "hostile",
            "--set",
            f"env.HOSTILE_SET={HOSTILE}",
            "-o",
            str(script),
        ],
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = runs.iterdir()

    bin_dir = tmp_path / "bin"
    recorder(
        # A record per call: the standbys' srun (in the background, ended by the script's exit,
        # maybe before it writes) must not overwrite the workers'.
        bin_dir / "srun",
        'call="$RECORD/srun${1%%=*}"; printf "%s\\0" "$@" > "$call.argv"; env -0 > "$call.env"',
    )
    recorder(bin_dir / "module", 'printf "%s\\0" "$@" >> "$RECORD/module.argv"')
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RECORD": str(record),
        "VIRTUAL_ENV_MARK": "sourced",
        "HOME": str(tmp_path / "home"),
    }
    proc = subprocess.run(
        ["bash", str(script)], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr

    job_env = dict(item.split("=", 1) for item in nul_list(record / "srun--kill-on-bad-exit.env"))
    assert job_env["HOSTILE_SITE"] == HOSTILE
    assert job_env["HOSTILE_EXP"] == HOSTILE
    assert job_env["HOSTILE_SET"] == HOSTILE
    assert job_env["DASH"] == "-n"
    python = str(venv / "bin" / "python")
    argv = nul_list(record / "srun--kill-on-bad-exit.argv")
    assert argv[0] == "--kill-on-bad-exit=1"
    assert argv[-4:] == [python, "-m", "hpctf", "worker", str(run_dir)][-4:]
    assert argv[-5] == python
    assert f"--output={run_dir}/logs/rank-%t.log" in argv
    assert nul_list(record / "python.job-start") == ["-m", "hpctf", "job-start", str(run_dir)]
    assert nul_list(record / "python.job-end")[:4] == ["-m", "hpctf", "job-end", str(run_dir)]
    assert nul_list(record / "module.argv") == ["load", "mod/1.0"]
    assert (record / "activated").read_text() == "sourced"
    # What the worker reads on every task: the run's frozen config, args exactly as given.
    assert RunDir(run_dir).load_config().experiment.train.args == args
    assert list(workdir.iterdir()) == []  # no redirect target, no touched files
    assert not list(tmp_path.rglob("pwned*"))


@pytest.mark.parametrize(
    ("changes", "args", "expected"),
    [
        ({"name": "$(touch pwned)"}, [], "name: '$(touch pwned)' is not a name"),
        ({"name": "-rf"}, [], "name: '-rf' is not a name"),
        ({"env": {"X": "a\nb"}}, [], "the value of X holds a newline"),
        ({"env": {"$(x)": "1"}}, [], "is not an environment variable name"),
        ({}, ["--set", "resources.partition=debug --nodes=9"], "resources.partition"),
        ({}, ["--set", "resources.account=`id`"], "resources.account"),
        ({}, ["--set", "resources.extra_sbatch=[--comment=$(id)]"], "no spaces, quotes, $"),
        ({}, ["--set", "resources.mail_user=-f"], "resources.mail_user"),
        ({}, ["--set", "name=a\nb"], "name: 'a\\nb' is not a name"),
        ({"env": {"A\n": "1"}}, [], "is not an environment variable name"),
        ({}, ["--set", "resources.partition=debug\n"], "resources.partition: 'debug\\n'"),
        ({}, ["--set", "resources.time=5 "], "resources.time: '5 ' is not a Slurm time"),
    ],
    ids=[
        "name substitution",
        "name leading dash",
        "env newline",
        "env name",
        "partition injection",
        "account backticks",
        "extra_sbatch substitution",
        "mail_user dash",
        "--set newline",
        "env name trailing newline",
        "partition trailing newline",
        "time trailing space",
    ],
)
def test_hostile_values_that_cannot_be_literal_are_refused(
    tmp_path: Path,
    runs_root: Path,
    changes: dict[str, object],
    args: list[str],
    expected: str,
) -> None:
    experiment = experiment_file(tmp_path, **changes)
    result = CliRunner().invoke(cli, ["render", str(experiment), "--site", "local-slurm", *args])
    assert result.exit_code == 2
    assert expected in result.output
    assert not runs_root.exists()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("venv", "/opt/$(touch pwned)/venv", "only $NAME and ${NAME} expand here"),
        ("python", "/opt/py\nthon", "is not a path"),
        ("python", "-c", "is not a path"),
        ("runs_root", "/scratch/my runs", "cannot go into an #SBATCH line"),
    ],
)
def test_hostile_site_paths_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str, expected: str
) -> None:
    site = {"name": "s", "scheduler": "slurm", "runs_root": str(tmp_path / "runs"), key: value}
    write(tmp_path / "sites" / "s.yaml", yaml.safe_dump(site))
    monkeypatch.setenv("HPCTF_SITE_PATH", str(tmp_path / "sites"))
    monkeypatch.delenv("HPCTF_RUNS_ROOT", raising=False)
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        cli, ["render", str(experiment_file(tmp_path)), "--site", "s", "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_script_is_valid_bash_and_passes_shellcheck(tmp_path: Path, runs_root: Path) -> None:
    script = render_to(
        tmp_path,
        "--set",
        "resources.extra_sbatch=[--hold]",
        env={"HOSTILE": HOSTILE, "NCCL_DEBUG": "INFO"},
        setup=['echo "setup on $(hostname)"', "ulimit -n 4096"],
    )
    subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = require_tool("shellcheck")
    proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


# --- the template environment -------------------------------------------------------------


def test_environment_is_strict_and_refuses_unfiltered_values() -> None:
    with pytest.raises(jinja2.UndefinedError):
        ENVIRONMENT.from_string("{{ missing | sh }}").render()
    assert ENVIRONMENT.from_string("{{ v | sh }}").render(v="a b") == "'a b'"
    assert ENVIRONMENT.from_string("{{ n }}").render(n=3) == "3"
    with pytest.raises(UserError, match="without the sh, sbatch_value or env_name filter"):
        ENVIRONMENT.from_string("echo {{ v }}").render(v="$(id)")
    with pytest.raises(UserError, match="without the sh"):
        ENVIRONMENT.from_string("echo {{ v ~ '' }}").render(v="x")  # no laundering by concat


@pytest.mark.parametrize("bad", ["a b", "a\nb", "a'b", 'a"b', "$(x)", "`x`", "a#b", "a\\b", ""])
def test_sbatch_value_refuses_what_sbatch_would_split_or_interpret(bad: str) -> None:
    with pytest.raises(UserError, match="cannot go into an #SBATCH line"):
        sbatch_value(bad)


# What a UTF-8 config file can hold, less the line breaks and NUL that sh refuses.
_TEXT = st.characters(exclude_characters="\n\r\0", exclude_categories=("Cs",))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(_TEXT, max_size=30), min_size=1))
def test_sh_quoting_round_trips_through_bash(values: list[str]) -> None:
    lines = [f"v={shell_quote(v)}; printf '%s\\0' \"$v\"" for v in values]
    proc = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, check=True, env={})
    assert proc.stdout.decode("utf-8").split("\0")[:-1] == values


def test_sh_refuses_newlines() -> None:
    with pytest.raises(UserError, match="newline"):
        shell_quote("a\nb")


# --- extra_sbatch in every spelling ---------------------------------------------------------

_SHORT = {"J", "N", "n", "c", "t", "p", "A", "q", "C", "d", "G", "o", "e", "a", "D"}
REFUSED = sorted(
    {f"--{name}=1" for name in MANAGED_OPTIONS}
    | {f"--{name} 1" for name in MANAGED_OPTIONS}
    | {f"--{name[:-1]}=1" for name in MANAGED_OPTIONS}  # getopt_long takes abbreviations
    | {f"-{letter}1" for letter in _SHORT}
    | {f"-{letter} 1" for letter in _SHORT}
    | {"-W", "--exclusive", "--nodes", "-vN2", "-Hx", "--hold --nodes=2", "--a b c", "hold"}
)


@pytest.mark.parametrize("item", REFUSED)
def test_extra_sbatch_refuses_managed_options_in_every_spelling(item: str) -> None:
    with pytest.raises(ValueError):  # the messages are checked in test_cli
        normalize_sbatch_option(item)


@pytest.mark.parametrize(
    ("item", "token"),
    [
        ("--gres-flags=enforce-binding", "--gres-flags=enforce-binding"),
        ("--gres-flags enforce-binding", "--gres-flags=enforce-binding"),
        ("--hold", "--hold"),
        ("-H", "-H"),
        ("-x node[1-2]", "-xnode[1-2]"),
        ("-wnode3", "-wnode3"),
        ("--nice=-5", "--nice=-5"),
        ("--begin=now+1hour", "--begin=now+1hour"),
        ("--time-min=30", "--time-min=30"),  # not a prefix of --time: a real option
        ("--propagate=STACK", "--propagate=STACK"),
    ],
)
def test_extra_sbatch_accepts_the_rest_as_one_token(item: str, token: str) -> None:
    assert normalize_sbatch_option(item) == token


# --- site templates -----------------------------------------------------------------------


def _site_with_template(tmp_path: Path, template: str) -> Path:
    sites = tmp_path / "sites"
    write(sites / "t.sh.j2", template)
    write(sites / "tpl.yaml", "name: tpl\nextends: local-slurm\ntemplate: t.sh.j2\n")
    return sites


def test_a_site_template_overrides_blocks_of_the_base(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = _site_with_template(
        tmp_path,
        '{% extends "sbatch.sh.j2" %}\n'
        "{% block setup %}\n"
        "{{ super() }}\n"
        "# site-specific: stage the data set to node-local disk\n"
        "export STAGED_FOR={{ name | sh }}\n"
        "{% endblock %}\n",
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    result = CliRunner().invoke(cli, ["render", str(experiment_file(tmp_path)), "--site", "tpl"])
    assert result.exit_code == 0, result.output
    assert "export STAGED_FOR='digits'\n" in result.output
    assert "srun --kill-on-bad-exit=1" in result.output  # the base's launch block is kept
    script = write(tmp_path / "s.sh", result.output)
    subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run([require_tool("shellcheck"), str(script)], check=True, capture_output=True)


def test_a_site_template_cannot_write_unquoted_values(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = _site_with_template(
        tmp_path, '{% extends "sbatch.sh.j2" %}{% block setup %}echo {{ name }}{% endblock %}'
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    result = CliRunner().invoke(cli, ["render", str(experiment_file(tmp_path)), "--site", "tpl"])
    assert result.exit_code == 2
    assert "'digits' reached the script without the sh, sbatch_value or env_name filter" in (
        result.output
    )


@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_site_templates_walk_into_python_is_refused_in_one_line(
    command: str, tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Site files are data: the payload that ran a shell command at `hpctf validate` (Jinja's
    globals reached through an attribute walk) meets the sandbox, one line, exit 2."""
    planted = tmp_path / "PWNED"
    sites = _site_with_template(
        tmp_path,
        '{% extends "sbatch.sh.j2" %}{% block setup %}'
        f"{{{{ cycler.__init__.__globals__.os.popen('touch {planted}').read() | sh }}}}"
        "{% endblock %}",
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    result = CliRunner().invoke(cli, [command, str(experiment_file(tmp_path)), "--site", "tpl"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert line.startswith("Error: template ") and "unsafe" in line, line
    assert not planted.exists()


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


# Every resource key a site can give a default for, with that default; and for the keys that
# may be null, the #SBATCH token the default renders as.
SITE_DEFAULTS: dict[str, tuple[object, str | None]] = {
    "partition": ("gpu", "--partition=gpu"),
    "account": ("proj1", "--account=proj1"),
    "qos": ("high", "--qos=high"),
    "constraint": ("a100", "--constraint=a100"),
    "reservation": ("maint", "--reservation=maint"),
    "gpus_per_node": (2, "--gpus-per-node=2"),
    "mem": ("64G", "--mem=64G"),
    "mail_user": ("me@example.org", "--mail-user=me@example.org"),
    "tasks_per_node": (2, None),
    "cpus_per_task": (4, None),
    "time": ("02:00:00", None),
    "exclusive": (True, None),
    "mail_type": ("END", None),
}


def test_site_defaults_cover_every_site_resource_key() -> None:
    from hpctf.core.settings.config import SITE_RESOURCE_KEYS

    assert set(SITE_DEFAULTS) == set(SITE_RESOURCE_KEYS) - {"extra_sbatch"}


@pytest.mark.parametrize("key", sorted(SITE_DEFAULTS))
def test_null_drops_the_site_default_everywhere(tmp_path: Path, key: str) -> None:
    """`--set resources.KEY=null` removes the site's default from the script, and --explain
    says so (it drifted once: the partition came back from the site, labelled as the --set)."""
    sites = tmp_path / "sites"
    site = {"name": "full", "scheduler": "slurm", "runs_root": str(tmp_path / "runs")}
    site |= {k: v for k, (v, _) in SITE_DEFAULTS.items()}
    write(sites / "full.yaml", yaml.safe_dump(site))
    env = {"HPCTF_SITE_PATH": str(sites), "HOME": str(tmp_path)}
    args = ["render", str(DIGITS), "--site", "full"]
    default, token = SITE_DEFAULTS[key]
    with_default = CliRunner().invoke(cli, args, env=env)
    assert with_default.exit_code == 0, with_default.output
    dropped = CliRunner().invoke(
        cli, [*args, "--set", f"resources.{key}=null", "--explain"], env=env
    )
    if token is None:  # not nullable: refused in one line, naming the key
        assert dropped.exit_code == 2, dropped.output
        assert f"resources.{key}" in dropped.output and "Traceback" not in dropped.output
        return
    assert dropped.exit_code == 0, dropped.output
    assert f"#SBATCH {token}\n" in with_default.output
    assert f"#SBATCH {token}" not in dropped.output
    flag = token.split("=")[0]
    note = next(line for line in dropped.output.splitlines() if line.startswith(f"# {flag}: none"))
    assert f"<- --set resources.{key}=null" in note and f"dropping site full's {default!r}" in note
