"""The SSH path's pure parts, without sshd or Slurm: quoting, where a command runs, the code
stream's address, the options a shipped sweep keeps, and waiting on many remote runs."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import ValidationError

from hpctf.cli import _command_named, cli
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.settings.config import Login, Site
from hpctf.login.remote import cluster_side, forward, shipping
from hpctf.login.remote.ssh import remote_command
from hpctf.login.remote.where import remote_login
from hpctf.python_api import remote_run as remote_runs
from hpctf.python_api import run_api
from tests.conftest import DIGITS, other_user
from tests.sshd import HOSTILE


def test_every_word_of_a_remote_command_comes_back_as_it_was() -> None:
    login = Login(host="h", hpctf="~/bin/my hpctf")
    values = [v.format(canary="/tmp/x") for v in HOSTILE]
    words = shlex.split(remote_command(login, ["status", *values]))
    assert words == ["~/bin/my hpctf", "status", *values]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch x", "a b", "a\nb"])
def test_a_login_host_is_one_word_that_ssh_cannot_read_as_an_option(host: str) -> None:
    with pytest.raises(ValidationError):
        Login(host=host)


def _site(host: str) -> Site:
    return Site(name="c", scheduler="slurm", runs_root="/r", login=Login(host=host))


def test_a_site_is_here_on_its_login_host_or_with_hpctf_on_login() -> None:
    far = _site("user@login.example.invalid")
    assert remote_login(far, {"HOME": "/nonexistent"}) == far.login
    assert remote_login(far, {"HPCTF_ON_LOGIN": "1"}) is None
    assert remote_login(_site(f"me@{socket.gethostname()}"), {}) is None
    assert remote_login(Site(name="c", scheduler="slurm", runs_root="/r"), {}) is None


def test_the_code_stream_is_addressed_by_its_content_and_read_back_whole() -> None:
    entries = [("0-src/a.py", 0o444, b"print(1)\n"), ("0-src/pkg/b.py", 0o400, b"x = 2\n")]
    stream = shipping.tar_stream(entries)
    assert shipping.tar_stream(entries) == stream  # no times, no owners: the same bytes
    assert list(cluster_side._members(stream)) == entries
    assert shipping.tree_hash(entries) != shipping.tree_hash(
        [*entries[:1], ("0-src/pkg/b.py", 0o400, b"x = 3\n")]
    )


def test_a_code_stream_with_a_path_outside_is_refused() -> None:
    with pytest.raises(Exception, match="not a plain relative file"):
        list(cluster_side._members(shipping.tar_stream([("../evil.py", 0o444, b"")])))


@pytest.mark.parametrize("stream", [b"not a tar at all" * 100, b"\0" * 10, b""])
def test_a_code_stream_that_is_no_tar_is_one_line(stream: bytes) -> None:
    """A malformed stream into the code store exited 70 (a bug line)."""
    with pytest.raises(UserError, match="_remote-code: not a code stream hpctf sent"):
        list(cluster_side._members(stream))


def test_a_shipped_sweep_keeps_its_options() -> None:
    command = cli.get_command(click.Context(cli), "sweep")
    assert command is not None
    args = ["e.yaml", "--grid", "a=1,2", "--grid", "b=3", "--seed", "7", "--site", "s"]
    with command.make_context("sweep", args, resilient_parsing=True) as ctx:
        options = forward._other_options(command, ctx.params, {"experiment", "site_name"})
    assert options[:6] == ["--grid", "a=1,2", "--grid", "b=3", "--seed", "7"]


def test_waiting_on_many_remote_runs_is_one_status_call_per_poll_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def statuses(runs: list[Any]) -> list[dict[str, Any]]:
        calls.append(len(runs))
        state = "done" if len(calls) == 5 else "running"
        return [{"state": state} for _ in runs]

    monkeypatch.setattr(run_api, "statuses", statuses)
    monkeypatch.setattr(run_api.time, "sleep", sleeps.append)
    runs = [remote_runs.RemoteRun(f"/r/{i}", None, None) for i in range(50)]  # type: ignore[arg-type]
    assert run_api.wait_all(runs, poll=2) == ["done"] * 50
    assert calls == [50] * 5
    assert sleeps == [2, 3, 4.5, 6.75]


def test_pending_submits_keep_their_token_until_answered(tmp_path: Path) -> None:
    pending = shipping.pending_file({"XDG_CACHE_HOME": str(tmp_path)}, "k")
    assert shipping._pending(pending) is None
    pending.write_text('{"token": "t", "run_id": "r", "host": "h"}')
    assert shipping._pending(pending) == {"token": "t", "run_id": "r"}
    assert oct(pending.parent.stat().st_mode & 0o777) == "0o700"


def test_a_laptop_reads_a_cluster_commands_arguments_with_that_commands_own_parser(
    tmp_path: Path,
) -> None:
    """No second parser: what the laptop needs (the site, -f, -o, RUN) is click's reading of
    the command itself; a word the command refuses is left to the command to say here, before
    any connection (the site's host does not even resolve)."""
    (tmp_path / "far.yaml").write_text(
        "name: far\nscheduler: slurm\nruns_root: /r\nlogin: {host: user@far.example.invalid}\n"
    )
    env = {"HPCTF_SITE_PATH": str(tmp_path), "HPCTF_SITE": "far", "HOME": str(tmp_path)}
    for refused in (["logs", "/r/run", "--no-such"], ["logs", "/r/run", "--rank", "x"]):
        assert forward.forwarded(refused, env, _command_named) is None
    with pytest.raises(UserError, match="--update-code"):  # read by click: --site anywhere
        forward.forwarded(["resubmit", "--site", "far", "/r/run", "--update-code"], {
            k: v for k, v in env.items() if k != "HPCTF_SITE"}, _command_named)  # fmt: skip


def test_resubmit_update_code_from_a_laptop_is_refused_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "far.yaml").write_text(
        "name: far\nscheduler: slurm\nruns_root: /r\nlogin: {host: user@far.example.invalid}\n"
    )
    env = {"HPCTF_SITE_PATH": str(tmp_path), "HPCTF_SITE": "far", "HOME": str(tmp_path)}
    with pytest.raises(UserError, match="--update-code"):
        forward.forwarded(
            ["resubmit", "/r/run", "--update-code"], env, lambda name: cli.commands[name]
        )


