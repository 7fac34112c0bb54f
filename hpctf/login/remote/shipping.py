"""The laptop's side of ``submit`` and ``sweep`` on a site behind SSH.

The experiment is validated here, as for any site. The code snapshot is taken here, with
the same rules as on the cluster (:mod:`hpctf.core.run.snapshot`), and shipped as one tar
stream into a content-addressed store on the cluster (``<runs_root>/.hpctf-code/<sha256>``):
a tree that did not change is not sent again. The run id is chosen here and kept in a
pending record (``~/.cache/hpctf/pending/``) until the cluster answers, so running the same
submit again after a dropped connection attaches to the run it made, or finishes making it,
and never starts a second job.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hpctf.core.errors import EnvironmentProblem
from hpctf.core.run import snapshot
from hpctf.core.run.rundir import secret_values
from hpctf.core.settings.config import Login, ResolvedConfig, Site
from hpctf.core.settings.sources import load_yaml
from hpctf.login.remote.site_file import site_document
from hpctf.login.remote.ssh import Connection

# The cluster's answer when the code store lacks the request's tree: send it, then ask again.
NEEDS_CODE = 4
# The cluster reads at most this much of a code stream (the snapshot itself is bounded).
MAX_CODE_STREAM = snapshot.MAX_TOTAL + (16 << 20)


def tree_entries(code: Path) -> Iterator[tuple[str, int, bytes]]:
    """The snapshot's files (relative name, mode, bytes), in a stable order; its manifest,
    which names this machine's paths, stays here."""
    for directory, dirs, names in os.walk(code):
        dirs.sort()
        for name in sorted(names):
            path = Path(directory) / name
            relative = path.relative_to(code).as_posix()
            if relative != snapshot.MANIFEST:
                yield relative, path.stat().st_mode & 0o777, path.read_bytes()


def tree_hash(entries: Sequence[tuple[str, int, bytes]]) -> str:
    """The content address of a code tree: names, modes and bytes, nothing else (no times)."""
    digest = hashlib.sha256()
    for name, mode, data in entries:
        digest.update(f"{name}\0{mode:o}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def tar_stream(entries: Sequence[tuple[str, int, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def snapshot_code(config: ResolvedConfig) -> tuple[list[tuple[str, int, bytes]], list[str], str]:
    """The code snapshot, taken here as submit would take it on the cluster: its entries, the
    name of each python_path directory's copy, and train.script inside them (or "")."""
    train = config.experiment.train
    with tempfile.TemporaryDirectory(prefix="hpctf-ship-") as staging:
        sources = snapshot.take(train.python_path, Path(staging), secrets=secret_values(config))
        entries = list(tree_entries(Path(staging) / snapshot.CODE_DIR))
        code = Path(staging) / snapshot.CODE_DIR
        script = ""
        if train.script is not None:
            script = Path(snapshot.copy_of(train.script, sources)).relative_to(code).as_posix()
        for source in sources:
            for name in source.too_big:
                click.echo(
                    f"warning: {Path(source.source) / name} is over the "
                    f"{snapshot.MAX_FILE >> 20} MiB hpctf copies per file: not shipped",
                    err=True,
                )
    return entries, [Path(s.copy).name for s in sources], script


def experiment_document(experiment_file: Path, copies: list[str], script: str) -> dict[str, Any]:
    """The experiment as written, its code paths turned into the names of the shipped copies
    (the cluster makes them absolute in its store); its ``site`` is the shipped one."""
    if experiment_file.suffix == ".py":
        from hpctf.login.resolving.resolve import script_experiment

        data = script_experiment(experiment_file)
    else:
        data = load_yaml(experiment_file)[0]
    data = dict(data)
    data.pop("site", None)
    train = dict(data.get("train") or {})
    train["python_path"] = copies
    if script:
        train["script"] = script
    data["train"] = train
    return data


def _cache(env: Mapping[str, str], name: str) -> Path:
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or "~").expanduser() / ".cache")
    where = Path(cache) / "hpctf" / name
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    return where


def pending_file(env: Mapping[str, str], key: str) -> Path:
    return _cache(env, "pending") / f"{key}.json"


def submit_remote(
    connection: Connection,
    command: str,
    config: ResolvedConfig,
    site: Site,
    experiment_file: Path,
    overrides: Sequence[str],
    options: Sequence[str],
    env: Mapping[str, str],
    run_id: str | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Ship the code and ask the cluster to ``command`` (submit or sweep) the experiment;
    its answer, streamed here unless ``capture``."""
    entries, copies, script = snapshot_code(config)
    code = tree_hash(entries)
    request: dict[str, Any] = {
        "command": command,
        "code": code,
        "experiment": experiment_document(experiment_file, copies, script),
        "overrides": list(overrides),
        "options": list(options),
    }
    site_doc = site_document(site, secrets=True)
    key = hashlib.sha256(
        json.dumps([request, site_doc, connection.login.host], sort_keys=True).encode()
    ).hexdigest()[:32]
    pending = pending_file(env, key)
    earlier = _token(pending, connection, run_id or _new_run_id(config))
    run_id = earlier["run_id"]
    request.update(earlier)
    # The whole site (its secrets too) on standard input, with the request; the argument vector
    # (ps shows it to every user) holds the site without them.
    request["site"] = site_doc
    if capture:  # the Python API: the cluster answers with a typed result (calls.models.Started)
        request["answer"] = "json"
    try:
        answer = _ask(connection, site, (code, entries), json.dumps(request).encode(), capture)
    except EnvironmentProblem as exc:
        raise EnvironmentProblem(
            f"{exc}; the same command again finishes this {command} (run id {run_id}) and "
            "starts no second job"
        ) from exc
    if answer.returncode in (0, 2):
        pending.unlink(missing_ok=True)  # done, or refused with nothing made
    return answer


def _ask(
    connection: Connection,
    site: Site,
    tree: tuple[str, Sequence[tuple[str, int, bytes]]],
    request: bytes,
    capture: bool,
) -> subprocess.CompletedProcess[str]:
    """The cluster's answer to a submit ``request``; the code ``tree`` (its hash, its
    entries) sent first when the cluster's store lacks it (the answer :data:`NEEDS_CODE`)."""
    prefix = ["_remote", json.dumps(site_document(site), sort_keys=True)]
    args = [*prefix, "_remote-submit", "--site", site.name]
    answer = connection.run(args, stdin=request, capture=capture)
    if answer.returncode != NEEDS_CODE:
        return answer
    code, entries = tree
    sent = connection.run(
        [*prefix, "_remote-code", "--site", site.name, code], stdin=tar_stream(entries)
    )
    if sent.returncode != 0:
        return sent
    return connection.run(args, stdin=request, capture=capture)


def _new_run_id(config: ResolvedConfig) -> str:
    return f"{config.experiment.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _token(pending: Path, connection: Connection, run_id: str) -> dict[str, str]:
    """The token and run id of this submit: an earlier try's that got no answer, else new
    ones, kept in ``pending`` until the cluster answers."""
    earlier = _pending(pending)
    if earlier is None:
        earlier = {"token": secrets.token_hex(16), "run_id": run_id}
        pending.write_text(json.dumps({**earlier, "host": connection.login.host}))
    return earlier


def _pending(pending: Path) -> dict[str, str] | None:
    """The token and run id of an earlier try of the same submit that got no answer."""
    try:
        data = json.loads(pending.read_text())
        found = {"token": data["token"], "run_id": data["run_id"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if all(isinstance(v, str) for v in found.values()) else None


def login_of(site: Site) -> Login:
    assert site.login is not None
    return site.login
