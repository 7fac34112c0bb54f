"""``train.preflight: quick``: a rank whose node fails a cheap check ends before TensorFlow's
strategy, naming node and check in its log and in the journal; job-end carries it on.

The worker runs for real (``python -m hpctf worker RUN_DIR``) with the environment srun would
give one task; every failure here happens before TensorFlow is imported, so none needs it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctf import __version__
from hpctf.compute.cluster.spec import ClusterSpec, cluster_spec
from hpctf.compute.doctor.nccl_env import read_interfaces
from hpctf.compute.doctor.node_checks import Check
from hpctf.compute.doctor.versions import version_check
from hpctf.compute.start.quick_preflight import (
    before_tensorflow,
    check_node,
    failure_line,
    judge,
)
from hpctf.core.errors import NODE_CHECK_EXIT
from hpctf.core.run import journal
from hpctf.core.run.history import RunHistory, read_history, record_end
from hpctf.core.run.rundir import RunDir
from hpctf.login.submitting.local import task_environment
from tests.conftest import DIGITS, HPCTF, write

JOB_ID = 7


def make_run(tmp_path: Path, *sets: str, env: str = "{}") -> RunDir:
    """A run directory of the digits example on a Slurm-like site with ``env``."""
    sites = write(
        tmp_path / "sites" / "s.yaml",
        f"name: s\nextends: local-slurm\nenv: {env}\n",
    ).parent
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [*HPCTF, "render", str(DIGITS), "--site", "s", "-o", str(tmp_path / "job.sbatch"),
         "--set", "resources.nodes=1", *(a for s in sets for a in ("--set", s))],
        env={**os.environ, "HPCTF_SITE_PATH": str(sites), "HPCTF_RUNS_ROOT": str(runs)},
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = runs.iterdir()
    return RunDir(path)


def task_env() -> dict[str, str]:
    return task_environment(os.environ, JOB_ID, 1, 0)


def worker(run: RunDir) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCTF, "worker", str(run.path)],
        env=task_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def spec_of(run: RunDir) -> ClusterSpec:
    site = run.load_config().site
    return cluster_spec(task_env(), site.port_range, site.hostname_template)


@pytest.fixture
def taken(tmp_path: Path) -> Iterator[tuple[RunDir, int]]:
    """A run directory, and its rank 0's port held by a listener of this test."""
    run = make_run(tmp_path)
    port = spec_of(run).port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        yield run, port


def events(run: RunDir, name: str) -> list[dict[str, object]]:
    return [e for e in run.events() if e["event"] == name]


def test_a_taken_port_ends_the_rank_naming_node_and_check(taken: tuple[RunDir, int]) -> None:
    run, port = taken
    proc = worker(run)
    assert proc.returncode == NODE_CHECK_EXIT == 69, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if "node check failed" in x]
    assert line.split(": ", 1)[1].startswith(
        f"error: node check failed on localhost (rank 0): port: port {port} on localhost is "
        "taken (Address already in use)"
    ), line
    assert f"; fix: find the listener with `ss -ltnp 'sport = :{port}'` on localhost" in line
    assert "import tensorflow" not in proc.stdout and "Traceback" not in proc.stderr
    (record,) = events(run, journal.NODE_CHECK_FAILED)
    assert {k: record[k] for k in ("job_id", "node", "rank", "check")} == {
        "job_id": str(JOB_ID),
        "node": "localhost",
        "rank": 0,
        "check": "port",
    }


def test_with_preflight_off_a_taken_port_is_the_plain_error_it_was(
    tmp_path: Path,
) -> None:
    run = make_run(tmp_path, "train.preflight=off")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", spec_of(run).port))
        listener.listen()
        proc = worker(run)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is taken" in proc.stderr and not events(run, journal.NODE_CHECK_FAILED)


