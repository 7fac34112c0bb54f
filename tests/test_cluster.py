"""SLURM environment -> cluster spec: pure unit tests, the worker's startup checks, `tfconfig`.

The layouts in the tables were observed on Slurm 22.05 (tests/slurm/cluster.sh, srun -O);
tests/test_cluster_slurm.py checks the same things against the real binaries.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctf.cli import cli
from hpctf.compute.cluster.gpu_bind import gpu_binding
from hpctf.compute.cluster.placement import expand_tasks_per_node, layout
from hpctf.compute.cluster.spec import ClusterSpec, cluster_spec, port_window
from hpctf.compute.doctor.node_checks import check_port_free
from hpctf.compute.start.runtime import check_resolves, prepare_environment, startup_checks
from hpctf.core.errors import SlurmEnvironmentProblem, UserError
from hpctf.core.scheduler.hostnames import check_hostname_template, expand_nodelist
from hpctf.core.settings.sites import read_site_file
from tests.conftest import write

PORTS = (20000, 30000)


def env(**overrides: str) -> dict[str, str]:
    base = {
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "0",
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
    }
    base.update(overrides)
    return base


def hosts_of(spec: ClusterSpec) -> list[str]:
    return [w.rpartition(":")[0] for w in spec.workers]


def compress_tasks(counts: list[int]) -> str:
    """Slurm's own compressed form of a tasks-per-node list: runs become ``N(xK)``."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(parts)


# --- rank order and layouts ---------------------------------------------------------------


def test_workers_in_slurm_order_not_string_order() -> None:
    # TF's SlurmClusterResolver sorts these as strings and gives rank 0 node10's address.
    spec = cluster_spec(env(SLURM_JOB_NODELIST="node[9-10]", SLURMD_NODENAME="node9"), PORTS)
    assert hosts_of(spec) == ["node9", "node10"]
    assert spec.task_index == 0 and spec.is_chief


def test_tf_config_index_is_procid() -> None:
    spec = cluster_spec(env(SLURM_PROCID="1", SLURMD_NODENAME="node2"), PORTS)
    config = json.loads(spec.tf_config())
    assert config["task"] == {"type": "worker", "index": 1}
    assert config["cluster"]["worker"] == list(spec.workers)
    assert spec.address == f"node2:{spec.port}" and spec.host == "node2"
    assert not spec.is_chief


def test_uneven_tasks_per_node_block_layout() -> None:
    spec = cluster_spec(
        env(
            SLURM_JOB_NODELIST="a[01-03]",
            SLURM_TASKS_PER_NODE="2(x2),1",
            SLURM_NTASKS="5",
            SLURM_PROCID="3",
            SLURMD_NODENAME="a02",
            SLURM_NODEID="1",
            SLURM_LOCALID="1",
        ),
        PORTS,
    )
    assert hosts_of(spec) == ["a01", "a01", "a02", "a02", "a03"]
    assert spec.nodes == ("a01", "a01", "a02", "a02", "a03")
    assert (spec.node, spec.node_index, spec.local_id) == ("a02", 1, 1)
    assert len(set(spec.workers)) == 5  # distinct (host, port) pairs


def test_step_variables_win_over_job_variables() -> None:
    spec = cluster_spec(
        env(
            SLURM_STEP_NODELIST="node2",
            SLURM_STEP_TASKS_PER_NODE="2",
            SLURM_NTASKS="2",
            SLURMD_NODENAME="node2",
        ),
        PORTS,
    )
    assert hosts_of(spec) == ["node2", "node2"]


