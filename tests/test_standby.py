"""The warm standby's socket, its checks and the worker's fallback (hpctf.compute.start.standby,
.standby_socket, .takeover), without Slurm: a real second unix user is refused, a task without
a ready standby imports TensorFlow itself. tests/test_standby_slurm.py is the takeover on the
real test cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctf.compute.start import standby, takeover
from hpctf.compute.start import standby_socket as wire
from hpctf.core.run.rundir import RunDir
from tests.conftest import other_user

SLOT = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "node1", "SLURM_LOCALID": "0"}

# What another user runs: connect, hand over an environment, print the answer (or the error).
INTRUDER = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(sys.argv[1])
    socket.send_fds(s, [json.dumps({"env": {"LD_PRELOAD": "/tmp/x.so"}}).encode()], [0, 1, 2])
    print(s.recv(65536).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder under /tmp that another user may enter (pytest's own tmp is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hpctf-standby-test-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _keeper(folder: Path, mode: int, run: Path) -> tuple[standby.Keeper, Path]:
    """A keeper (no child: nothing is ever ready) listening in ``folder`` made ``mode``."""
    folder.chmod(mode)
    path = folder / "node1-0.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    path.chmod(0o777)
    listener.listen(4)
    return standby.Keeper(RunDir(run), listener, SLOT), path


def _as_other_user(path: Path) -> str:
    user = other_user()
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", INTRUDER, str(path)],
        user=user.pw_uid,
        group=user.pw_gid,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd="/",
    )
    return proc.stdout.strip() + proc.stderr.strip()


def test_another_user_can_neither_reach_the_socket_nor_hand_over(
    open_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The keeper's own folder is 0700: another user cannot even reach the socket.
    private = open_folder / "private"
    private.mkdir()
    keeper, path = _keeper(private, 0o700, tmp_path)
    assert _as_other_user(path) == "PermissionError"
    keeper.close()
    # Were the folder open (a mistake of someone's), SO_PEERCRED still refuses: the keeper
    # answers and hangs up before it reads the request (the sender may see its pipe broken).
    exposed = open_folder / "exposed"
    exposed.mkdir()
    keeper, path = _keeper(exposed, 0o755, tmp_path)
    caplog.set_level("INFO", logger="hpctf.standby")
    serving = threading.Thread(target=keeper._on_listen)
    serving.start()
    answer = _as_other_user(path)
    serving.join(30)
    keeper.close()
    assert "accepted" not in answer
    assert answer in ("BrokenPipeError", "ConnectionResetError") or "refused" in answer, answer
    (refusal,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert f"of uid {other_user().pw_uid} is not this job's user" in refusal
    assert keeper.serving is None and keeper.child is None


def test_a_folder_not_only_the_users_is_refused(open_folder: Path) -> None:
    wire.private_folder(open_folder / "new", make=True)
    assert (open_folder / "new").stat().st_mode & 0o777 == 0o700
    with pytest.raises(wire.StandbyRefused, match="mode 755"):
        wire.private_folder(open_folder, make=False)
    (open_folder / "link").symlink_to(open_folder / "new")
    with pytest.raises(wire.StandbyRefused, match="not a directory"):
        wire.private_folder(open_folder / "link", make=False)
    user = other_user()
    theirs = open_folder / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, user.pw_uid, user.pw_gid)
    with pytest.raises(wire.StandbyRefused, match=f"owner uid {user.pw_uid}"):
        wire.private_folder(theirs, make=True)


def test_a_task_without_a_ready_standby_starts_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**SLOT, "TMPDIR": str(tmp_path)}
    path = wire.socket_path(env, tmp_path)
    assert path is not None and path.name == "node1-0.sock"
    assert takeover.hand_over(tmp_path, env) is None  # no socket at all: silent
    # A keeper whose standby is still importing refuses; the task says so and starts itself.
    wire.private_folder(path.parent, make=True)
    keeper, _ = _keeper(path.parent, 0o700, tmp_path)
    serving = threading.Thread(target=keeper._on_listen)
    serving.start()
    tempfile.tempdir = str(tmp_path)
    try:
        assert takeover.hand_over(tmp_path, env) is None
    finally:
        tempfile.tempdir = None
        serving.join(30)
        keeper.close()
    said = capsys.readouterr().err
    assert "no warm standby (no standby ready): importing TensorFlow here" in said


def test_socket_paths_and_gpu_checks() -> None:
    assert wire.socket_path({}) is None  # not a Slurm task
    assert wire.socket_path({**SLOT, "SLURMD_NODENAME": "../x"}) is None
    assert wire.socket_path(SLOT, Path("/" + "t" * 100)) is None  # too long for sun_path
    mine = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "2,3"}
    assert standby.gpu_mismatch(mine, dict(mine)) is None
    assert standby.gpu_mismatch({}, {}) is None
    why = standby.gpu_mismatch(mine, {**mine, "SLURM_STEP_GPUS": "0,1"})
    assert why is not None and "SLURM_STEP_GPUS differs" in why


def test_first_steps_counts_only_lines_appended_after_the_watch(tmp_path: Path) -> None:
    log = tmp_path / "rank-1.log"
    log.write_text("10:00:00 rank 1: first step 1 after 3.00 s (1.00 s CPU): x 1.00 s\n")
    watch = standby.FirstSteps(log)
    assert not watch.seen()
    with log.open("a") as handle:
        handle.write("10:00:05 rank 1: first step 57 after")  # not a whole line yet
        handle.flush()
        assert not watch.seen()
        handle.write(" 1.20 s (1.00 s CPU): standby takeover 0.30 s\n")
    assert watch.seen()


def test_a_standby_imports_once_its_worker_has_trained_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not at the first step: :data:`standby.TRAINED_FOR_S` after it (a start that ends soon
    after its first step gains nothing from the import's CPU), or WARM_AFTER_S after none."""
    now = [100.0]
    monkeypatch.setattr(standby.time, "monotonic", lambda: now[0])
    log = tmp_path / "rank-0.log"
    log.write_text("")
    keeper = standby.Keeper.__new__(standby.Keeper)
    keeper.warm_at, keeper.first_steps = now[0] + standby.WARM_AFTER_S, standby.FirstSteps(log)
    assert not keeper._warm_time()
    log.write_text("10:00:00 rank 0: first step 1 after 3.00 s (1.00 s CPU): x 1.00 s\n")
    assert not keeper._warm_time()  # seen: the clock starts
    now[0] += standby.TRAINED_FOR_S - 0.5
    assert not keeper._warm_time()
    now[0] += 1.0
    assert keeper._warm_time()
    quiet = standby.Keeper.__new__(standby.Keeper)  # a worker that never logs a first step
    quiet.warm_at, quiet.first_steps = now[0] + standby.WARM_AFTER_S, standby.FirstSteps(log)
    now[0] += standby.WARM_AFTER_S
    assert quiet._warm_time()


