"""What the cluster's hpctf does for a laptop (the hidden commands behind the SSH path).

``hpctf _remote SITE_JSON COMMAND ARGS...`` runs COMMAND as the login host would, with the
laptop's site (``SITE_JSON``, :func:`hpctf.login.remote.shipping.site_document`) kept in
``~/.cache/hpctf/sites/<hash>/`` and first on the site search path, and ``HPCTF_ON_LOGIN=1``.
Three commands exist for the laptop alone: ``_remote-code`` (receive a code tree into the
content-addressed store), ``_remote-submit`` (submit or sweep a shipped experiment, once
per token: :func:`submit_once`) and ``_call`` (a typed call of the Python API, request and
site on stdin: :mod:`hpctf.login.remote.calling`).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.rundir import RunDir, free_path, remove_new_run_dir, runs_root
from hpctf.core.safe_files import private_folder, write_atomic
from hpctf.login.calls.table import started
from hpctf.login.remote.calling import call_command
from hpctf.login.remote.shipping import MAX_CODE_STREAM, NEEDS_CODE, tree_hash
from hpctf.login.remote.site_file import enter

STORE = ".hpctf-code"
SUBMITS = ".hpctf-submits"


def _root(site_name: str) -> Path:
    from hpctf.login.reading.runs import runs_root_for

    return runs_root_for(None, site_name, os.environ).resolve()


def _private(root: Path, name: str) -> Path:
    """``root/name``, a folder of this user's that nobody else may write (the code store, the
    submit tokens): code another user put in a shared runs root must never run as this one.
    Where another user holds that name (a shared runs root: theirs, or planted), this user's
    own ``~/.cache/hpctf/<name>`` instead: nobody locks another out of the SSH path."""
    for folder in (root / name, Path.home() / ".cache" / "hpctf" / name.lstrip(".")):
        with contextlib.suppress(OSError):  # a shared root may be another's: ours below it
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if private_folder(folder, create=False):
            return folder
    raise EnvironmentProblem(
        f"neither {root / name} nor {folder} is a folder of yours that only you may write: "
        "hpctf keeps shipped code and submits there; remove them or use a runs_root of yours"
    )


def _members(data: bytes) -> Iterator[tuple[str, int, bytes]]:
    """The regular files of a code stream: names relative and inside it, or a UserError (a
    stream that is no tar, or a damaged one, too)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                parts = Path(member.name).parts
                if not member.isfile() or member.name.startswith("/") or ".." in parts:
                    raise UserError(f"_remote-code: {member.name!r} is not a plain relative file")
                handle = tar.extractfile(member)
                if handle is None:
                    raise UserError(f"_remote-code: {member.name!r} has no content")
                yield member.name, member.mode & 0o777, handle.read()
    except tarfile.TarError as exc:
        raise UserError(f"_remote-code: not a code stream hpctf sent ({exc})") from None


