"""Local runs as users expect: ``hpctf cancel`` stops one as Ctrl-C does; a resubmit right
after a killed launcher waits for its workers' save; local stops are worded as what they were;
one-line reasons stay one short line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import hpctf
from hpctf.core.errors import one_line
from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir
from tests.conftest import DIGITS, HPCTF, checkpoint_steps, run_dir_from
from tests.journal_records import ended, started, write_events

LONG = ["train.steps=100000", "train.log_every_steps=1", "checkpoint.every_steps=100000"]
SETS = [arg for setting in LONG for arg in ("--set", setting)]


def _start(tmp_path: Path, pipe_bytes: int | None = None) -> tuple[subprocess.Popen[str], Path]:
    """`hpctf submit --site local` of a long run in the background, its output a pipe (of
    ``pipe_bytes`` when given) that the caller reads; returns once it named its run."""
    launcher = subprocess.Popen(
        [*HPCTF, "submit", str(DIGITS), "--site", "local", *SETS],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert launcher.stdout is not None
    if pipe_bytes is not None:
        import fcntl

        fcntl.fcntl(launcher.stdout.fileno(), 1031, pipe_bytes)  # F_SETPIPE_SZ
    return launcher, run_dir_from(launcher.stdout.readline())


def _launch(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """`hpctf submit --site local` in the background; returns once rank 0 trained a step."""
    launcher, run_dir = _start(tmp_path)
    rank_0 = run_dir / "logs" / "rank-0.log"
    deadline = time.monotonic() + 120
    while not (rank_0.exists() and "step 20/" in rank_0.read_text()):
        assert time.monotonic() < deadline and launcher.poll() is None, "no training"
        time.sleep(0.1)
    return launcher, run_dir


def _ends(run_dir: Path) -> list[dict[str, object]]:
    return [e for e in RunDir(run_dir).events() if e["event"] == "ended"]


def _status(run_dir: Path) -> dict[str, object]:
    out = subprocess.run(
        [*HPCTF, "status", "--json", str(run_dir)], capture_output=True, text=True, check=True
    )
    run: dict[str, object] = json.loads(out.stdout)["runs"][0]
    return run


def _cancel_as_ctrl_c(
    launcher: subprocess.Popen[str], run_dir: Path, wait: float
) -> subprocess.CompletedProcess[str]:
    """``hpctf cancel RUN`` (returned): it succeeds, and the launcher ends within ``wait``
    seconds as after a Ctrl-C (exit 130)."""
    proc = subprocess.run(
        [*HPCTF, "cancel", str(run_dir)], capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launcher.communicate(timeout=wait)
    assert launcher.returncode == 130
    return proc


@pytest.mark.tf
def test_hpctf_cancel_stops_a_local_run_as_ctrl_c_does(runs_root: Path, tmp_path: Path) -> None:
    launcher, run_dir = _launch(tmp_path)
    proc = _cancel_as_ctrl_c(launcher, run_dir, wait=30)
    (end,) = _ends(run_dir)
    saved = end["step"]
    assert end["reason"] == "cancelled" and isinstance(saved, int) and saved >= 20
    assert checkpoint_steps(run_dir)[-1] == saved
    assert f"cancelled at checkpoint step {saved}; resume with: hpctf resubmit" in proc.stdout
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"cancelled: saved step {saved}; exiting 75 (hpctf resubmit resumes it)" in log, log
    assert "requeue" not in log
    assert (_status(run_dir)["state"], _status(run_dir)["why"]) == (
        "cancelled",
        "cancelled by the user",
    )
    again = subprocess.run([*HPCTF, "cancel", str(run_dir)], capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout, again.stdout


@pytest.mark.tf
def test_a_resubmit_after_a_killed_launcher_waits_for_its_workers_save(
    runs_root: Path, tmp_path: Path
) -> None:
    launcher, run_dir = _launch(tmp_path)
    workers = [int(p) for p in _worker_pids(run_dir)]
    # Held still while their launcher dies, so that the resubmit surely finds them saving.
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    launcher.kill()
    launcher.wait()
    resubmit = subprocess.Popen(
        [*HPCTF, "resubmit", str(run_dir), "--set", "train.steps=80"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert resubmit.stderr is not None
    said = resubmit.stderr.readline()
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    out, err = resubmit.communicate(timeout=300)
    assert resubmit.returncode == 0, said + out + err
    assert said.startswith("hpctf: waiting up to 30 s for the workers of the last start (pids ")
    first, second = _ends(run_dir)
    saved = first["step"]
    assert first["reason"] == "preempted" and isinstance(saved, int) and saved >= 20, first
    assert second["reason"] == "done" and second["step"] == 80
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"interrupted: saved step {saved}; exiting 75 (hpctf resubmit resumes it)" in log
    assert f"resumed from {run_dir}/checkpoints/ckpt-{saved} at step {saved}" in log
    assert "requeue" not in log


def _worker_pids(run_dir: Path) -> list[str]:
    pids = []
    for log in sorted((run_dir / "logs").glob("rank-*.log")):
        found = re.findall(r"rank \d+: host \S+ pid (\d+)", log.read_text())
        pids.append(found[-1])
    return pids


def test_one_line_reasons_are_short_and_say_where_the_rest_is() -> None:
    tensor = "Attempt to convert a value (PerReplica:{ 0: " + "[255. 255. 255.]\n" * 500
    line = one_line(tensor)
    assert "\n" not in line and len(line) < 360, len(line)
    assert line.endswith("more characters; the rank log has it all)")
    assert one_line("exit  1\n") == "exit 1"


def test_a_local_run_stopped_by_a_signal_shows_interrupted(tmp_path: Path, runs_root: Path) -> None:
    rendered = subprocess.run(
        [*HPCTF, "render", str(DIGITS), "--site", "local", "-o", str(tmp_path / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert rendered.returncode == 0
    (run_dir,) = runs_root.iterdir()
    saved = {"event": journal.SAVED_ON_WARNING, "job_id": "7", "step": 30, "signal": "TERM"}
    write_events(run_dir, started(), saved, ended("preempted", 30, 75))
    shown = _status(run_dir)
    assert (shown["state"], shown["why"]) == (
        "interrupted",
        "its launcher was stopped; saved step 30; hpctf resubmit resumes it",
    )
    assert hpctf.run(run_dir).wait(poll=0.1, timeout=5) == "interrupted"  # an end, for wait()


@pytest.mark.tf
def test_a_cancel_is_acted_on_while_the_terminal_reads_nothing(
    runs_root: Path, tmp_path: Path
) -> None:
    """The launcher's terminal stops reading (a full pipe, as under a paused pager or a test
    that reads one line): the echo must not hold the launcher, so ``hpctf cancel`` still saves
    and stops the run at once (a full pipe held it for 9 minutes, until a second cancel)."""
    launcher, run_dir = _start(tmp_path, pipe_bytes=4096)  # full after a page
    rank_0 = run_dir / "logs" / "rank-0.log"
    started = time.monotonic()
    # Four pages of progress lines, none of them read: the pipe is full.
    while time.monotonic() < started + 120 and (
        not rank_0.exists() or len(rank_0.read_bytes()) < 16_000
    ):
        time.sleep(0.2)
    cancel = subprocess.Popen(
        [*HPCTF, "cancel", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # The workers saved and stopped and the end is recorded while the terminal still reads
    # nothing; only the launcher's own last lines wait for a reader.
    deadline = time.monotonic() + 60
    while not _ends(run_dir):
        assert time.monotonic() < deadline, "the cancel was not acted on"
        time.sleep(0.5)
    launcher.communicate(timeout=60)  # the terminal reads again
    out, err = cancel.communicate(timeout=60)
    assert cancel.returncode == 0, out + err
    assert launcher.returncode == 130
    (end,) = _ends(run_dir)
    assert end["reason"] == "cancelled" and checkpoint_steps(run_dir)[-1] == end["step"]
    assert "cancelled at checkpoint step" in out, out


@pytest.mark.tf
def test_a_cancel_while_the_workers_start_is_kept_and_acted_on(
    runs_root: Path, tmp_path: Path
) -> None:
    """``hpctf cancel`` right after the run directory is printed, while the workers import
    TensorFlow and join: the stop is not lost; the run ends cancelled, without training on."""
    launcher, run_dir = _start(tmp_path)
    _cancel_as_ctrl_c(launcher, run_dir, wait=120)
    (end,) = _ends(run_dir)
    assert end["reason"] == "cancelled"
    records = (
        (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
    )
    steps = [json.loads(line).get("step", 0) for line in records.splitlines() if '"loss"' in line]
    assert max(steps, default=0) < 1000, "trained on after the cancel"
