"""A worker's own temporary directory (hpctf.compute.process.worker_tmp): real processes that
leave each way a worker can, and what they leave in ``$TMPDIR``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each way out, after the worker's tmp is in use and files were made in it the ways
# TensorFlow, hpctf and user code make them. "bounded": the exit bound fires from its timer
# thread while the main thread is still busy, so no atexit function runs.
PROGRAM = """
import os, sys, tempfile, time
from hpctf.compute.process.worker_tmp import use_own_tmp
from hpctf.compute.process.leaving import exit_later, leave
before = os.environ["TMPDIR"]
own = use_own_tmp(1)
assert own is not None and own.parent == __import__("pathlib").Path(before), own
assert os.environ["TMPDIR"] == before  # staged data stays where $TMPDIR says
assert oct(own.stat().st_mode & 0o777) == "0o700"
tempfile.NamedTemporaryFile(prefix="__autograph_generated_file", suffix=".py", delete=False)
open(os.path.join(tempfile.mkdtemp(prefix="hpctf-worker1-ckpt-"), "ckpt-1.index"), "w").close()
print(own, flush=True)
how = sys.argv[1]
if how == "leave":
    leave(0)
if how == "bounded":
    exit_later(3, seconds=0.2)
    time.sleep(60)
if how == "exception":
    raise RuntimeError("the user's code failed")
"""


@pytest.mark.parametrize(("how", "code"), [("leave", 0), ("bounded", 3), ("exception", 1)])
def test_every_way_out_removes_the_workers_tmp_and_keeps_tmpdir(
    tmp_path: Path, how: str, code: int
) -> None:
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    staged = node_tmp / "dataset.npz"  # what a batch script copied to the node's disk
    staged.write_bytes(b"data")
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, how],
        env={**os.environ, "TMPDIR": str(node_tmp)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == code, proc.stderr
    own = Path(proc.stdout.strip())
    assert own.parent == node_tmp and own.name.startswith("hpctf-rank1-")
    assert list(node_tmp.iterdir()) == [staged]


def test_without_a_usable_tmp_the_worker_goes_on(tmp_path: Path) -> None:
    """A temporary directory that cannot take a new directory (gone, full, read-only) is one
    warning: the worker goes on with tempfile as it was."""
    program = (
        "import logging, tempfile\n"
        "logging.basicConfig()\n"
        "from hpctf.compute.process.worker_tmp import use_own_tmp\n"
        f"tempfile.tempdir = {str(tmp_path / 'gone')!r}\n"
        "assert use_own_tmp(0) is None\n"
        "print(tempfile.gettempdir())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "gone")
    (line,) = proc.stderr.splitlines()
    assert "no temporary directory of this worker's own" in line and "No such file" in line


@pytest.mark.tf
def test_autograph_sources_go_with_the_bounded_exit(tmp_path: Path) -> None:
    """TensorFlow's autograph writes a source file per converted function and deletes it only
    from atexit: the bounded exit skips that, and the worker's tmp removal catches it."""
    program = (
        "import time\n"
        "from hpctf.compute.process.worker_tmp import use_own_tmp\n"
        "from hpctf.compute.process.leaving import exit_later\n"
        "own = use_own_tmp(0)\n"
        "import tensorflow as tf\n"
        "@tf.function\n"
        "def f(x):\n"
        "    if x > 0:\n"
        "        x = x * 2\n"
        "    return x\n"
        "f(tf.constant(1))\n"
        "made = [p.name for p in own.iterdir()]\n"
        "assert any(n.startswith('__autograph_generated_file') for n in made), made\n"
        "exit_later(0, seconds=0.1)\n"
        "time.sleep(60)\n"
    )
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    script = tmp_path / "train.py"  # autograph reads the function's source from its file
    script.write_text(program)
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "TMPDIR": str(node_tmp), "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(node_tmp.iterdir()) == []


def test_a_killed_workers_tmp_goes_when_the_next_worker_starts(tmp_path: Path) -> None:
    """SIGKILL runs no exit path; the next worker on the node removes what the killed one left,
    and nothing of a live worker's, nor a directory without the lock file."""
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(node_tmp)}
    hold = (
        "import sys, time, tempfile\n"
        "from hpctf.compute.process.worker_tmp import use_own_tmp\n"
        "own = use_own_tmp(int(sys.argv[1]))\n"
        "tempfile.NamedTemporaryFile(prefix='__autograph_generated_file', delete=False)\n"
        "print(own, flush=True)\n"
        "time.sleep(120)\n"
    )
    live = subprocess.Popen(
        [sys.executable, "-c", hold, "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", hold, "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert live.stdout is not None and killed.stdout is not None
        live_dir = Path(live.stdout.readline().strip())
        killed_dir = Path(killed.stdout.readline().strip())
        killed.kill()
        killed.wait(timeout=30)
        unlocked = node_tmp / "hpctf-rank7-unlocked"  # being made, or not a worker's
        unlocked.mkdir()
        assert killed_dir.is_dir() and live_dir.is_dir()
        nxt = (
            "from hpctf.compute.process.leaving import leave\n"
            "from hpctf.compute.process.worker_tmp import use_own_tmp\n"
            "use_own_tmp(2)\n"
            "leave(0)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", nxt], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert sorted(node_tmp.iterdir()) == sorted([live_dir, unlocked])
        assert len(list(live_dir.iterdir())) == 2  # its lock and its file, untouched
    finally:
        live.kill()
        killed.kill()
        live.wait(timeout=30)


def test_only_this_hosts_directories_are_swept(tmp_path: Path) -> None:
    """On a $TMPDIR shared by nodes, flock may be node-local: another host's directory whose
    lock looks free here is left alone; this host's is removed."""
    from hpctf.compute.process import worker_tmp

    host = worker_tmp._host()
    mine = tmp_path / f"hpctf-rank0-{host}-abcd_123"
    theirs = tmp_path / "hpctf-rank0-othernode-abcd_123"
    suffix_host = tmp_path / f"hpctf-rank0-x{host}-abcd_123"  # a host whose name ends in ours
    for directory in (mine, theirs, suffix_host):
        directory.mkdir()
        (directory / "owner.lock").write_bytes(b"")  # its lock free: its worker is gone
    assert worker_tmp.remove_left_behind(tmp_path) == [mine]
    assert sorted(tmp_path.iterdir()) == sorted([theirs, suffix_host])


def test_an_exit_bound_during_the_main_threads_removal_waits_for_it(tmp_path: Path) -> None:
    """leave() on the main thread removes the directory; the exit bound's timer fires in the
    middle of it: its os._exit must wait for the removal, not cut it short (seen on the Slurm
    24.11 cluster: a rank gone with its files left behind). The removal is slowed here to
    make the overlap certain."""
    program = (
        "import os, shutil, threading, time, tempfile\n"
        "from hpctf.compute.process import worker_tmp\n"
        "from hpctf.compute.process.leaving import exit_now\n"
        f"tempfile.tempdir = {str(tmp_path)!r}\n"
        "own = worker_tmp.use_own_tmp(0)\n"
        "for i in range(20):\n"
        "    (own / f'f{i}').write_text('x')\n"
        "real = os.unlink\n"
        "def slow(path, *a, **k):\n"
        "    time.sleep(0.05)\n"
        "    return real(path, *a, **k)\n"
        "shutil._use_fd_functions = False\n"
        "os.unlink = slow\n"
        "threading.Timer(0.2, exit_now, args=(7,)).start()\n"
        "exit_now(0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode in (0, 7), proc.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