@click.command("_remote-code", hidden=True)
@click.option("--site", "site_name", required=True)
@click.argument("code")
def remote_code(site_name: str, code: str) -> None:
    """Receive a code tree (a tar stream on stdin) into the store as ``CODE``, its hash."""
    store = _private(_root(site_name), STORE)
    if (store / code).is_dir():
        return
    data = sys.stdin.buffer.read(MAX_CODE_STREAM + 1)
    if len(data) > MAX_CODE_STREAM:
        raise UserError(f"_remote-code: a code stream over {MAX_CODE_STREAM >> 20} MiB")
    entries = list(_members(data))
    if tree_hash(entries) != code:
        raise UserError("_remote-code: the tree received does not have the hash it was sent as")
    incoming = store / f".incoming-{os.getpid()}"
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir(parents=True)
    try:
        for name, mode, content in entries:
            target = incoming / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode & 0o555)
        os.rename(incoming, store / code)
    except OSError as exc:
        shutil.rmtree(incoming, ignore_errors=True)  # nothing half-made is left in the store
        if not (store / code).is_dir():  # not: another laptop sent the same tree first
            raise EnvironmentProblem(f"_remote-code: cannot store the code: {exc}") from exc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time for one submit token (the lock is the login host's own)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _experiment(request: Mapping[str, Any], store: Path) -> dict[str, Any]:
    experiment = dict(request["experiment"])
    train = dict(experiment.get("train") or {})
    train["python_path"] = [str(store / name) for name in train.get("python_path", [])]
    if train.get("script"):
        train["script"] = str(store / str(train["script"]))
    experiment["train"] = train
    return experiment


@click.command("_remote-submit", hidden=True)
@click.option("--site", "site_name", required=True)
def remote_submit(site_name: str) -> None:
    """Submit (or sweep) the experiment of the request on stdin, once per its token."""
    try:
        request = json.loads(sys.stdin.buffer.read(MAX_CODE_STREAM))
        token, code = str(request["token"]), str(request["code"])
        run_id = str(request["run_id"])
    except (ValueError, KeyError, TypeError):
        raise UserError("_remote-submit: the request is not one hpctf sent") from None
    if not token.isalnum() or not code.isalnum() or "/" in run_id or run_id.startswith("."):
        raise UserError("_remote-submit: the request is not one hpctf sent")
    if isinstance(request.get("site"), dict):
        # The whole site, secrets too, came on stdin: the one in argv was without them.
        enter(json.dumps(request["site"], sort_keys=True), os.environ)
    root = _root(site_name)
    store = _private(root, STORE) / code
    if not store.is_dir():
        sys.exit(NEEDS_CODE)
    submits = _private(root, SUBMITS)
    _forget_old_submits(submits)
    work = submits / token
    work.mkdir(exist_ok=True, mode=0o700)
    experiment_file = work / "experiment.yaml"
    write_atomic(experiment_file, json.dumps(_experiment(request, store)), mode=0o600)
    overrides = [str(o) for o in request.get("overrides", [])]
    with _locked(work / "lock"):
        if request.get("command") == "sweep":
            sys.exit(_sweep_once(work, experiment_file, site_name, overrides, request))
        if request.get("answer") != "json":
            sys.exit(submit_once(work, experiment_file, site_name, overrides, run_id))
        # The Python API's submit: the typed answer on stdout, the command's words on stderr.
        with contextlib.redirect_stdout(sys.stderr):
            status = submit_once(work, experiment_file, site_name, overrides, run_id)
        chosen = Path((work / "run_dir").read_text(encoding="utf-8").strip())
        click.echo(started(RunDir(chosen), status).model_dump_json())
        sys.exit(status)


# How long a submit token's record is kept: a laptop retries an unanswered submit within
# minutes; a week covers a laptop closed over a weekend.
SUBMIT_RECORD_S = 7 * 24 * 3600


def _forget_old_submits(submits: Path) -> None:
    """Remove the records of submits older than :data:`SUBMIT_RECORD_S` (each token's folder
    was kept forever); a record in use is newer (its lock is touched by every retry)."""
    old = time.time() - SUBMIT_RECORD_S
    with contextlib.suppress(OSError):
        for record in submits.iterdir():
            with contextlib.suppress(OSError):
                if record.is_dir() and not record.is_symlink() and record.stat().st_mtime < old:
                    shutil.rmtree(record)


def _sweep_once(
    work: Path, experiment: Path, site: str, overrides: Sequence[str], request: Mapping[str, Any]
) -> int:
    done = work / ("swept.json" if request.get("answer") == "json" else "swept")
    if done.is_file():
        click.echo(done.read_text(encoding="utf-8"), nl=False)
        return 0
    from hpctf.login.sweeps.start import sweep

    args = [str(experiment), "--site", site, *(f"--set={o}" for o in overrides)]
    if request.get("answer") == "json":
        return _sweep_answered(done, [*args, *request.get("options", [])])
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            sweep.main([*args, *request.get("options", [])], "hpctf sweep", standalone_mode=False)
    finally:
        click.echo(said.getvalue(), nl=False)
    write_atomic(done, said.getvalue())
    return 0


def _sweep_answered(done: Path, args: list[str]) -> int:
    """``hpctf sweep ARGS`` for the Python API: its typed answer (calls.models.SweepStarted)
    on stdout, kept in ``done`` for a retry of the same token; its words on stderr."""
    from hpctf.login.calls.models import SweepStarted
    from hpctf.login.sweeps.start import start_any, sweep

    with sweep.make_context("sweep", args) as ctx:
        p = ctx.params
    with contextlib.redirect_stdout(sys.stderr):
        record, status = start_any(
            p["experiment"],
            p["grids"],
            p["ranges"],
            p["draws"],
            p["seed"],
            p["max_points"],
            p["site_name"],
            p["overrides"],
            p["max_running"],
        )
    answer = SweepStarted(sweep_dir=str(record.path), exit_status=status).model_dump_json()
    write_atomic(done, answer + "\n")
    click.echo(answer)
    return status


def submit_once(
    work: Path, experiment: Path, site: str, overrides: Sequence[str], run_id: str
) -> int:
    """Submit ``experiment`` into the run directory this token chose, once: a run that has its
    job is only named again; a run made without one gets its job now; a half-made one is
    made again."""
    from hpctf.core.run.history import read_history
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.pipeline import RunJob, start, submit

    config = load_config(experiment, site, overrides, os.environ).config
    chosen = work / "run_dir"
    if chosen.is_file():
        run = RunDir(Path(chosen.read_text(encoding="utf-8").strip()))
    else:
        run = RunDir(free_path(runs_root(config), run_id, "run directory"))
        write_atomic(chosen, str(run.path))
    if run.config_file.is_file():
        history = read_history(run)
        if history.submissions:
            click.echo(f"submitted job {history.submissions[-1].job_id}")
            click.echo("note: by an earlier try of this submit; no second job", err=True)
            click.echo(f"run directory: {run.path}")
            return 0
        if history.created is not None:
            return start(run, run.load_config())
    if run.path.exists():
        remove_new_run_dir(run)  # half-made by an earlier try of this token
    # The pipeline at the path this token chose: rendered once, created, started (a job the
    # scheduler refused leaves no run directory behind).
    result = submit(RunJob(config, path=run.path)).result
    return 0 if result is None else result


@click.command("_remote-plot", hidden=True)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def remote_plot(run_dir: Path) -> None:
    """``hpctf plot RUN_DIR``, its PNG written to stdout (its words to stderr) for the laptop."""
    import tempfile

    from hpctf.login.watching.plot import plot

    with tempfile.TemporaryDirectory(prefix="hpctf-plot-") as where:
        output = Path(where) / "plot.png"
        with contextlib.redirect_stdout(sys.stderr):
            plot.main([str(run_dir), "-o", str(output)], "hpctf plot", standalone_mode=False)
        sys.stdout.buffer.write(output.read_bytes())


COMMANDS = (remote_code, remote_submit, remote_plot, call_command)