@pytest.mark.parametrize(
    ("counts", "distribution", "planesize", "nodes", "local"),
    [
        # Observed with srun -N2 -O on Slurm 22.05.
        ([2, 2], "block:block", None, [0, 0, 1, 1], [0, 1, 0, 1]),
        ([2, 2], "cyclic", None, [0, 1, 0, 1], [0, 0, 1, 1]),
        ([3, 2], "cyclic", None, [0, 1, 0, 1, 0], [0, 0, 1, 1, 2]),
        ([2, 1], "cyclic:block:fcyclic", None, [0, 1, 0], [0, 0, 1]),
        ([3, 1], "plane", "2", [0, 0, 1, 0], [0, 1, 0, 2]),
        ([4, 3], "plane", "2", [0, 0, 1, 1, 0, 0, 1], [0, 1, 0, 1, 2, 3, 2]),
        ([2, 1], "block,pack", None, [0, 0, 1], [0, 1, 0]),
        ([2, 1], "*", None, [0, 0, 1], [0, 1, 0]),
    ],
)
def test_distributions_place_ranks_like_srun(
    counts: list[int], distribution: str, planesize: str | None, nodes: list[int], local: list[int]
) -> None:
    extra = {"SLURM_DIST_PLANESIZE": planesize} if planesize else {}
    for rank in range(sum(counts)):
        spec = cluster_spec(
            env(
                SLURM_STEP_NODELIST="node[1-2]",
                SLURM_STEP_TASKS_PER_NODE=",".join(map(str, counts)),
                SLURM_NTASKS=str(sum(counts)),
                SLURM_PROCID=str(rank),
                SLURM_DISTRIBUTION=distribution,
                SLURMD_NODENAME=f"node{nodes[rank] + 1}",
                SLURM_NODEID=str(nodes[rank]),
                SLURM_LOCALID=str(local[rank]),
                **extra,
            ),
            PORTS,
        )
        assert spec.task_index == rank
        assert spec.nodes == tuple(f"node{n + 1}" for n in nodes)


@given(
    st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=12),
    st.sampled_from([None, 1, 2, 3]),
)
def test_layout_places_every_task_once(counts: list[int], plane: int | None) -> None:
    nodes, local = layout(counts, plane)
    assert [nodes.count(i) for i in range(len(counts))] == counts
    for i, count in enumerate(counts):  # local ids count up in rank order on each node
        assert [local[r] for r in range(len(nodes)) if nodes[r] == i] == list(range(count))
    if plane is None:
        assert nodes == sorted(nodes)
    if plane == 1:  # cyclic: the first round visits every node once, in order
        assert nodes[: len(counts)] == list(range(len(counts)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=8),
    st.sampled_from(["", "block:block", "cyclic", "plane=2"]),
    st.integers(min_value=1, max_value=10**7),
)
def test_every_rank_computes_the_same_cluster(
    counts: list[int], distribution: str, job_id: int
) -> None:
    names = [f"n{i:03d}" for i in range(len(counts))]
    nodes, local = layout(counts, {"": None, "block:block": None, "cyclic": 1}.get(distribution, 2))
    specs = [
        cluster_spec(
            {
                "SLURM_JOB_ID": str(job_id),
                "SLURM_STEP_ID": "0",
                "SLURM_STEP_NODELIST": hostlist.collect_hostlist(names),
                "SLURM_STEP_TASKS_PER_NODE": compress_tasks(counts),
                "SLURM_NTASKS": str(sum(counts)),
                "SLURM_PROCID": str(rank),
                "SLURM_DISTRIBUTION": distribution,
                "SLURMD_NODENAME": names[nodes[rank]],
                "SLURM_LOCALID": str(local[rank]),
            },
            PORTS,
        )
        for rank in range(sum(counts))
    ]
    assert len({spec.workers for spec in specs}) == 1
    assert [spec.task_index for spec in specs] == list(range(sum(counts)))
    assert len(set(specs[0].workers)) == sum(counts)


# --- ports ----------------------------------------------------------------------------------


def test_ports_distinct_when_all_hosts_share_one_address() -> None:
    ports = [port_window(123456, 0, PORTS)(rank) for rank in range(4000)]
    assert len(set(ports)) == 4000
    assert all(PORTS[0] <= p < PORTS[1] for p in ports)


def test_neighbouring_jobs_and_steps_get_disjoint_windows() -> None:
    first = {port_window(1000, 0, PORTS)(rank) for rank in range(64)}
    assert not first & {port_window(1001, 0, PORTS)(rank) for rank in range(64)}
    assert not first & {port_window(1000, 1, PORTS)(rank) for rank in range(64)}