def test_infiniband_named_by_the_site_but_absent_fails_the_node(tmp_path: Path) -> None:
    if Path("/sys/class/infiniband").exists():
        pytest.skip("this machine has InfiniBand devices")
    run = make_run(tmp_path, env='{NCCL_IB_HCA: "=mlx5_0"}')
    env = {**task_env(), "NCCL_IB_HCA": "=mlx5_0"}  # as the batch script exports it
    proc = subprocess.run(
        [*HPCTF, "worker", str(run.path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == NODE_CHECK_EXIT, proc.stdout + proc.stderr
    assert (
        "node check failed on localhost (rank 0): infiniband: NCCL_IB_HCA==mlx5_0 but this "
        "node has no /sys/class/infiniband" in proc.stdout
    ), proc.stdout
    assert [e["check"] for e in events(run, journal.NODE_CHECK_FAILED)] == ["infiniband"]


def test_the_checks_before_tensorflow_pass_here_and_a_warning_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = make_run(tmp_path)
    spec = spec_of(run)
    checks = before_tensorflow(spec, {})
    assert [c.check for c in checks] == [
        "memlock",
        "infiniband",
        "nccl_ib_hca",
        "nccl_socket_ifname",
        "verbs",
        "hostnames",
        "port",
    ]
    assert all(c.status in {"ok", "skip", "warn"} for c in checks), checks
    caplog.set_level("INFO", logger="hpctf.worker")
    warned = Check("memlock", "warn", "64 KiB with InfiniBand: RDMA may fail", "raise it")
    assert judge(run, spec, [warned, Check("port", "ok", "free")]) is None
    assert "node check memlock on localhost: 64 KiB with InfiniBand" in caplog.text
    assert "node checks on localhost: memlock warn, port ok" in caplog.text
    assert not events(run, journal.NODE_CHECK_FAILED)
    failed = Check("infiniband", "fail", "mlx5_0:1 DOWN", "check the link")
    assert failure_line(spec, failed) == (
        "node check failed on localhost (rank 0): infiniband: mlx5_0:1 DOWN; fix: check the link"
    )


def test_job_end_records_the_nodes_that_failed_a_check(tmp_path: Path) -> None:
    """srun reports 143 when it killed the healthy ranks; the records still name the node."""
    run = make_run(tmp_path)
    journal.record_started(run, "41", None, "USR2")
    journal.record_node_check_failed(run, "41", "node2", 1, "port", "d", "f")
    assert record_end(run, read_history(run), "41", 143, "USR2")[0] == "failed"
    (ended,) = events(run, journal.ENDED)
    assert ended["node_checks_failed"] == [{"node": "node2", "rank": 1, "check": "port"}]
    journal.record_started(run, "41", None, "USR2")
    record_end(run, read_history(run), "41", 0, "USR2")
    assert "node_checks_failed" not in events(run, journal.ENDED)[-1]
    assert json.loads(run.config_file.read_text())["experiment"]["train"]["preflight"] == "quick"


def test_two_tensorflow_packages_fail_the_node_before_the_import(tmp_path: Path) -> None:
    """`pip install tf_keras` beside tensorflow-cpu leaves a second distribution of the
    `tensorflow` module (here its dist-info alone, on PYTHONPATH): the worker's quick preflight
    (and doctor's, the same check) fails the node naming both and the fix."""
    run = make_run(tmp_path)
    info = tmp_path / "site" / "tensorflow_intel-2.21.0.dist-info"
    write(info / "METADATA", "Metadata-Version: 2.1\nName: tensorflow-intel\nVersion: 2.21.0\n")
    write(info / "top_level.txt", "tensorflow\n")
    env = {**task_env(), "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(
        [*HPCTF, "worker", str(run.path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == NODE_CHECK_EXIT, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if "node check failed" in x]
    assert "tensorflow: 2 TensorFlow packages are installed for" in line, line
    both = sorted([_installed_tensorflow(), "tensorflow-intel"])
    assert f": {', '.join(both)}; they overwrite each other's files" in line, line
    assert f"-m pip uninstall -y {' '.join(both)}, then install one" in line, line
    assert [e["check"] for e in events(run, journal.NODE_CHECK_FAILED)] == ["tensorflow"]


def _installed_tensorflow() -> str:
    import importlib.metadata

    (name,) = importlib.metadata.packages_distributions()["tensorflow"]
    return name.replace("_", "-").lower()


def test_one_tensorflow_package_passes() -> None:
    from hpctf.compute.doctor.node_checks import tensorflow_packages_check

    assert tensorflow_packages_check(["tensorflow-cpu"], "python") is None
    assert tensorflow_packages_check([], "python") is None
    two = tensorflow_packages_check(["tensorflow", "tensorflow-cpu"], "/v/bin/python")
    assert two is not None and two.status == "fail" and "/v/bin/python -m pip" in two.fix


def test_tensorflow_packages_are_found_from_their_metadata_folders(tmp_path: Path) -> None:
    from hpctf.compute.doctor.node_checks import _tensorflow_packages

    site, other = tmp_path / "site", tmp_path / "other"

    def dist(where: Path, folder: str, top_level: str | None = None, record: str = "") -> None:
        (where / folder).mkdir(parents=True)
        if top_level is not None:
            (where / folder / "top_level.txt").write_text(top_level)
        if record:
            (where / folder / "RECORD").write_text(record)

    dist(site, "tensorflow_cpu-2.21.0.dist-info", top_level="tensorflow\n")
    dist(site, "tensorflow_estimator-2.15.0.dist-info", top_level="tensorflow_estimator\n")
    dist(site, "tensorflow_io_gcs_filesystem-0.37.dist-info", record="tensorflow_io/a.py,,\n")
    dist(site, "tf_keras-2.21.0.dist-info", top_level="tf_keras\n")
    dist(site, "numpy-2.0.dist-info", record="tensorflow/never-read.py,,\n")  # no TF name
    dist(other, "tf_nightly-2.22.0.dev1.dist-info", record="tf_nightly/x,,\ntensorflow/x.py,,\n")
    dist(other, "tensorflow-2.20.0.egg-info")  # neither file: says nothing
    gone = str(tmp_path / "gone")
    assert _tensorflow_packages([str(site)]) == ("tensorflow-cpu",)
    assert _tensorflow_packages([str(site), gone, str(other)]) == ("tensorflow-cpu", "tf-nightly")
    # This venv's own TensorFlow, as importlib.metadata names it.
    assert _tensorflow_packages() == (_installed_tensorflow(),)


def test_a_worker_whose_ifname_matches_nothing_here_stops_in_one_line(tmp_path: Path) -> None:
    # This machine's own /sys/class/net (eth0, lo, ...): no interface begins with ib0.
    if any(i.name.startswith("ib0") for i in (read_interfaces() or [])):
        pytest.skip("this machine has an ib0 interface")
    run = make_run(tmp_path, env="{NCCL_SOCKET_IFNAME: ib0}")
    env = {**task_env(), "NCCL_SOCKET_IFNAME": "ib0"}  # as the batch script exports it
    proc = subprocess.run(
        [*HPCTF, "worker", str(run.path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == NODE_CHECK_EXIT, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "node check failed" in line]
    assert "nccl_socket_ifname: NCCL_SOCKET_IFNAME=ib0 matches none of this node's " in line
    assert "lo" in line and "fix: `ip -br addr`" in line


def test_the_workers_hpctf_is_compared_with_the_one_that_started_the_job(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    journal.record_started(run, "7", None, "USR2")  # what the host's job-start writes
    events = run.events()
    assert events[-1]["hpctf"] == __version__
    history = RunHistory.of(events)
    assert version_check(history, "7", __version__, None).status == "ok"
    image = "/shared/hpctf-old.sqsh"
    older = version_check(history, "7", "0.0.1", image)
    assert (older.status, older.detail) == (
        "warn",
        f"hpctf 0.0.1 in container image {image} but {__version__} on the host (job-start): "
        "the two share the run's journal",
    )
    assert f"pip install hpctf=={__version__}" in older.fix
    assert version_check(history, "8", "0.0.1", image).status == "skip"  # another job's start
    # The chief runs it with the node checks; other ranks do not read the journal for it.
    spec = spec_of(run)
    assert spec.is_chief
    assert check_node(run, spec, task_env()) is None
