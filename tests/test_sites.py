"""Site files: search order, extends, listing, and bad site files refused with file and line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.settings.config import Site
from hpctf.core.settings.sites import available, find_site, listing, read_site, search_path
from hpctf.login.resolving.loader import load_config
from tests.conftest import DIGITS, REPO, other_user, write

SHIPPED = REPO / "site_configs"
MINIMAL = "scheduler: slurm\nruns_root: /scratch/runs\n"


def experiment(tmp_path: Path, **top: object) -> Path:
    data = yaml.safe_load(DIGITS.read_text())
    data["train"]["python_path"] = [str(DIGITS.parent)]
    data.update(top)
    return write(tmp_path / "exp" / "experiment.yaml", yaml.safe_dump(data))


# --- search path ---------------------------------------------------------------------------


def test_search_order_first_match_wins(tmp_path: Path) -> None:
    first, second, home = tmp_path / "a", tmp_path / "b", tmp_path / "home"
    write(first / "local.yaml", "name: local\n" + MINIMAL)
    write(second / "local.yaml", "name: local\n" + MINIMAL)
    write(second / "only-b.yaml", "name: only-b\n" + MINIMAL)
    write(home / ".config" / "hpctf" / "sites" / "mine.yaml", "name: mine\n" + MINIMAL)
    env = {"HPCTF_SITE_PATH": f"{first}:{second}", "HOME": str(home)}
    assert search_path(env) == [first, second, home / ".config/hpctf/sites", SHIPPED]
    assert find_site("local", env) == first / "local.yaml"  # shadows the shipped one
    assert find_site("only-b", env) == second / "only-b.yaml"
    assert find_site("mine", env) == home / ".config/hpctf/sites/mine.yaml"
    assert find_site("ib-8gpu", env) == SHIPPED / "ib-8gpu.yaml"
    entries = {e.name: e for e in listing(env)}
    assert entries["local"].shadowed == [second / "local.yaml", SHIPPED / "local.yaml"]
    assert {"local", "local-slurm", "ib-8gpu", "ib-suffix", "mine", "only-b"} <= set(entries)


def test_shipped_sites_are_listed_with_descriptions(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["sites"], env={"HOME": str(tmp_path), "HPCTF_SITE_PATH": ""})
    assert result.exit_code == 0, result.output
    for name in ("local", "local-slurm", "ib-8gpu", "ib-suffix"):
        assert f"{SHIPPED / name}.yaml" in result.output
    assert "8 GPUs per node, NCCL over mlx5 HCAs" in result.output
    assert "search path: " in result.output


def test_listing_survives_a_broken_site_file(tmp_path: Path) -> None:
    write(tmp_path / "sites" / "broken.yaml", "name: [\n")
    result = CliRunner().invoke(
        cli, ["sites"], env={"HPCTF_SITE_PATH": str(tmp_path / "sites"), "HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    # The name column is as wide as the longest site name (a shipped one).
    assert re.search(r"^broken +\(does not load: ", result.output, re.M), result.output
    assert "invalid YAML" in result.output
    assert "ib-suffix" in result.output


# (name, bytes put into a site file's description, what its one-line message must contain).
UNREADABLE_SITE_BYTES = [
    ("NUL", b"\x00", ":2: invalid YAML: unprintable character U+0000 at column 17"),
    ("BEL", b"\x07", ":2: invalid YAML: unprintable character U+0007 at column 17"),
    ("invalid UTF-8", b"\xff", ":2: not UTF-8 text: byte 0xff at column 17"),
    ("Latin-1", b"\xe9", ":2: not UTF-8 text: byte 0xe9 at column 17"),
]


def _unreadable_site(sites: Path, bad: bytes) -> Path:
    sites.mkdir(parents=True)
    path = sites / "bad.yaml"
    path.write_bytes(b"name: bad\ndescription: my " + bad + b"site\n" + MINIMAL.encode())
    return path


@pytest.mark.parametrize(
    ("bad", "expected"),
    [c[1:] for c in UNREADABLE_SITE_BYTES],
    ids=[c[0] for c in UNREADABLE_SITE_BYTES],
)
@pytest.mark.parametrize("command", ["validate", "render", "sites"])
def test_a_site_file_with_control_characters_or_bad_bytes_exits_2_naming_it(
    tmp_path: Path, runs_root: Path, command: str, bad: bytes, expected: str
) -> None:
    site = _unreadable_site(tmp_path / "sites", bad)
    env = {"HPCTF_SITE_PATH": str(site.parent), "HOME": str(tmp_path)}
    if command == "sites":
        args = ["sites", "bad"]
    else:
        args = [command, str(experiment(tmp_path)), "--site", "bad"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: {site}{expected}"), lines[0]
    assert "Traceback" not in result.output
    assert not runs_root.exists()


@pytest.mark.parametrize("bad", [c[1] for c in UNREADABLE_SITE_BYTES])
def test_listing_says_why_a_site_file_with_bad_bytes_does_not_load(
    tmp_path: Path, bad: bytes
) -> None:
    site = _unreadable_site(tmp_path / "sites", bad)
    result = CliRunner().invoke(
        cli, ["sites"], env={"HPCTF_SITE_PATH": str(site.parent), "HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert re.search(rf"^bad +\(does not load: {re.escape(str(site))}:2: ", result.output, re.M)
    assert "ib-suffix" in result.output


def test_a_site_given_as_a_path(tmp_path: Path) -> None:
    path = write(tmp_path / "elsewhere" / "x.yaml", "name: x\n" + MINIMAL)
    site, _ = read_site(str(path), {})
    assert site.name == "x"


def test_unknown_site_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"unknown site 'nope'; available: .*ib-8gpu"):
        find_site("nope", {"HOME": str(tmp_path)})


# --- extends -------------------------------------------------------------------------------


def test_extends_merges_mappings_and_replaces_the_rest(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    write(
        sites / "mine.yaml",
        "name: mine\n"
        "extends: ib-8gpu\n"
        "account: proj-42\n"
        "modules: [cuda/12.6]\n"
        "env:\n"
        "  NCCL_DEBUG: INFO\n",
    )
    env = {"HPCTF_SITE_PATH": str(sites), "HOME": str(tmp_path)}
    site, origins = read_site("mine", env)
    parent = yaml.safe_load((SHIPPED / "ib-8gpu.yaml").read_text())
    assert site.name == "mine" and site.description == ""  # never inherited
    assert site.account == "proj-42"
    assert site.partition == parent["partition"] == "gpu"
    assert site.modules == ["cuda/12.6"]  # lists are replaced
    assert site.env["NCCL_DEBUG"] == "INFO"  # mappings merge key by key
    assert site.env["NCCL_SOCKET_IFNAME"] == parent["env"]["NCCL_SOCKET_IFNAME"]
    mine = str(sites / "mine.yaml")
    assert (origins[("account",)].file, origins[("account",)].line) == (mine, 3)
    assert origins[("env", "NCCL_DEBUG")].file == mine
    assert origins[("env", "NCCL_SOCKET_IFNAME")].file == str(SHIPPED / "ib-8gpu.yaml")
    assert origins[("modules", "0")].file == mine
    assert ("modules", "2") not in origins  # the parent's list is gone, and its origins


def test_a_site_may_extend_the_site_it_shadows(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    write(sites / "local-slurm.yaml", "name: local-slurm\nextends: local-slurm\npartition: big\n")
    site, _ = read_site("local-slurm", {"HPCTF_SITE_PATH": str(sites), "HOME": str(tmp_path)})
    assert site.partition == "big"
    assert site.scheduler == "slurm" and site.port_range == (21000, 29000)


def test_extends_by_relative_path_and_template_relative_to_its_file(tmp_path: Path) -> None:
    write(tmp_path / "base" / "base.yaml", "name: base\ntemplate: t.sh.j2\n" + MINIMAL)
    child = write(tmp_path / "child" / "child.yaml", "name: child\nextends: ../base/base.yaml\n")
    site, _ = read_site(str(child), {})
    assert site.template == str(tmp_path / "base" / "t.sh.j2")


def test_runs_root_from_the_environment_is_explained(tmp_path: Path) -> None:
    loaded = load_config(
        experiment(tmp_path), "local-slurm", (), {"HPCTF_RUNS_ROOT": "/r", "HOME": "/h"}
    )
    assert loaded.config.site.runs_root == "/r"
    assert str(loaded.origins[("runs_root",)]) == "environment HPCTF_RUNS_ROOT (runs_root)"


def test_sites_name_prints_the_resolved_site_with_origins(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    write(sites / "mine.yaml", "name: mine\nextends: ib-suffix\nqos: long\n")
    result = CliRunner().invoke(
        cli, ["sites", "mine"], env={"HPCTF_SITE_PATH": str(sites), "HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f'qos: "long"  # <- site {sites / "mine.yaml"}:3 (qos)' in lines
    assert f'hostname_template: "{{host}}-ib"  # <- site {SHIPPED / "ib-suffix.yaml"}:' in (
        result.output
    )
    assert 'extends: "ib-suffix"' in result.output
    parsed = yaml.safe_load(result.output)  # still YAML: the notes are comments
    assert Site.model_validate(parsed).qos == "long"


def test_every_shipped_site_is_valid_and_documented() -> None:
    for path in sorted(SHIPPED.glob("*.yaml")):
        site, _ = read_site(str(path), {"HOME": "/home/user"})
        assert site.name == path.stem
        assert site.description
        text = path.read_text()
        assert text.startswith("#"), f"{path} starts without a comment"
        if site.setup:
            assert "RAW SHELL" in text  # the one place shell is accepted says so
    assert set(available({"HOME": "/nonexistent"})) >= {"local", "local-slurm", "ib-8gpu"}


# --- bad site files ------------------------------------------------------------------------

# (name, {file: text} written to a site directory, what the one-line message must contain
#  (" ... " separates parts), which site file it must name first). The experiment uses
#  --site bad.
BAD_SITES: list[tuple[str, dict[str, str], str, str]] = [
    (
        "unknown key",
        {"bad": "name: bad\npartitoin: gpu\n" + MINIMAL},
        ":2: partitoin: unknown key (did you mean 'partition'?)",
        "bad",
    ),
    (
        "wrong type",
        {"bad": "name: bad\ngpus_per_node: many\n" + MINIMAL},
        ":2: gpus_per_node",
        "bad",
    ),
    (
        "misspelt scheduler",
        {"bad": "name: bad\nscheduler: slurmm\nruns_root: /r\n"},
        ":2: scheduler: Input should be 'slurm' or 'local' (did you mean 'slurm'?)",
        "bad",
    ),
    ("missing scheduler", {"bad": "name: bad\nruns_root: /r\n"}, "scheduler: required", "bad"),
    (
        "bad ports",
        {"bad": "name: bad\nport_range: [30000, 20000]\n" + MINIMAL},
        "port_range",
        "bad",
    ),
    (
        "python and venv",
        {"bad": "name: bad\npython: /usr/bin/python3\nvenv: /v\n" + MINIMAL},
        "give at most one of python and venv",
        "bad",
    ),
    (
        "module with a leading dash",
        {"bad": "name: bad\nmodules: [-f]\n" + MINIMAL},
        "modules.0",
        "bad",
    ),
    (
        "env value with a newline",
        {"bad": 'name: bad\nenv: {X: "a\\nb"}\n' + MINIMAL},
        ":2: env: the value of X holds a newline",
        "bad",
    ),
    (
        "extra_sbatch overriding --time",
        {"bad": "name: bad\nextra_sbatch: ['-t 5']\n" + MINIMAL},
        ":2: extra_sbatch.0: '-t 5' is --time",
        "bad",
    ),
    (
        "runs_root naming an unset variable",
        {"bad": "name: bad\nscheduler: slurm\nruns_root: $NOPE_UNSET/runs\n"},
        ":3: runs_root: '$NOPE_UNSET/runs' names the unset variable $NOPE_UNSET",
        "bad",
    ),
    (
        "runs_root with command substitution",
        {"bad": "name: bad\nscheduler: slurm\nruns_root: /r/$(touch x)\n"},
        ":3: runs_root: '/r/$(touch x)': only $NAME and ${NAME} expand here",
        "bad",
    ),
    (
        "relative venv",
        {"bad": "name: bad\nvenv: venvs/tf\n" + MINIMAL},
        ":2: venv: 'venvs/tf' must be an absolute path",
        "bad",
    ),
    (
        "extends an unknown site",
        {"bad": "name: bad\nextends: nowhere\n"},
        ":2: extends: unknown site 'nowhere'",
        "bad",
    ),
    (
        "extends cycle",
        {"bad": "name: bad\nextends: bad2\n", "bad2": "name: bad2\nextends: bad\n" + MINIMAL},
        "extends: a cycle: bad.yaml -> bad2.yaml -> bad.yaml",
        "bad2",
    ),
    (
        "a bad key in the parent names the parent",
        {"bad": "name: bad\nextends: base\n", "base": "name: base\n" + MINIMAL + "qos: a b\n"},
        ":4: qos: 'a b' is not a Slurm name",
        "base",
    ),
    (
        "template missing",
        {"bad": "name: bad\ntemplate: nothere.sh.j2\n" + MINIMAL},
        ":2: template: ... /nothere.sh.j2: cannot read",
        "bad",
    ),
    (
        "template not extending the base",
        {"bad": "name: bad\ntemplate: t.sh.j2\n" + MINIMAL, "t.sh.j2": "#!/bin/bash\n"},
        ':2: template: ... /t.sh.j2: a site template must start with {% extends "sbatch.sh.j2" %}',
        "bad",
    ),
    ("yaml syntax", {"bad": "name: bad\nenv: {A: 1\n"}, "invalid YAML", "bad"),
    ("empty file", {"bad": ""}, "the file is empty", "bad"),
    ("name missing", {"bad": MINIMAL}, "name: required key is missing", "bad"),
]


@pytest.mark.parametrize(
    ("files", "expected", "named"), [c[1:] for c in BAD_SITES], ids=[c[0] for c in BAD_SITES]
)
@pytest.mark.parametrize("command", ["validate", "render", "submit"])
def test_bad_site_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path,
    runs_root: Path,
    fake_sbatch: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    files: dict[str, str],
    expected: str,
    named: str,
) -> None:
    sites = tmp_path / "sites"
    for name, text in files.items():
        write(sites / (name if "." in name else f"{name}.yaml"), text)
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    if "runs_root" in expected:
        monkeypatch.delenv("HPCTF_RUNS_ROOT")  # it would replace the site's runs_root
    result = CliRunner().invoke(cli, [command, str(experiment(tmp_path)), "--site", "bad"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    assert all(part in lines[0] for part in expected.split(" ... ")), lines[0]
    assert lines[0].startswith(f"Error: {sites / named}.yaml"), lines[0]
    assert not runs_root.exists()
    assert not fake_sbatch.exists()


@pytest.mark.parametrize(
    "options",
    [
        ["-o", "ProxyCommand=touch {planted}"],
        ["-oLocalCommand touch {planted}", "-o", "PermitLocalCommand=yes"],
        ["-F", "{config}"],
    ],
    ids=["proxycommand", "localcommand", "config-file"],
)
def test_ssh_options_that_run_commands_come_only_from_your_own_site_file(
    options: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Site files are data: a ProxyCommand (or a -F config, which may hold a Match exec) in a
    site file another user owns would run as you at `hpctf status --site X`: refused in one
    line, naming the file and what it would run; the same file of your own is read."""
    owner = other_user()
    planted = tmp_path / "PWNED"
    sites = tmp_path / "sites"
    sites.mkdir()
    given = [o.format(planted=planted, config=tmp_path / "ssh_config") for o in options]
    site = sites / "shared.yaml"
    site.write_text(
        "name: shared\nextends: local-slurm\n"
        f"login: {{host: cluster, ssh_options: {json.dumps(given)}}}\n"
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    mine = CliRunner().invoke(cli, ["sites", "shared"])
    assert mine.exit_code == 0, mine.output
    os.chown(site, owner.pw_uid, owner.pw_gid)
    for command in (["sites", "shared"], ["status", "--site", "shared"]):
        theirs = CliRunner().invoke(cli, command)
        assert theirs.exit_code == 2, theirs.output
        (line,) = theirs.output.splitlines()
        assert f"{site}:3: login.ssh_options" in line and "hpctf-other's" in line, line
    assert not planted.exists()


def test_hpctf_sites_name_shows_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hpctf sites NAME` printed a site's secret env values and its webhook URL."""
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "team.yaml").write_text(
        "name: team\nextends: local-slurm\n"
        "env: {HF_TOKEN: hf-0123456789abcdef, DB_URL: 'postgres://me:pa55word@db/x', N: '4'}\n"
        "notify: {webhook: 'https://hooks.example.org/services/T0/B0/SECRETPART'}\n"
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    result = CliRunner().invoke(cli, ["sites", "team"])
    assert result.exit_code == 0, result.output
    for secret in ("hf-0123456789abcdef", "pa55word", "SECRETPART"):
        assert secret not in result.output, result.output
    assert '  HF_TOKEN: "***"  # <- site ' in result.output
    assert '  N: "4"' in result.output  # the rest as it is
