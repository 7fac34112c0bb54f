"""Cluster resolution against the real Slurm binaries (slurm-wlm 22.05).

* ``scontrol show hostnames`` is the reference for nodelist expansion: a table of tricky lists
  and generated ones (hypothesis) must expand exactly as Slurm expands them. scontrol needs only
  a config file for this, not a running cluster.
* On the test cluster (tests/slurm/cluster.sh: node1, node2, 2 CPUs and 2 fake GPUs each, one
  IP namespace), ``srun ... hpctf tfconfig`` shows what every task of a real step gets:
  its index equals SLURM_PROCID, (host, port) pairs are distinct, GPUs are bound per task, and
  a rank placed elsewhere than computed fails with expected and actual.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctf.core.scheduler.hostnames import expand_nodelist
from tests.conftest import DIGITS, HPCTF, require_tool, submitted, wait_for_job, write

pytestmark = pytest.mark.slurm


# --- nodelists: python-hostlist against scontrol -------------------------------------------


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment in which `scontrol show hostnames` works without any daemon."""
    require_tool("scontrol")
    conf = tmp_path_factory.mktemp("scontrol") / "slurm.conf"
    conf.write_text("ClusterName=hostnames\nSlurmctldHost=localhost\n")
    yield {**os.environ, "SLURM_CONF": str(conf)}


