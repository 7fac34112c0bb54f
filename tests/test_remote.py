"""The SSH path end to end: a real sshd (tests/sshd.py) in front of the real Slurm test
cluster, the laptop being this process's hpctf with a site whose ``login:`` names it.

One sshd, one jump sshd and one cluster for the module; tiny runs (examples/digits, 1 node,
a few steps)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import sshd as harness
from tests.conftest import DIGITS, HPCTF, submitted
from tests.sshd import HOSTILE

TINY = [
    "--set",
    "resources.nodes=1",
    "--set",
    "train.steps=20",
    "--set",
    "train.log_every_steps=10",
]
TINY += ["--set", "checkpoint.every_steps=10"]


class Remote:
    def __init__(self, base: Path, env: dict[str, str], login: harness.Sshd) -> None:
        self.base, self.env, self.sshd = base, env, login
        self.runs = base / "runs"

    def hpctf(
        self, *args: str, check: int | None = 0, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*HPCTF, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check is not None:
            assert proc.returncode == check, (
                f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def close(self) -> None:
        subprocess.run(
            ["ssh", "-F", str(self.base / "ssh_config"), "-o",
             f"ControlPath={self.env['XDG_CACHE_HOME']}/hpctf/ssh/%C", "-O", "exit", "cluster"],
            capture_output=True, check=False,
        )  # fmt: skip

    def wait_done(self, run_dir: Path, timeout: float = 300) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            doc = json.loads(
                self.hpctf("status", "--site", "cluster", "--json", str(run_dir)).stdout
            )
            run = doc["runs"][0] if "runs" in doc else doc
            if run.get("state") in ("done", "failed", "gave_up", "cancelled"):
                return dict(run)
            assert time.monotonic() < deadline, run
            time.sleep(2)


@pytest.fixture(scope="module")
def remote(slurm2205_cluster: dict[str, str]) -> Iterator[Remote]:
    slurm_cluster = slurm2205_cluster  # module-scoped: the 22.05 cluster itself, not a test's
    why = harness.usable()
    if why:
        pytest.skip(why)
    setup = harness.set_up(slurm_cluster["SLURM_CONF"], Path(slurm_cluster["HPCTF_TEST_CHECKOUT"]))
    remote = Remote(setup.base, setup.env, setup.login)
    try:
        yield remote
    finally:
        remote.close()
        subprocess.run(["scancel", "-u", harness.USER], env=slurm_cluster, check=False)
        setup.stop()


pytestmark = [pytest.mark.slurm, pytest.mark.tf]


def test_submit_logs_status_through_ssh_with_one_login_for_twenty_commands(remote: Remote) -> None:
    remote.close()
    before = remote.sshd.accepted()
    proc = remote.hpctf("submit", str(DIGITS), "--site", "cluster", *TINY)
    job_id, run_dir = submitted(proc.stdout)
    assert job_id and run_dir.parent == remote.runs, proc.stdout
    logs = remote.hpctf("logs", str(run_dir), "-f", timeout=300, check=None)
    final = remote.wait_done(run_dir)
    assert final["state"] == "done", (final, logs.stdout, logs.stderr)
    assert "step 20" in logs.stdout or "training complete" in logs.stdout, logs.stdout
    for _ in range(8):
        remote.hpctf("status", "--site", "cluster", str(run_dir))
        remote.hpctf("runs", "--site", "cluster")
    assert remote.hpctf("status", "--site", "cluster", str(remote.runs / "nope"), check=2)
    # --site on a command that has none on the cluster (logs, plot): the laptop's word only.
    said = remote.hpctf("logs", str(run_dir), "--site", "cluster").stdout
    assert "step 20" in said or "training complete" in said, said
    png = remote.base / "curve.png"
    remote.hpctf("plot", str(run_dir), "--site", "cluster", "-o", str(png))
    assert png.read_bytes().startswith(b"\x89PNG")
    # submit, logs, >= 1 status, 16 more, 1 failing, logs, plot: 22 commands and more, one login.
    assert remote.sshd.accepted() - before == 1, remote.sshd.log.read_text()[-2000:]
    assert (run_dir / "DONE").is_file()  # trained on the cluster side, in its runs root


def test_cancel_then_resubmit_through_ssh(remote: Remote) -> None:
    proc = remote.hpctf("submit", str(DIGITS), "--site", "cluster", "--set", "resources.nodes=1",
                        "--set", "train.steps=100000")  # fmt: skip
    job_id, run_dir = submitted(proc.stdout)
    env = {**remote.env, "HPCTF_SITE": "cluster"}
    cancel = subprocess.run(
        [*HPCTF, "cancel", str(run_dir)], env=env, capture_output=True, text=True
    )
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert job_id in cancel.stdout + cancel.stderr
    deadline = time.monotonic() + 120
    while True:  # the cancelled job is COMPLETING for a moment: resubmit says so, exit 2
        again = subprocess.run(
            [*HPCTF, "resubmit", str(run_dir)], env=env, capture_output=True, text=True
        )
        busy = "still COMPLETING" in again.stderr or " owns " in again.stderr
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert again.returncode == 0, again.stdout + again.stderr
    second = re.search(r"submitted job (\d+)", again.stdout)
    assert second and second.group(1) != job_id, again.stdout
    subprocess.run([*HPCTF, "cancel", str(run_dir)], env=env, capture_output=True, check=True)


def test_a_four_point_sweep_through_ssh(remote: Remote) -> None:
    grids = ["--grid", "train.args.hidden=8,16", "--grid", "train.args.learning_rate=0.01,0.02"]
    proc = remote.hpctf("sweep", str(DIGITS), "--site", "cluster", *TINY, *grids)
    assert proc.stdout.strip(), proc.stderr
    sweeps = [p for p in remote.runs.iterdir() if (p / "sweep.json").is_file()]
    assert len(sweeps) == 1, proc.stdout
    points = json.loads((sweeps[0] / "sweep.json").read_text())["points"]
    assert len(points) == 4
    deadline = time.monotonic() + 300
    while not all((Path(p["run_dir"]) / "DONE").is_file() for p in points):  # trained there
        assert time.monotonic() < deadline, remote.hpctf("status", "--site", "cluster").stdout
        time.sleep(2)
    status = remote.hpctf("status", "--site", "cluster", str(sweeps[0]), check=None)
    assert status.returncode == 0, status.stdout + status.stderr


def test_a_submit_killed_mid_way_then_run_again_makes_one_run_and_one_job(remote: Remote) -> None:
    args = [*HPCTF, "submit", str(DIGITS), "--site", "cluster", *TINY, "--set", "name=killed"]
    first = subprocess.Popen(args, env=remote.env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    submits = remote.runs / ".hpctf-submits"
    earlier = set(submits.iterdir()) if submits.is_dir() else set()
    deadline = time.monotonic() + 60
    while not (set(submits.iterdir()) - earlier if submits.is_dir() else None):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)  # the laptop's hpctf and its ssh: the connection drops
    first.wait()
    proc = remote.hpctf("submit", str(DIGITS), "--site", "cluster", *TINY, "--set", "name=killed")
    job_id, run_dir = submitted(proc.stdout)
    killed = [p for p in remote.runs.iterdir() if p.name.startswith("killed-")]
    assert killed == [run_dir], proc.stdout
    events = [json.loads(f.read_text()) for f in sorted((run_dir / "journal").glob("*.json"))]
    assert [e["job_id"] for e in events if e["event"] == "submitted"] == [job_id]


def test_proxyjump_through_a_second_sshd(remote: Remote) -> None:
    remote.close()  # the master to the login host opens anew, through the jump host
    proc = remote.hpctf("runs", "--site", "jumped", check=None)
    assert proc.returncode == 0, proc.stderr
    assert "Accepted publickey" in (remote.base / "jump" / "sshd.log").read_text()


def test_hostile_arguments_reach_the_cluster_as_they_are(remote: Remote) -> None:
    canary = remote.base / "canary"
    for value in HOSTILE:
        text = value.format(canary=canary)
        proc = remote.hpctf("status", "--site", "cluster", "--", text, check=None)
        assert proc.returncode == 2, (text, proc.stdout, proc.stderr)
        assert text in proc.stderr, proc.stderr  # the value arrived as it was
    assert not canary.exists()


def test_another_hpctf_version_on_the_cluster_is_one_line(remote: Remote) -> None:
    remote.close()
    proc = remote.hpctf("runs", "--site", "skewed")
    notes = [line for line in proc.stderr.splitlines() if "0.0.1" in line]
    assert len(notes) == 1, proc.stderr
    remote.close()


def test_python_submit_wait_and_metrics_through_ssh(remote: Remote) -> None:
    """Every method of the Python API's run is a typed call through the one connection: the
    run directory from the submit's typed answer (no text read), its state a RunStatus, a
    user's mistake there a UserError here."""
    code = (
        "import hpctf\n"
        "from hpctf.core.errors import UserError\n"
        f"run = hpctf.submit({str(DIGITS)!r}, site='cluster', set={TINY[1::2]!r})\n"
        "print(repr(run.wait(timeout=300, poll=1)))\n"
        "print(len(run.metrics(frame=False)), run.path)\n"
        "print(run.status()['state'], run.status()['hours'] is not None, run.cancel())\n"
        "print(len(run.logs(rank=0)) > 0, len(run.logs(rank=0, job=run.status()['job'])) > 0)\n"
        "try:\n"
        "    run.logs(rank=9)\n"
        "except UserError as exc:\n"
        "    print('user error:', exc)\n"
    )
    proc = subprocess.run(
        [*HPCTF[:1], "-c", code], env=remote.env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state, rows_and_path, status, logs, refused = proc.stdout.strip().splitlines()[-5:]
    rows, path = rows_and_path.split()
    assert state == "<RunStatus.DONE: 'done'>" and int(rows) >= 1, proc.stdout
    assert Path(path).parent == remote.runs and (Path(path) / "DONE").is_file()
    assert status == "done True []", proc.stdout
    assert logs == "True True", proc.stdout
    assert refused.startswith("user error: ") and "no log for rank 9" in refused, proc.stdout


SEARCH = """\
name: remote-search
resources: {nodes: 1, tasks_per_node: 1, time: "00:10:00"}
train:
  entry: search_task:build
  python_path: [.]
  args: {step_seconds: 0.01}
  steps: 10
  global_batch_size: 8
  log_every_steps: 5
  eval_every_steps: 5
  save_model: false
checkpoint: {every_steps: 5}
sweep:
  parameters:
    train.args.x: {type: float, low: 0.0, high: 1.0, step: 0.25}
  objective: {metric: eval.objective, direction: minimize}
  trials: 2
  parallel: 1
  sampler: random
  seed: 3
"""


def test_python_sweeps_and_searches_through_ssh(remote: Remote, tmp_path: Path) -> None:
    """``hpctf.sweep()`` on a site behind SSH: a grid and a search start on the cluster from
    typed answers; the Sweep's points are runs there, its wait and best typed calls."""
    search = tmp_path / "search"
    search.mkdir()
    (search / "search_task.py").write_text((Path(__file__).parent / "search_task.py").read_text())
    (search / "experiment.yaml").write_text(SEARCH)
    code = (
        "import hpctf\n"
        f"grid = hpctf.sweep({str(DIGITS)!r}, grid={{'train.seed': [1, 2]}}, site='cluster', "
        f"set={TINY[1::2]!r})\n"
        "print(sorted(grid.wait(timeout=300, poll=1).values()), len(grid.points))\n"
        "best = grid.best('loss')\n"
        "print(type(best.run).__name__, best.index in (0, 1), grid.is_search)\n"
        f"found = hpctf.sweep({str(search / 'experiment.yaml')!r}, site='cluster')\n"
        "print(found.is_search, sorted(found.wait(timeout=300, poll=1).values()))\n"
        "top = found.best()\n"
        "print(top is not None and 0.0 <= top.values['train.args.x'] <= 1.0, found.path)\n"
    )
    proc = subprocess.run(
        [*HPCTF[:1], "-c", code], env=remote.env, capture_output=True, text=True, timeout=700
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grid_states, grid_best, search_states, search_best = proc.stdout.strip().splitlines()[-4:]
    assert grid_states == "['done', 'done'] 2", proc.stdout
    assert grid_best == "RemoteRun True False", proc.stdout
    assert search_states == "True ['done', 'done']", proc.stdout + proc.stderr
    ok, path = search_best.split()
    assert ok == "True" and Path(path).parent == remote.runs, proc.stdout


class ArgvWatch:
    """Every process's argument vector on this machine (the laptop and the login host are
    both here), sampled every few milliseconds while it runs: what ``ps`` shows every user."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    argv = cmdline.read_bytes().replace(b"\0", b" ")
                    self.seen.add(argv.decode(errors="replace"))

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_no_secret_of_the_site_in_any_argument_vector_on_either_host(
    remote: Remote, tmp_path: Path
) -> None:
    """A site whose env holds a secret: submit, logs, status, runs, plot, cancel, a Python
    submit with wait and metrics, and doctor from the laptop; no process on either host ever
    had it in its argv (the site travels without it there, or on ssh's stdin)."""
    token = f"tok-{os.getpid()}-{time.time_ns()}"
    sites = Path(remote.env["HPCTF_SITE_PATH"])
    site = yaml.safe_load((sites / "cluster.yaml").read_text())
    site.update(name="secretive", env={"MY_API_TOKEN": token})
    (sites / "secretive.yaml").write_text(yaml.safe_dump(site))
    with ArgvWatch() as watch:
        proc = remote.hpctf("submit", str(DIGITS), "--site", "secretive", *TINY)
        _, run_dir = submitted(proc.stdout)
        remote.wait_done(run_dir)
        remote.hpctf("logs", str(run_dir), "--site", "secretive")
        remote.hpctf("status", "--site", "secretive", "--json", str(run_dir))
        remote.hpctf("runs", "--site", "secretive")
        remote.hpctf("plot", str(run_dir), "--site", "secretive", "-o", str(tmp_path / "p.png"))
        remote.hpctf("cancel", str(run_dir), "--site", "secretive")  # done: nothing to cancel
        script = (
            "import hpctf\n"
            f"run = hpctf.submit({str(DIGITS)!r}, site='secretive', set={TINY[1::2]!r})\n"
            "print(run.wait(timeout=300, poll=1), len(run.metrics(frame=False)))\n"
        )
        python = subprocess.run([*HPCTF[:1], "-c", script], env=remote.env,
                                capture_output=True, text=True, timeout=400)  # fmt: skip
        doctor = remote.hpctf("doctor", "--site", "secretive", check=None, timeout=400)
    assert python.returncode == 0, python.stdout + python.stderr
    assert python.stdout.split()[-2] == "done", python.stdout
    assert doctor.returncode in (0, 1), doctor.stdout + doctor.stderr  # ran on the cluster
    assert len(watch.seen) > 50  # the watch saw the commands' processes
    assert any("_remote" in argv or "_call" in argv for argv in watch.seen)
    leaked = sorted(argv for argv in watch.seen if token in argv)
    assert not leaked, leaked