def test_the_code_store_is_a_folder_only_its_owner_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shipped code runs as its owner: a store others may write, or one planted as a link, is
    never used (this user's own ~/.cache/hpctf store instead); a missing one is made 0700;
    where neither is private, one line."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    own = tmp_path / "home" / ".cache" / "hpctf" / cluster_side.STORE.lstrip(".")
    made = cluster_side._private(tmp_path / "root", cluster_side.STORE)
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    open_root = tmp_path / "open"
    (open_root / cluster_side.STORE).mkdir(parents=True)
    (open_root / cluster_side.STORE).chmod(0o777)
    assert cluster_side._private(open_root, cluster_side.STORE) == own
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / cluster_side.SUBMITS).symlink_to(made)
    submits = cluster_side._private(linked, cluster_side.SUBMITS)
    assert submits == own.parent / cluster_side.SUBMITS.lstrip(".")
    own.chmod(0o777)
    with pytest.raises(EnvironmentProblem, match="only you may write"):
        cluster_side._private(open_root, cluster_side.STORE)


def test_a_sites_secrets_travel_on_stdin_never_in_the_argument_vector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ps shows every user the argument vector of ssh on the laptop and of hpctf on the login
    host: the site's secret env values and its webhook travel only in the submission's
    standard input; every other command's site leaves them out."""
    import subprocess

    from hpctf.login.remote.forward import on_cluster
    from hpctf.login.remote.shipping import submit_remote
    from hpctf.login.resolving.loader import load_config

    token, hook = "tok-9f8e7d6c5b4a", "https://hooks.example.org/services/T0/B0/SECRETPART"
    site_file = tmp_path / "remote.yaml"
    site_file.write_text(
        "name: remote\nextends: local-slurm\nlogin: {host: cluster}\n"
        f"env: {{WANDB_API_KEY: {token}, PLAIN: visible}}\nnotify: {{webhook: '{hook}'}}\n"
    )
    config = load_config(DIGITS, str(site_file), [], {"HOME": str(tmp_path)}).config
    sent: list[tuple[list[str], bytes | None]] = []

    class Connection:
        login = config.site.login

        def run(self, args: list[str], stdin: bytes | None = None, **_: object) -> object:
            sent.append((list(args), stdin))
            return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    submit_remote(Connection(), "submit", config, config.site, DIGITS, [], [],  # type: ignore[arg-type]
                  {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)})  # fmt: skip
    on_cluster(Connection(), config.site, ["status"])  # type: ignore[arg-type]
    for args, _ in sent:
        argv = " ".join(args)
        assert token not in argv and "SECRETPART" not in argv, argv
        assert "visible" in argv  # the rest of the site still goes
    (args, stdin), _ = sent
    assert args[2] == "_remote-submit" and stdin is not None
    assert token.encode() in stdin and b"SECRETPART" in stdin