@given(st.integers(0, 2**31), st.integers(0, 1000), st.integers(1025, 60000), st.data())
def test_ports_stay_in_range(job: int, step: int, low: int, data: st.DataObject) -> None:
    high = data.draw(st.integers(low + 1, 65535))
    slots = range(min(high - low, 300))
    ports = [port_window(job, step, (low, high))(slot) for slot in slots]
    assert all(low <= p < high for p in ports)
    assert len(set(ports)) == len(ports)


def test_ports_per_node_when_the_step_outgrows_the_range() -> None:
    # 3 nodes x 4 tasks = 12 tasks > 10 ports: slots become local ids, distinct per node.
    spec = cluster_spec(
        env(
            SLURM_JOB_NODELIST="n[1-3]",
            SLURM_TASKS_PER_NODE="4(x3)",
            SLURM_NTASKS="12",
            SLURM_PROCID="5",
        ),
        (20000, 20010),
    )
    assert len(set(spec.workers)) == 12
    per_node = [spec.workers[i : i + 4] for i in (0, 4, 8)]
    ports = [[w.rpartition(":")[2] for w in node] for node in per_node]
    assert ports[0] == ports[1] == ports[2] and len(set(ports[0])) == 4
    assert spec.port == int(ports[1][1])


def test_more_tasks_per_node_than_ports_is_an_error() -> None:
    with pytest.raises(UserError, match="4 tasks per node need more ports"):
        cluster_spec(env(SLURM_TASKS_PER_NODE="4(x2)", SLURM_NTASKS="8"), (20000, 20003))


# --- IPoIB names ----------------------------------------------------------------------------


def test_hostname_template_applies_to_every_address() -> None:
    spec = cluster_spec(
        env(SLURM_JOB_NODELIST="node[01-02]", SLURM_PROCID="1", SLURMD_NODENAME="node02"),
        PORTS,
        "{host}-ib",
    )
    assert hosts_of(spec) == ["node01-ib", "node02-ib"]
    assert spec.nodes == ("node01", "node02")  # the self-check compares Slurm's names
    assert (spec.host, spec.chief_host) == ("node02-ib", "node01-ib")


@pytest.mark.parametrize("template", ["{host}", "{host}-ib", "{host}.ib.example.org", "ib-{host}"])
def test_valid_hostname_templates(template: str) -> None:
    assert check_hostname_template(template) == template


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("node-ib", "must contain {host}"),
        ("{hostname}-ib", "must contain {host}"),
        ("{host}{other}", "no other field"),
        ("{host!r}", "must contain {host}"),
        ("{host:>20}", "must contain {host}"),
        ("{host", "expected '}'"),
        ("{host}_ib", "not a valid host name"),
        ("{host}..ib", "not a valid host name"),
        ("{host} ib", "not a valid host name"),
    ],
)
def test_bad_hostname_templates(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_hostname_template(template)
    with pytest.raises(UserError, match=re.escape(message)):
        cluster_spec(env(), PORTS, template)


def test_site_hostname_template_is_validated_with_file_and_key(tmp_path: Path) -> None:
    site = "name: s\nscheduler: slurm\nruns_root: /tmp\nhostname_template: '{host}_ib'\n"
    with pytest.raises(UserError, match=r"site.yaml:4: hostname_template: .*not a valid host"):
        read_site_file(write(tmp_path / "site.yaml", site), {})
    default, _ = read_site_file(
        write(tmp_path / "ok.yaml", "name: s\nscheduler: slurm\nruns_root: /t\n"), {}
    )
    assert default.hostname_template == "{host}"


# --- GPUs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "per_node", "local_id", "gpus", "bind"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 1, 0, ("0", "1", "2", "3"), False),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, 2, ("2",), True),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 1, ("2", "3"), True),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 2, 1, ("GPU-bb",), True),
        # Slurm bound GPUs per task already (--gpus-per-task=1, --gpu-bind=single:1): it says so
        # in SLURMD_TRES_BIND, or the step's GPUs on this node are more than this task sees.
        ({"CUDA_VISIBLE_DEVICES": "3", "SLURMD_TRES_BIND": "gpu:single:1"}, 2, 1, ("3",), False),
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "2,3"}, 2, 1, ("0",), False),
        ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_GPUS": "0,1"}, 2, 1, ("1",), False),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,5,6,7"}, 2, 1, ("0", "1"), False),
        # One GPU and one task per node: nothing to share.
        ({"CUDA_VISIBLE_DEVICES": "0"}, 1, 0, ("0",), False),
        (
            {"CUDA_VISIBLE_DEVICES": "2,3", "SLURMD_TRES_BIND": "gpu:per_task:2"},
            2,
            1,
            ("2", "3"),
            False,
        ),
        ({"SLURM_STEP_GPUS": "4,5"}, 2, 1, ("5",), True),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_STEP_GPUS": "0,1"}, 2, 1, (), False),
        ({"CUDA_VISIBLE_DEVICES": "", "SLURM_STEP_GPUS": "0,1"}, 2, 0, (), False),
        ({}, 2, 1, (), False),
    ],
)
def test_gpu_binding(
    variables: dict[str, str],
    per_node: int,
    local_id: int,
    gpus: tuple[str, ...],
    bind: bool,
) -> None:
    binding = gpu_binding(variables, per_node, local_id, "n1")
    assert (binding.gpus, binding.rewrite) == (gpus, bind)