@pytest.mark.tf
def test_a_standby_has_imported_tensorflow_without_starting_its_context() -> None:
    """What the standby imports leaves TensorFlow's context unmade (TF_CONFIG and
    CUDA_VISIBLE_DEVICES are read when it is made); the check sees it made once it is."""
    code = (
        "from hpctf.compute.compat import tensorflow_internals as t\n"
        "import hpctf.compute.loop.training, tensorflow as tf\n"
        "print(t.eager_context_started())\n"
        "tf.config.list_physical_devices('GPU')\n"
        "print(t.eager_context_started())\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert proc.stdout.split() == ["False", "True"], proc.stderr


def test_a_dead_keepers_socket_on_this_node_is_removed(tmp_path: Path) -> None:
    """A keeper killed outright leaves its socket: the next keeper on the node removes it (and
    its folder once empty), not a live one, another node's, a new one, nor its own folder."""
    uid = os.getuid()
    dead, live, mine = (tmp_path / f"hpctf-standby-{uid}-{job}" for job in (1, 2, 3))
    for folder in (dead, live, mine):
        wire.private_folder(folder, make=True)
    sockets = []
    for path in (dead / "node1-0.sock", dead / "node2-0.sock", live / "node1-0.sock"):
        sockets.append(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
        sockets[-1].bind(str(path))
        os.utime(path, (0, 0))  # made long ago
    sockets[-1].listen(1)  # only the live one listens
    young = mine / "node1-1.sock"
    sockets.append(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    sockets[-1].bind(str(young))
    try:
        removed = wire.remove_stale(tmp_path, "node1", keep=mine)
    finally:
        for sock in sockets:
            sock.close()
    assert removed == [dead / "node1-0.sock"]  # node2's keeps its folder
    assert (dead / "node2-0.sock").exists() and (live / "node1-0.sock").exists()
    assert young.exists()
    (dead / "node2-0.sock").unlink()
    assert wire.remove_stale(tmp_path, "node2", keep=mine) == [dead]