def test_a_long_cache_path_puts_ssh_sockets_where_their_names_fit(tmp_path: Path) -> None:
    """A Unix socket's path holds 107 bytes: a cache path over about 39 characters made every
    SSH command fail; the sockets go to this user's own folder in /tmp instead."""
    import tempfile

    from hpctf.login.remote.ssh import SOCKET_PATH_MAX, control_dir

    short = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    assert control_dir({"XDG_CACHE_HOME": str(short)}) == short / "hpctf" / "ssh"
    long = tmp_path / ("x" * 60)
    where = control_dir({"XDG_CACHE_HOME": str(long)})
    assert where == Path(f"/tmp/hpctf-{os.geteuid()}/ssh")
    assert len(str(where / ("f" * 40))) + 17 <= SOCKET_PATH_MAX
    assert (where.stat().st_mode & 0o777) == 0o700 and where.stat().st_uid == os.geteuid()


def test_a_site_template_too_big_to_travel_is_one_line(tmp_path: Path) -> None:
    """A site template over 128 KB made every forwarded command exit 70 (the argument too
    long for exec)."""
    from hpctf.login.remote.site_file import site_document

    template = tmp_path / "big.sh.j2"
    template.write_text('{% extends "sbatch.sh.j2" %}\n' + "# padding\n" * 20_000)
    site = Site.model_validate(
        {"name": "big", "scheduler": "slurm", "runs_root": "~/r", "template": str(template),
         "login": {"host": "cluster"}}
    )  # fmt: skip
    with pytest.raises(UserError, match="over the limit of 65,536 bytes"):
        site_document(site)


def test_submit_records_older_than_a_week_are_forgotten(tmp_path: Path) -> None:
    """Each submit token's folder on the cluster was kept forever."""
    submits = tmp_path / ".hpctf-submits"
    old, new = submits / "a", submits / "b"
    for folder in (old, new):
        (folder / "run_dir").parent.mkdir(parents=True)
        (folder / "run_dir").write_text("/x\n")
    os.utime(old, (1, 1))
    cluster_side._forget_old_submits(submits)
    assert not old.exists() and new.is_dir()


def test_another_users_code_store_in_a_shared_runs_root_locks_nobody_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's (or a planted) ``.hpctf-code`` in a shared runs root: this user's code
    goes to a store of their own under ~/.cache/hpctf, never into theirs."""
    other = other_user()
    root = tmp_path / "shared"
    (root / ".hpctf-code").mkdir(parents=True, mode=0o777)
    os.chown(root / ".hpctf-code", other.pw_uid, other.pw_gid)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    store = cluster_side._private(root, ".hpctf-code")
    assert store == tmp_path / "home" / ".cache" / "hpctf" / "hpctf-code"
    assert store.stat().st_mode & 0o777 == 0o700
    assert cluster_side._private(root, ".hpctf-submits") == root / ".hpctf-submits"  # ours


@pytest.mark.parametrize(
    ("name", "given", "sent"),
    [
        ("logs", ["RUN", "--site", "x", "-f"], ["logs", "--site", "mycluster", "RUN", "-f"]),
        ("cancel", ["--site=mycluster", "RUN"], ["cancel", "--site", "mycluster", "RUN"]),
        ("resubmit", ["RUN", "--site", "mycluster", "--exclude", "n1"],
         ["resubmit", "--site", "mycluster", "RUN", "--exclude", "n1"]),
        ("plot", ["RUN", "-o", "x.png"], ["plot", "--site", "mycluster", "RUN", "-o", "x.png"]),
        ("doctor", [], ["doctor", "--site", "mycluster"]),  # chosen by $HPCTF_SITE
        ("status", ["--site", "mycluster", "RUN"], ["status", "--site", "mycluster", "RUN"]),
        ("logs", ["--", "--site"], ["logs", "--site", "mycluster", "--", "--site"]),  # RUN --site
    ],
)  # fmt: skip
def test_a_laptop_command_reaches_the_cluster_as_its_command_takes_it(
    name: str, given: list[str], sent: list[str]
) -> None:
    """`logs RUN --site X` said "No such option '--site'" on the cluster, and `doctor` with
    $HPCTF_SITE checked the cluster's `local`: every command that runs there takes --site, and
    gets the site the laptop chose, whichever way it chose it."""
    assert forward.cluster_args(name, given, "mycluster") == sent


def test_the_commands_that_take_site_are_the_clis() -> None:
    from hpctf.cli import cli

    ctx = click.Context(cli)
    takes = {
        name
        for name in forward.ON_CLUSTER
        if any("--site" in p.opts for p in cli.get_command(ctx, name).params)  # type: ignore[union-attr]
    }
    assert takes == forward.TAKES_SITE