@pytest.mark.parametrize(
    "variables",
    [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "0"},
        {"CUDA_VISIBLE_DEVICES": "0", "SLURMD_TRES_BIND": "cpu:cores"},
        {"SLURM_STEP_GPUS": "5"},
    ],
)
def test_one_gpu_is_not_shared_by_two_tasks(variables: dict[str, str]) -> None:
    # --gpus-per-node=1 with --ntasks-per-node=2: both tasks see the same one GPU. Treating it
    # as "already bound" put both workers on GPU 0, and NCCL fails on two ranks of one device.
    with pytest.raises(UserError) as info:
        gpu_binding(variables, 2, 1, "n1")
    message = str(info.value)
    assert "\n" not in message
    assert "1 GPU visible on n1" in message
    assert "cannot be shared by 2 tasks per node" in message
    assert "gpus_per_node equal to tasks_per_node" in message


def test_one_worker_per_gpu_sets_cuda_visible_devices() -> None:
    spec = cluster_spec(
        env(
            SLURM_TASKS_PER_NODE="2(x2)",
            SLURM_NTASKS="4",
            SLURM_PROCID="3",
            SLURM_LOCALID="1",
            SLURMD_NODENAME="node2",
            CUDA_VISIBLE_DEVICES="0,1",
        ),
        PORTS,
    )
    assert spec.environment() == {"TF_CONFIG": spec.tf_config(), "CUDA_VISIBLE_DEVICES": "1"}
    assert "CUDA_VISIBLE_DEVICES=1 (one worker per GPU: split by SLURM_LOCALID)" in spec.describe()


def test_uneven_layout_gives_every_worker_the_same_gpu_count() -> None:
    # Node a03 runs one task; with 2 tasks on the busiest node it still gets one GPU, like all.
    spec = cluster_spec(
        env(
            SLURM_JOB_NODELIST="a[01-03]",
            SLURM_TASKS_PER_NODE="2(x2),1",
            SLURM_NTASKS="5",
            SLURM_PROCID="4",
            CUDA_VISIBLE_DEVICES="0,1",
        ),
        PORTS,
    )
    assert (spec.gpus, spec.bind_gpus) == (("0",), True)


def test_one_worker_per_node_leaves_gpus_alone() -> None:
    spec = cluster_spec(env(CUDA_VISIBLE_DEVICES="0,1,2,3"), PORTS)
    assert spec.environment() == {"TF_CONFIG": spec.tf_config()}
    assert spec.gpus == ("0", "1", "2", "3")


# --- self-check and hostile environments ------------------------------------------------------