def scontrol_hostnames(text: str, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", text],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0 and "Invalid" not in proc.stdout, proc.stdout + proc.stderr
    return proc.stdout.split()


TRICKY_NODELISTS = [
    "single",
    "node[9-10]",  # TF's resolver sorts these as strings
    "node[08-11]",  # zero padding kept
    "n[098-101]",  # a padded range crossing a digit count
    "n[8-12]",  # an unpadded one
    "n[99-101]",
    "n[0001-0003]",
    "n[000-001]",
    "n[01-3]",  # padding taken from the lower bound
    "n[1-3,5,07-09]",  # several ranges and widths in one bracket
    "r[1-2]n[01-03]",  # several bracket groups: the last varies fastest
    "rack[1-2]-node[001-002]",
    "a[1-2]-ib[3-4]",
    "gpu[001-003],cpu[1-2],login01",  # comma list of different prefixes
    "n1,n10,n2",  # Slurm's order is kept, not sorted
    "n_a[1-2],n-b[7-8]",
    "n[1-2],n[1-2]",  # duplicates are kept (cluster_spec rejects them separately)
]


@pytest.mark.parametrize("text", TRICKY_NODELISTS)
def test_nodelist_expands_like_scontrol(text: str, scontrol_env: dict[str, str]) -> None:
    assert expand_nodelist(text) == scontrol_hostnames(text, scontrol_env)


def _range(draw: st.DrawFn) -> str:
    low = draw(st.integers(0, 120))
    high = low + draw(st.integers(0, 12))
    width = draw(st.integers(len(str(low)), 4))
    if high == low:
        return f"{low:0{width}d}"
    return f"{low:0{width}d}-{high:0{width}d}"


@st.composite
def nodelists(draw: st.DrawFn) -> str:
    """Slurm nodelists: prefixes, 0-2 bracket groups of ranges, comma-joined parts."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["n", "gpu", "r", "node-", "a_b"]))
        for group in range(draw(st.integers(0, 2))):
            if group:
                part += draw(st.sampled_from(["n", "-", "x"]))
            ranges = [_range(draw) for _ in range(draw(st.integers(1, 3)))]
            part += f"[{','.join(ranges)}]"
        if part[-1] not in "]":
            part += str(draw(st.integers(0, 999)))
        parts.append(part)
    return ",".join(parts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=nodelists())
def test_generated_nodelists_expand_like_scontrol(text: str, scontrol_env: dict[str, str]) -> None:
    assert expand_nodelist(text) == scontrol_hostnames(text, scontrol_env)


# --- srun ... hpctf tfconfig on the test cluster -------------------------------------------


def srun(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """srun with per-task labels ("3: ...") on stdout and stderr."""
    proc = subprocess.run(
        ["srun", "--label", *args], env=env, capture_output=True, text=True, timeout=180
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def by_task(text: str) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(\d+): (.*)$", line)
        if match:
            lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


@pytest.mark.both_slurms
def test_four_tasks_on_two_nodes_get_distinct_ports_and_their_procid(
    slurm_cluster: dict[str, str],
) -> None:
    proc = srun(slurm_cluster, "-N2", "--ntasks-per-node=2", *HPCTF, "tfconfig", "--check")
    configs = {task: json.loads(lines[0]) for task, lines in by_task(proc.stdout).items()}
    assert sorted(configs) == [0, 1, 2, 3]
    for procid, config in configs.items():
        assert config["task"] == {"type": "worker", "index": procid}
    (workers,) = {tuple(c["cluster"]["worker"]) for c in configs.values()}
    assert len(set(workers)) == 4  # all "nodes" share one IP namespace here: ports must differ
    assert [w.rpartition(":")[0] for w in workers] == ["node1", "node1", "node2", "node2"]
    # The self-check passed on every task: each sits on the node its entry names.
    notes = by_task(proc.stderr)
    for procid in range(4):
        assert f"on node node{procid // 2 + 1} " in notes[procid][0]


def test_one_worker_per_gpu_binds_each_task_to_its_gpu(slurm_cluster: dict[str, str]) -> None:
    proc = srun(
        slurm_cluster, "-N2", "--ntasks-per-node=2", "--gpus-per-node=2", *HPCTF, "tfconfig"
    )
    notes = by_task(proc.stderr)
    for procid in range(4):
        local_id = procid % 2
        assert (
            f"SLURM_LOCALID {local_id}); CUDA_VISIBLE_DEVICES={local_id} (one worker"
            in (notes[procid][0])
        )


def test_gpus_bound_by_slurm_stay_as_they_are(slurm_cluster: dict[str, str]) -> None:
    proc = srun(
        slurm_cluster, "-N1", "--ntasks-per-node=2", "--gpus-per-task=1", *HPCTF, "tfconfig"
    )
    notes = by_task(proc.stderr)
    assert "GPUs 0 (as Slurm set them" in notes[0][0]
    assert "GPUs 1 (as Slurm set them" in notes[1][0]


def test_one_worker_per_node_sees_all_its_gpus(slurm_cluster: dict[str, str]) -> None:
    proc = srun(
        slurm_cluster, "-N2", "--ntasks-per-node=1", "--gpus-per-node=2", *HPCTF, "tfconfig"
    )
    notes = by_task(proc.stderr)
    assert all("GPUs 0,1 (as Slurm set them" in notes[t][0] for t in (0, 1))


@pytest.mark.parametrize(
    ("ntasks", "distribution", "nodes"),
    [
        (4, "block:block", ["node1", "node1", "node2", "node2"]),
        (5, "cyclic", ["node1", "node2", "node1", "node2", "node1"]),
        (7, "plane=2", ["node1", "node1", "node2", "node2", "node1", "node1", "node2"]),
        (3, "cyclic:cyclic", ["node1", "node2", "node1"]),
    ],
)
def test_distributions_srun_announces_are_followed(
    slurm_cluster: dict[str, str], ntasks: int, distribution: str, nodes: list[str]
) -> None:
    # -O (overcommit): more tasks than the 2 CPUs per node, for uneven layouts.
    proc = srun(
        slurm_cluster,
        "-N2",
        f"-n{ntasks}",
        "-O",
        f"--distribution={distribution}",
        *HPCTF,
        "tfconfig",
    )
    configs = {task: json.loads(lines[0]) for task, lines in by_task(proc.stdout).items()}
    assert [configs[t]["task"]["index"] for t in range(ntasks)] == list(range(ntasks))
    workers = configs[0]["cluster"]["worker"]
    assert [w.rpartition(":")[0] for w in workers] == nodes


def test_misplaced_rank_fails_with_expected_and_actual(slurm_cluster: dict[str, str]) -> None:
    # srun places ranks cyclically, but the tasks are told "block": ranks 1 and 2 sit elsewhere.
    proc = srun(
        slurm_cluster,
        "-N2",
        "-n4",
        "--distribution=cyclic",
        "env",
        "SLURM_DISTRIBUTION=block",
        *HPCTF,
        "tfconfig",
        check=False,
    )
    assert proc.returncode != 0
    errors = {t: " ".join(lines) for t, lines in by_task(proc.stderr).items()}
    assert (
        "SLURM_PROCID 1 is not where the cluster spec puts it: SLURMD_NODENAME expected node1 "
        "actual node2; SLURM_NODEID expected 0 actual 1; SLURM_LOCALID expected 1 actual 0"
    ) in errors[1]
    assert "SLURMD_NODENAME expected node2 actual node1" in errors[2]


def test_arbitrary_distribution_is_refused(slurm_cluster: dict[str, str]) -> None:
    proc = srun(
        slurm_cluster,
        "-n3",
        "--distribution=arbitrary",
        "-w",
        "node2,node1,node2",
        *HPCTF,
        "tfconfig",
        check=False,
    )
    assert proc.returncode != 0
    assert "SLURM_DISTRIBUTION=arbitrary" in proc.stderr


def test_ipoib_names_that_do_not_resolve_fail_the_check(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    site = write(
        tmp_path / "ib.yaml",
        "name: ib\nscheduler: slurm\nruns_root: /tmp\nhostname_template: '{host}-ib'\n",
    )
    proc = srun(slurm_cluster, "-N2", *HPCTF, "tfconfig", "--site", str(site))
    workers = json.loads(by_task(proc.stdout)[0][0])["cluster"]["worker"]
    assert [w.rpartition(":")[0] for w in workers] == ["node1-ib", "node2-ib"]
    failed = srun(
        slurm_cluster, "-N2", *HPCTF, "tfconfig", "--site", str(site), "--check", check=False
    )
    assert failed.returncode != 0
    assert "address 'node2-ib' of node node2 (hostname_template '{host}-ib') does not resolve" in (
        failed.stderr
    )


def test_tfconfig_in_a_batch_script_outside_srun_exits_2(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "batch.out"
    command = " ".join(HPCTF) + " tfconfig; echo exit=$?"
    proc = subprocess.run(
        ["sbatch", "--parsable", "-N1", f"--output={out}", f"--wrap={command}"],
        env=slurm_cluster,
        capture_output=True,
        text=True,
        check=True,
    )
    assert wait_for_job(proc.stdout.strip(), timeout=120)["JobState"] == "COMPLETED"
    text = out.read_text()
    assert "batch script, not a job step; run it under srun" in text
    assert "exit=2" in text


@pytest.mark.tf
def test_two_nodes_train_with_two_tasks_per_node(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    sets = [
        "resources.tasks_per_node=2",
        "train.steps=40",
        "train.log_every_steps=10",
        "checkpoint.every_steps=20",
    ]
    proc = subprocess.run(
        [*HPCTF, "submit", str(DIGITS), "--site", "local-slurm"]
        + [arg for item in sets for arg in ("--set", item)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id, run = submitted(proc.stdout)
    assert job_id, proc.stdout
    info = wait_for_job(job_id, timeout=400)
    logs = {p.name: p.read_text() for p in sorted((run / "logs").glob("rank-*.log"))}
    assert info["JobState"] == "COMPLETED", "\n".join(
        f"--- {k}\n{v[-2000:]}" for k, v in logs.items()
    )
    for rank in range(4):
        node = f"node{rank // 2 + 1}"
        assert f"SLURM_PROCID {rank}: worker {rank} of 4 at {node}:" in logs[f"rank-{rank}.log"]
    assert "4 replicas" in logs["rank-0.log"]
    assert json.loads((run / "DONE").read_text())["step"] == 40
