"""TensorFlow's ports are not a door into the user's account (hostile round 3): a local run's
workers listen inside a network namespace of their own, so neither a second real unix user
nor anyone else outside reaches them; ``worker_network: host`` (the control) shows the attack
they were open to: a TensorFlow session from outside read the worker's environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DIGITS, HPCTF, REPO, other_user, paced

pytestmark = pytest.mark.tf

MARKER = "hpctf-secret-0c3f9"
# The attack as reported: a TensorFlow session on the worker's server, an op that reads the
# worker's own environment.
ATTACK = """
import sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=5000)
with tf.compat.v1.Session("grpc://127.0.0.1:" + sys.argv[1], config=config) as session:
    print(session.run(tf.io.read_file("/proc/self/environ")).decode(errors="replace"))
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    print("open")
except OSError as exc:
    print("closed", type(exc).__name__)
"""


def _long_run(tmp_path: Path, site: str) -> tuple[subprocess.Popen[bytes], Path, list[int]]:
    """A local digits run that trains for a long while; its ports once rank 0 trains."""
    launcher = subprocess.Popen(
        [*HPCTF, "submit", str(DIGITS), "--site", site, "--set", "train.steps=100000",
         "--set", f"env.MY_TOKEN={MARKER}", *(a for s in paced() for a in ("--set", s))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )  # fmt: skip
    assert launcher.stdout is not None
    try:
        # Warnings may come first: the paced entry's python_path (tests/) holds this file, and
        # with it MARKER, which hpctf finds in the code snapshot and names.
        said = ""
        while not (found := re.search(r"run directory: (\S+)", said)):
            line = launcher.stdout.readline().decode()
            assert line, said
            said += line
        run_dir = Path(found.group(1))
        rank_0 = run_dir / "logs" / "rank-0.log"
        deadline = time.monotonic() + 120
        while not (rank_0.exists() and " step " in rank_0.read_text()):
            assert time.monotonic() < deadline and launcher.poll() is None, "no training"
            time.sleep(0.2)
    except BaseException:  # no run left training for the tests after this one
        launcher.kill()  # its workers follow their launcher (tests/test_local.py)
        launcher.wait()
        raise
    workers = re.search(r"workers (\S+)", rank_0.read_text()).group(1)  # type: ignore[union-attr]
    return launcher, run_dir, [int(address.rsplit(":", 1)[1]) for address in workers.split(",")]


def _stop(launcher: subprocess.Popen[bytes], run_dir: Path) -> None:
    subprocess.run([*HPCTF, "cancel", str(run_dir)], capture_output=True, timeout=180)
    launcher.communicate(timeout=60)


def _as_other_user(code: str, *args: str) -> str:
    user = other_user()
    proc = subprocess.run(
        ["runuser", "-u", user.pw_name, "--", "/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    return proc.stdout.strip() + proc.stderr.strip()[-300:]


def _attack(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ATTACK, str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


def test_a_local_runs_workers_are_out_of_reach_of_other_users(
    runs_root: Path, tmp_path: Path
) -> None:
    other_user()  # skips where no second user can be made
    launcher, run_dir, ports = _long_run(tmp_path, "local")
    try:
        for port in ports:
            assert _as_other_user(CONNECT, str(port)).startswith("closed"), port
        attack = _attack(ports[0])
        assert attack.returncode != 0 and MARKER not in attack.stdout, attack.stdout
    finally:
        _stop(launcher, run_dir)
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "training" in log or " step " in log
    (end,) = [line for line in log.splitlines() if "exiting 75" in line]
    assert "cancelled" in end


def test_worker_network_host_is_the_open_door_the_namespace_closes(
    runs_root: Path, tmp_path: Path
) -> None:
    """The control: on this machine's network another user connects to the same ports (the
    door a TensorFlow session from outside went through to read the worker's environment)."""
    other_user()
    site = tmp_path / "open.yaml"
    site.write_text(
        (REPO / "site_configs" / "local.yaml").read_text().replace("name: local", "name: open")
        + "worker_network: host\n"
    )
    launcher, run_dir, ports = _long_run(tmp_path, str(site))
    try:
        assert [_as_other_user(CONNECT, str(port)) for port in ports] == ["open"] * len(ports)
    finally:
        _stop(launcher, run_dir)