def test_self_check_shows_expected_and_actual() -> None:
    with pytest.raises(SlurmEnvironmentProblem) as info:
        cluster_spec(
            env(
                SLURM_TASKS_PER_NODE="2(x2)",
                SLURM_NTASKS="4",
                SLURM_PROCID="1",
                SLURMD_NODENAME="node2",
                SLURM_NODEID="1",
                SLURM_LOCALID="0",
            ),
            PORTS,
        )
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("SLURM_PROCID 1 is not where the cluster spec puts it: ")
    assert "SLURMD_NODENAME expected node1 actual node2" in message
    assert "SLURM_NODEID expected 0 actual 1" in message
    assert "SLURM_LOCALID expected 1 actual 0" in message
    assert "distribution block (default)" in message


def test_self_check_catches_a_distribution_srun_did_not_announce() -> None:
    # srun placed ranks cyclically but SLURM_DISTRIBUTION got lost (e.g. a wrapper script
    # rebuilt the environment): rank 1 sits on node2, block puts it on node1.
    with pytest.raises(
        SlurmEnvironmentProblem, match="SLURMD_NODENAME expected node1 actual node2"
    ):
        cluster_spec(
            env(
                SLURM_TASKS_PER_NODE="2(x2)",
                SLURM_NTASKS="4",
                SLURM_PROCID="1",
                SLURMD_NODENAME="node2",
                SLURM_LOCALID="0",
            ),
            PORTS,
        )


