"""Shared fixtures: a scratch runs root, a recording fake sbatch, fake Slurm commands
(tests/fake_slurm.py), the example experiment, the test Slurm cluster, and the system tools the
tests need (tests/system-packages.sh installs them).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctf.core.scheduler import slurm, slurm_queries
from tests.paced import ENTRIES_PATH as ENTRIES_PATH  # the tests import both from here
from tests.paced import paced as paced

if TYPE_CHECKING:
    from hpctf.core.run.rundir import RunDir
    from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits" / "experiment.yaml"
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
# The Debian 13 root of the second Slurm (24.11, the workers on Python 3.13), built once.
SLURM2411_ROOT = REPO / "tests" / "slurm" / "debian13-root.sh"
# What a test marked both_slurms runs on: its slurm_cluster is each of these in turn.
SLURM_VERSIONS = ("22.05", "24.11")
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first on every pytest-xdist worker: those on the real Slurm cluster
    (requeues, walltimes, MinJobAge: up to 140 s each, mostly waiting on the scheduler) and the
    compatibility smoke, then those that start TensorFlow, then the quick ones.

    ``--dist worksteal`` first hands worker i the i-th contiguous share of this order, and a
    worker that runs dry steals the end of the longest queue. So each share is made here of its
    own part of each group: one worker starts on its Slurm tests (which mostly wait) while the
    next one starts on its TensorFlow tests (which use the CPUs), then they swap, and what is
    stolen at the end is quick tests, so both workers finish together. Measured on the 2-core
    machine: one share of all the Slurm tests left one worker on the last long ones while the
    other idled (22 % of the CPU time unused); both workers on Slurm tests first left 30-50 %
    of it idle in the first ten minutes."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("slurm") or item.get_closest_marker("compat"):
            return 0
        return 1 if item.get_closest_marker("tf") else 2

    items.sort(key=weight)  # stable: in file order within each group
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers > 1:
        items[:] = _shares_for_worksteal(items, workers, weight)


def _shares_for_worksteal(
    items: list[pytest.Item], workers: int, weight: Callable[[pytest.Item], int]
) -> list[pytest.Item]:
    """``items`` (sorted by ``weight``) reordered so that each of the contiguous shares xdist's
    worksteal hands out first (worker i: what is left over the workers left, rounded down)
    holds its part of each weight but the last, filled up with the last. A module's tests of
    one weight stay in one share: module-scoped fixtures (the tiny benchmark run, the sshd
    laptop, the 3-node cluster) are made once per worker that runs them. Costliest modules
    first, each to the share that holds the least cost of that weight yet: a test that runs
    TensorFlow jobs on the Slurm cluster costs ten (tens of seconds), any other one."""

    def cost(item: pytest.Item) -> int:
        slurm_jobs = item.get_closest_marker("slurm") and item.get_closest_marker("tf")
        return 10 if slurm_jobs else 1

    sizes, left = [], len(items)
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    last = max(map(weight, items), default=0)
    groups = sorted({weight(item) for item in items} - {last})
    dealt = {group: [list[pytest.Item]() for _ in range(workers)] for group in groups}
    for group in groups:
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            if weight(item) == group:
                modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        held = [0] * workers
        for tests in sorted(modules.values(), key=lambda t: sum(map(cost, t)), reverse=True):
            least = held.index(min(held))
            dealt[group][least] += tests
            held[least] += sum(map(cost, tests))
    for index, share in enumerate(shares):
        # Every other share takes its groups the other way round: one worker waits on Slurm
        # while the next trains TensorFlow, then they swap.
        for group in groups if index % 2 == 0 else groups[::-1]:
            share += dealt[group][index]
    fill = iter([item for item in items if weight(item) == last])
    for share, size in zip(shares, sizes, strict=True):
        while len(share) < size:
            share.append(next(fill))
    # A share dealt more than its size (too few quick tests to fill the others): still every
    # test once, the shares only less even.
    return [item for share in shares for item in share] + list(fill)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``both_slurms`` runs once on each Slurm of SLURM_VERSIONS: its
    ``slurm_cluster`` is the 22.05 cluster, then the 24.11 one (ids ``[slurm22.05]``,
    ``[slurm24.11]``). Every other test's is the 22.05 one, as before."""
    if "slurm_cluster" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_slurms"
    ):
        metafunc.parametrize(
            "slurm_cluster",
            SLURM_VERSIONS,
            indirect=True,
            ids=[f"slurm{v}" for v in SLURM_VERSIONS],
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which Slurm 24.11 root the run used, and how long it took to build (once)."""
    proc = subprocess.run(
        [str(SLURM2411_ROOT), "--path"], capture_output=True, text=True, check=False
    )
    marker = Path(proc.stdout.strip()) / ".hpctf-root-complete"
    if proc.returncode == 0 and marker.is_file():
        lines = marker.read_text().split("\n")
        terminalreporter.write_line(
            f"Slurm 24.11 root {marker.parent}: {'; '.join(line for line in lines if line)}"
        )


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "runs"
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(root))
    return root


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake sbatch first on PATH that records its argv and prints a job id (unit tests only)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    record = tmp_path / "sbatch-calls"
    script = bin_dir / "sbatch"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\necho 4242\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    from tests.fake_slurm import FakeSlurm  # it imports this module

    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    # `hpctf status` looks in every site's runs_root, most of them under ~: not the real one.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(slurm_queries, "RETRY_PAUSES_S", (0.0, 0.0))
    return fake


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tools_required() -> bool:
    """Whether a missing tool or test cluster fails the tests (`make test`, CI) or skips them."""
    return bool(os.environ.get("HPCTF_REQUIRE_SLURM") or os.environ.get("CI"))


def require_tool(name: str) -> str:
    """The path of command ``name``. Missing, it fails the calling test where tools are
    required (HPCTF_REQUIRE_SLURM or CI) and skips it elsewhere: never an error from deep inside
    the test, and never found only because an earlier test happened to install it."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: run tests/system-packages.sh as root (make test does)"
        if tools_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(autouse=True)
def signals_kept() -> Iterator[None]:
    """A command run in pytest's own process may ignore or catch a signal for the rest of it
    (search-next ignores SIGTERM, as it must under Slurm): restored after each test, so a
    process a later test starts does not inherit SIGTERM ignored (and outlive terminate())."""
    watched = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
    saved = {signum: signal.getsignal(signum) for signum in watched}
    yield
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def secrets_forgotten() -> Iterator[None]:
    """A command remembers the secrets of the run it read for the rest of its process
    (hpctf.core.secrets.remember); a test that runs commands in pytest's own process starts
    knowing none, as a command does."""
    yield
    from hpctf.core import secrets

    with secrets._known_lock:
        secrets._known.clear()
        secrets._ordered = ()


@pytest.fixture(scope="session", autouse=True)
def no_job_output_in_the_checkout() -> Iterator[None]:
    """No test leaves a job's output (sbatch's default slurm-<id>.out in the submitting
    directory) in the checkout: every job a test submits writes inside its tmp dir."""
    places = {REPO, Path.cwd()}
    before = {p for place in places for p in place.glob("slurm-*.out")}
    yield
    left = sorted({p for place in places for p in place.glob("slurm-*.out")} - before)
    if left:
        pytest.fail(
            f"a test left job output in the checkout: {', '.join(map(str, left))} "
            "(give its sbatch --output inside tmp_path, or cwd=tmp_path)",
            pytrace=False,
        )


def xdist_cluster(env: dict[str, str], worker: str) -> dict[str, str]:
    """A cluster of its own for each pytest-xdist worker (``gw0``, ``gw1``, ...): its state
    dir, slurmctld port and first job id moved by the worker's number, so TF's port windows
    (drawn from job ids) and the daemons' ports of two clusters never meet."""
    match = re.fullmatch(r"gw(\d+)", worker)
    if not match:
        return {}
    number = int(match.group(1))
    return {
        "HPCTF_SLURM_DIR": f"{env['HPCTF_SLURM_DIR']}-{worker}",
        "HPCTF_SLURM_PORT": str(int(env.get("HPCTF_SLURM_PORT", "16817")) + 400 * number),
        "HPCTF_SLURM_FIRST_JOB_ID": str(
            int(env.get("HPCTF_SLURM_FIRST_JOB_ID", "1")) + 50_000 * number
        ),
    }


@pytest.fixture(scope="session")
def checkout_for_others() -> Iterator[Path]:
    """This checkout where a second unix user (the SSH login user, the jobs it submits) can
    read it, whatever folder the clone sits in (tests/sshd.py's reachable_checkout)."""
    from tests import sshd

    path = sshd.reachable_checkout()
    try:
        yield path
    finally:
        sshd.release_checkout(path)


def start_cluster(env: dict[str, str], checkout: Path) -> Iterator[dict[str, str]]:
    """tests/slurm/cluster.sh start with ``env``; yields the cluster's environment for the tests
    (SLURM_CONF, and PATH with the root's clients first where the cluster runs in a root) and
    stops it after. Failing to start is fatal where Slurm is required."""
    state = Path(env["HPCTF_SLURM_DIR"])
    proc = subprocess.run(
        [str(CLUSTER), "start"], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        message = f"test Slurm cluster did not start:\n{proc.stdout}\n{proc.stderr}"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    cluster = {**env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    if env.get("HPCTF_SLURM_ROOT"):
        cluster["PATH"] = f"{state / 'bin'}{os.pathsep}{env['PATH']}"
    try:
        # The checkout as other users read it: bound before the nodes' namespaces were made.
        yield {**cluster, "HPCTF_TEST_CHECKOUT": str(checkout)}
    finally:
        subprocess.run([str(CLUSTER), "stop"], env=env, check=False)


@pytest.fixture(scope="session")
def slurm2205_cluster(checkout_for_others: Path) -> Iterator[dict[str, str]]:
    """The test cluster on the machine's own Slurm (Debian 12's 22.05), started once.

    HPCTF_SLURM_DIR, HPCTF_SLURM_PORT and HPCTF_SLURM_FIRST_JOB_ID (tests/slurm/cluster.sh)
    pass through, so a second test run can keep its cluster apart from one already running.
    """
    # Not under pytest's tmp dir: munged runs as the munge user and cannot enter root's 0700 dirs.
    env = {**os.environ, "HPCTF_SLURM_DIR": os.environ.get("HPCTF_SLURM_DIR", "/tmp/hpctf-slurm")}
    env.update(xdist_cluster(env, os.environ.get("PYTEST_XDIST_WORKER", "")))
    for cluster in start_cluster(env, checkout_for_others):
        for tool in ("sbatch", "srun", "scontrol", "scancel"):  # what the Slurm tests call
            require_tool(tool)
        os.environ["SLURM_CONF"] = cluster["SLURM_CONF"]
        try:
            yield cluster
        finally:
            os.environ.pop("SLURM_CONF", None)


def slurm2411_root() -> Path:
    """The Debian 13 root with Slurm 24.11 and Python 3.13 (tests/slurm/debian13-root.sh):
    built now when the cache lacks it (about 8 minutes, once; its log says how long)."""
    if os.geteuid() != 0:
        message = "the Slurm 24.11 cluster runs in a chroot: needs root"
        if tools_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    proc = subprocess.run(
        [str(SLURM2411_ROOT)], capture_output=True, text=True, check=False, timeout=3600
    )
    if proc.returncode != 0:
        message = f"the Slurm 24.11 root could not be built:\n{proc.stderr}"
        if tools_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return Path(proc.stdout.strip())


@pytest.fixture(scope="session")
def slurm2411_cluster(checkout_for_others: Path) -> Iterator[dict[str, str]]:
    """The second test cluster: Slurm 24.11 from a Debian 13 root (its daemons, its clients
    and the jobs, whose workers run Python 3.13 and the newest TensorFlow), beside the 22.05
    one: its own state dir, ports and job ids (HPCTF_SLURM2411_DIR, HPCTF_SLURM2411_PORT,
    HPCTF_SLURM2411_FIRST_JOB_ID; each xdist worker's moved as for the 22.05 cluster)."""
    root = slurm2411_root()
    env = {
        **os.environ,
        "HPCTF_SLURM_ROOT": str(root),
        # The root's venv is seen where this Python's is: a rendered script's PYTHON.
        "HPCTF_ROOT_VENV_AT": sys.prefix,
        "HPCTF_SLURM_DIR": os.environ.get("HPCTF_SLURM2411_DIR", "/tmp/hpctf-slurm2411"),
        "HPCTF_SLURM_PORT": os.environ.get("HPCTF_SLURM2411_PORT", "17017"),
        "HPCTF_SLURM_FIRST_JOB_ID": os.environ.get("HPCTF_SLURM2411_FIRST_JOB_ID", "25001"),
    }
    env.update(xdist_cluster(env, os.environ.get("PYTEST_XDIST_WORKER", "")))
    yield from start_cluster(env, checkout_for_others)


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The test cluster a Slurm test runs on: the 22.05 one, or for a test marked
    ``both_slurms`` each of SLURM_VERSIONS in turn (pytest_generate_tests). Both clusters live
    for the session; this only points the test's process at the one asked for (SLURM_CONF and
    PATH, which pytest's own calls of hpctf's Slurm functions read), for that test alone. (As
    a session fixture it left the 24.11 root's clients first on PATH after a 24.11 test, until
    the next 22.05 one: the tiny benchmark run after it sent 24.11 RPCs to its 22.05 clusters,
    "Invalid Protocol Version 10752", and their nodes never came up.)"""
    version = getattr(request, "param", SLURM_VERSIONS[0])
    if version == SLURM_VERSIONS[0]:
        yield request.getfixturevalue("slurm2205_cluster")
        return
    cluster = request.getfixturevalue("slurm2411_cluster")
    with pointed_at(cluster):
        yield cluster


@contextmanager
def pointed_at(cluster: dict[str, str]) -> Iterator[None]:
    """This process's own Slurm calls (hpctf's functions a test calls, such as
    :func:`wait_for_job`) go to ``cluster`` while inside: its SLURM_CONF, its PATH (a root's
    clients first) and its HPCTF_ROOT_VENV_AT, or none. For a test that drives both Slurms."""
    names = ("SLURM_CONF", "PATH", "HPCTF_ROOT_VENV_AT")
    saved = {name: os.environ.get(name) for name in names}

    def point(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    point({name: cluster.get(name) for name in names})
    try:
        yield
    finally:
        point(saved)


def wait_for_job(job_id: str, timeout: float = 300) -> dict[str, str]:
    """hpctf's own :func:`slurm.wait_for_job` (sbatch --wait polls too slowly), polling every
    0.5 s; a test failure when the job is not final after ``timeout`` seconds or forgotten."""
    info = slurm.wait_for_job(job_id, timeout, poll=0.5)
    if not info:
        raise AssertionError(
            f"job {job_id} not finished after {timeout} s: {slurm.job_info(job_id)}"
        )
    return info


# --- reading what a run left behind (one copy, used by every layer of tests) -----------------

HPCTF = [sys.executable, "-m", "hpctf"]


def submitted(stdout: str) -> tuple[str | None, Path]:
    """The job id (None for a local site) and run directory that `hpctf submit` printed."""
    job = re.search(r"^submitted job (\d+)$", stdout, re.M)
    run_dir = re.search(r"^run directory: (\S+)$", stdout, re.M)
    assert run_dir, f"no run directory in: {stdout}"
    return (job.group(1) if job else None), Path(run_dir.group(1))


def run_dir_from(stdout: str) -> Path:
    return submitted(stdout)[1]


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step from metrics.jsonl; a step logged twice (before a kill, after the resume)
    keeps its last value."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the chief's checkpoints, oldest first."""
    return sorted(
        int(p.name.split("-")[1].split(".")[0])
        for p in (run_dir / "checkpoints").glob("ckpt-*.index")
    )


def line_of(path: Path, text: str) -> int:
    """The number of the line of ``path`` that holds ``text`` (for file:line in messages)."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def files_holding(root: Path, *secrets: str) -> dict[str, int]:
    """Every file under ``root`` whose bytes hold one of ``secrets`` -> its mode."""
    found = {}
    for file in root.rglob("*"):
        if file.is_file() and not file.is_symlink():
            data = file.read_bytes()
            if any(s.encode() in data for s in secrets):
                found[str(file.relative_to(root))] = file.stat().st_mode & 0o777
    return found


OTHER_USER = "hpctf-other"


def other_user() -> pwd.struct_passwd:
    """A second real unix user (made once, with useradd, as root); skips where none can be."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a second unix user")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", OTHER_USER], check=True)
        return pwd.getpwnam(OTHER_USER)