@pytest.mark.parametrize(
    ("overrides", "message", "fault"),
    [
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is not set", SlurmEnvironmentProblem),
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set: this is not a Slurm job", UserError),
        ({"SLURM_STEP_ID": ""}, "job 77's batch script, not a job step", UserError),
        (
            {"SLURM_STEP_ID": "batch"},
            "SLURM_STEP_ID='batch' is not a number",
            SlurmEnvironmentProblem,
        ),
        ({"SLURM_TASKS_PER_NODE": ""}, "SLURM_TASKS_PER_NODE is not set", SlurmEnvironmentProblem),
        ({"SLURM_PROCID": "2"}, "outside 0..1", SlurmEnvironmentProblem),
        ({"SLURM_PROCID": "-1"}, "is not a number", SlurmEnvironmentProblem),
        (
            {"SLURM_PROCID": "\uff11"},
            "is not a number",
            SlurmEnvironmentProblem,
        ),  # a full-width digit: int() takes it
        ({"SLURM_PROCID": "1 "}, "is not a number", SlurmEnvironmentProblem),
        ({"SLURM_JOB_ID": "99999999999999999999"}, "is not a number", SlurmEnvironmentProblem),
        ({"SLURM_NTASKS": "3"}, "SLURM_NTASKS=3", SlurmEnvironmentProblem),
        ({"SLURM_TASKS_PER_NODE": "1"}, "has 2 hosts", SlurmEnvironmentProblem),
        ({"SLURM_TASKS_PER_NODE": "x"}, "cannot read tasks per node", SlurmEnvironmentProblem),
        ({"SLURM_TASKS_PER_NODE": "1,,1"}, "cannot read tasks per node", SlurmEnvironmentProblem),
        ({"SLURM_TASKS_PER_NODE": "0(x2)"}, "zero count", SlurmEnvironmentProblem),
        (
            {"SLURM_TASKS_PER_NODE": "1(x9999999)"},
            "more nodes than the 2 in the nodelist",
            SlurmEnvironmentProblem,
        ),
        ({"SLURM_JOB_NODELIST": "node[1-"}, "cannot expand nodelist", SlurmEnvironmentProblem),
        ({"SLURM_JOB_NODELIST": "n[1-99999999]"}, "range too large", SlurmEnvironmentProblem),
        ({"SLURM_JOB_NODELIST": "node1 node2"}, "only letters, digits", SlurmEnvironmentProblem),
        ({"SLURM_JOB_NODELIST": 'node1,"x"'}, "only letters, digits", SlurmEnvironmentProblem),
        ({"SLURM_JOB_NODELIST": "node1,node1"}, "names a node twice", SlurmEnvironmentProblem),
        ({"SLURM_DISTRIBUTION": "arbitrary"}, "SLURM_DISTRIBUTION=arbitrary", UserError),
        ({"SLURM_DISTRIBUTION": "plane"}, "without a plane size", UserError),
        ({"SLURM_DISTRIBUTION": "spiral"}, "not one hpctf knows", UserError),
        ({"CUDA_VISIBLE_DEVICES": "0;1"}, "not a comma-separated list", UserError),
        (
            {"CUDA_VISIBLE_DEVICES": "0,0", "SLURM_TASKS_PER_NODE": "2,2", "SLURM_NTASKS": "4"},
            "names a GPU twice",
            UserError,
        ),
        (
            {"CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "4"},
            "3 GPUs visible on node1 .* cannot be shared evenly by 2 tasks per node",
            UserError,
        ),
    ],
)
def test_a_bad_environment_is_the_environments_fault_and_no_job_step_the_users(
    overrides: dict[str, str], message: str, fault: type[Exception]
) -> None:
    """Slurm's variables malformed or disagreeing: exit 3 (Slurm's doing); outside a job step
    or a placement the user's srun options chose: exit 2 (theirs)."""
    with pytest.raises(fault, match=message) as info:
        cluster_spec(env(**overrides), PORTS)
    assert "\n" not in str(info.value)


def test_procid_missing() -> None:
    variables = env()
    del variables["SLURM_PROCID"]
    with pytest.raises(SlurmEnvironmentProblem, match="SLURM_PROCID is not set"):
        cluster_spec(variables, PORTS)


# --- nodelists and tasks per node -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("node[9-10]", ["node9", "node10"]),
        ("n[1-2]-ib,gpu7", ["n1-ib", "n2-ib", "gpu7"]),
        ("single", ["single"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_nodelist(text: str, expected: list[str]) -> None:
    assert expand_nodelist(text) == expected


_NAMES = st.builds(
    lambda prefix, number, width: f"{prefix}{number:0{width}d}",
    st.sampled_from(["n", "gpu", "a-b", "r1n"]),
    st.integers(0, 1200),
    st.integers(1, 4),
)


@given(st.lists(_NAMES, min_size=1, max_size=40, unique=True))
def test_nodelist_round_trips(names: list[str]) -> None:
    assert expand_nodelist(",".join(names)) == names
    compressed = hostlist.collect_hostlist(names)
    assert sorted(expand_nodelist(compressed)) == sorted(names)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3])],
)
def test_expand_tasks_per_node(text: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(text) == expected


@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=20))
def test_tasks_per_node_round_trip(counts: list[int]) -> None:
    assert expand_tasks_per_node(compress_tasks(counts)) == counts
    assert expand_tasks_per_node(",".join(map(str, counts))) == counts


# --- the worker's startup checks (sockets: the I/O edge) --------------------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_taken_port_names_host_and_port(listener: int) -> None:
    with pytest.raises(UserError, match=f"port {listener} on node7-ib is taken"):
        check_port_free("node7-ib", listener)


def test_port_in_time_wait_is_free() -> None:
    # A gRPC server (SO_REUSEADDR) that closed its connections first leaves its port in
    # TIME_WAIT; the next gRPC server can listen there, so the check must not call it taken.
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first and keeps TIME_WAIT on `port`
    client.close()
    server.close()
    check_port_free("localhost", port)


def test_unresolvable_name_is_a_user_error() -> None:
    check_resolves("localhost", "localhost", "{host}")
    with pytest.raises(
        UserError, match=r"address 'nosuch-ib\.invalid' of node nosuch .* does not resolve"
    ):
        check_resolves("nosuch-ib.invalid", "nosuch", "{host}-ib.invalid")


def test_startup_checks_resolve_own_and_chief_address(listener: int) -> None:
    local = env(SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="1", SLURM_NTASKS="1")
    startup_checks(cluster_spec(local, PORTS))
    with pytest.raises(UserError, match="'localhost-ib' of node localhost"):
        startup_checks(cluster_spec(local, PORTS, "{host}-ib"))


def test_prepare_environment_sets_tf_config_and_gpus() -> None:
    spec = cluster_spec(
        env(SLURM_TASKS_PER_NODE="2(x2)", SLURM_NTASKS="4", CUDA_VISIBLE_DEVICES="0,1"), PORTS
    )
    target = {"CUDA_VISIBLE_DEVICES": "0,1"}
    prepare_environment(target, spec)
    assert json.loads(target["TF_CONFIG"])["task"]["index"] == 0
    assert target["CUDA_VISIBLE_DEVICES"] == "0"


# --- hpctf tfconfig ------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Slurm variables from the machine running the tests (tests may run inside a job)."""
    for key in list(os.environ):
        if key.startswith(("SLURM", "CUDA_VISIBLE")):
            monkeypatch.delenv(key)


def test_tfconfig_outside_slurm_exits_2_with_one_line(clean_env: None) -> None:
    result = CliRunner().invoke(cli, ["tfconfig"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("Error: SLURM_JOB_ID is not set: this is not a Slurm job")
    assert result.stderr.count("\n") == 1


def test_tfconfig_in_the_batch_script_exits_2(clean_env: None) -> None:
    batch = env(SLURMD_NODENAME="node1")
    del batch["SLURM_STEP_ID"]
    result = CliRunner().invoke(cli, ["tfconfig"], env=batch)
    assert result.exit_code == 2
    assert "batch script, not a job step" in result.stderr


def test_tfconfig_prints_tf_config(clean_env: None) -> None:
    variables = env(SLURM_PROCID="1", SLURMD_NODENAME="node2", SLURM_LOCALID="0")
    result = CliRunner().invoke(cli, ["tfconfig"], env=variables)
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["task"] == {"type": "worker", "index": 1}
    assert config == json.loads(cluster_spec(variables, (20000, 30000)).tf_config())
    assert "SLURM_PROCID 1: worker 1 of 2 at node2:" in result.stderr


def test_tfconfig_takes_the_sites_template_and_ports(clean_env: None, tmp_path: Path) -> None:
    site = write(
        tmp_path / "ib.yaml",
        "name: ib\nscheduler: slurm\nruns_root: /tmp\nport_range: [40000, 40010]\n"
        "hostname_template: '{host}-ib'\n",
    )
    result = CliRunner().invoke(cli, ["tfconfig", "--site", str(site)], env=env())
    assert result.exit_code == 0, result.output
    workers = json.loads(result.stdout)["cluster"]["worker"]
    assert [w.rpartition(":")[0] for w in workers] == ["node1-ib", "node2-ib"]
    assert all(40000 <= int(w.rpartition(":")[2]) < 40010 for w in workers)


def test_tfconfig_check_fails_on_unresolvable_names(clean_env: None, tmp_path: Path) -> None:
    site = write(
        tmp_path / "ib.yaml",
        "name: ib\nscheduler: slurm\nruns_root: /tmp\nhostname_template: '{host}-ib.invalid'\n",
    )
    local = env(SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="1", SLURM_NTASKS="1")
    runner = CliRunner()
    assert runner.invoke(cli, ["tfconfig", "--site", str(site)], env=local).exit_code == 0
    result = runner.invoke(cli, ["tfconfig", "--site", str(site), "--check"], env=local)
    assert result.exit_code == 2
    assert "'localhost-ib.invalid' of node localhost" in result.stderr


def test_tfconfig_inconsistent_environment_is_the_environments_fault(clean_env: None) -> None:
    result = CliRunner().invoke(cli, ["tfconfig"], env=env(SLURM_NTASKS="3"))
    assert result.exit_code == 3
    assert result.stderr == "Error: SLURM_NTASKS=3 but SLURM_TASKS_PER_NODE='1(x2)' adds up to 2\n"


def test_tfconfig_run_dir_and_site_exclude_each_other(clean_env: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["tfconfig", "--run-dir", str(tmp_path), "--site", "local"], env=env()
    )
    assert result.exit_code == 2
    assert "at most one of --run-dir and --site" in result.stderr