def submit_script(
    cwd: Path, script: Path, args: Sequence[str], *sets: str, workers: int = 2
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``hpctf submit SCRIPT --site local`` on ``workers`` local workers, its arguments
    ``args`` (train.script_args), a progress line every step and no save by steps, each of
    ``sets`` one more ``--set``; the finished submit and the run directory."""
    given = [
        f"resources.tasks_per_node={workers}",
        "train.log_every_steps=1",
        "checkpoint.every_steps=1000",
        f"train.script_args={json.dumps(list(args))}",
        *sets,
    ]
    proc = subprocess.run(
        [
            *HPCTF,
            "submit",
            str(script),
            "--site",
            "local",
            *(a for s in given for a in ("--set", s)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=cwd,
    )
    return proc, run_dir_from(proc.stdout)


def made_run(root: Path, name: str, sets: Sequence[str] = ()) -> RunDir:
    """A run directory under ``root`` as submit makes it (config, script, snapshot,
    ``created``), with its job 4242 submitted; ``sets``: more ``--set`` values."""
    from hpctf.core.run import journal
    from hpctf.core.run.rundir import RunDir, create_run_dir, plan_run_dir
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.render import render

    env = {**os.environ, "HPCTF_RUNS_ROOT": str(root)}
    config = load_config(DIGITS, "local", ["train.steps=100", *sets], env).config
    run = RunDir(plan_run_dir(config).path.with_name(name))
    create_run_dir(run, config, render(config, run.path))
    journal.record_submitted(run, "4242")
    return run
