"""SLURM environment -> cluster spec: pure unit tests."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctf.cluster import cluster_spec, expand_nodelist, expand_tasks_per_node, port_for
from hpctf.errors import UserError

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


def test_workers_in_slurm_order_not_string_order() -> None:
    # TF's SlurmClusterResolver sorts these as strings and gives rank 0 node10's address.
    spec = cluster_spec(env(SLURM_JOB_NODELIST="node[9-10]", SLURMD_NODENAME="node9"), PORTS)
    assert [w.split(":")[0] for w in spec.workers] == ["node9", "node10"]
    assert spec.task_index == 0 and spec.is_chief


def test_tf_config_index_is_procid() -> None:
    spec = cluster_spec(env(SLURM_PROCID="1", SLURMD_NODENAME="node2"), PORTS)
    config = json.loads(spec.tf_config())
    assert config["task"] == {"type": "worker", "index": 1}
    assert config["cluster"]["worker"] == list(spec.workers)
    assert spec.address.startswith("node2:")


def test_uneven_tasks_per_node_block_layout() -> None:
    spec = cluster_spec(
        env(
            SLURM_JOB_NODELIST="a[01-03]",
            SLURM_TASKS_PER_NODE="2(x2),1",
            SLURM_NTASKS="5",
            SLURM_PROCID="4",
        ),
        PORTS,
    )
    assert [w.split(":")[0] for w in spec.workers] == ["a01", "a01", "a02", "a02", "a03"]
    assert len({w for w in spec.workers}) == 5  # distinct (host, port) pairs


def test_step_nodelist_wins_over_job_nodelist() -> None:
    spec = cluster_spec(
        env(SLURM_STEP_NODELIST="node2", SLURM_STEP_TASKS_PER_NODE="2", SLURM_NTASKS="2"), PORTS
    )
    assert [w.split(":")[0] for w in spec.workers] == ["node2", "node2"]


def test_ports_distinct_when_all_hosts_share_one_address() -> None:
    ports = [port_for(123456, 0, rank, PORTS) for rank in range(4000)]
    assert len(set(ports)) == 4000
    assert all(PORTS[0] <= p < PORTS[1] for p in ports)


def test_neighbouring_jobs_get_disjoint_windows() -> None:
    first = {port_for(1000, 0, rank, PORTS) for rank in range(64)}
    second = {port_for(1001, 0, rank, PORTS) for rank in range(64)}
    assert not first & second


def test_self_check_names_expected_and_actual_node() -> None:
    with pytest.raises(
        UserError, match="rank 1 runs on node1 but the cluster spec puts it on node2"
    ):
        cluster_spec(env(SLURM_PROCID="1", SLURMD_NODENAME="node1"), PORTS)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is not set"),
        ({"SLURM_PROCID": "2"}, "outside 0..1"),
        ({"SLURM_NTASKS": "3"}, "SLURM_NTASKS=3"),
        ({"SLURM_TASKS_PER_NODE": "1"}, "has 2 hosts"),
        ({"SLURM_TASKS_PER_NODE": "x"}, "cannot read tasks per node"),
        ({"SLURM_JOB_NODELIST": "node[1-"}, "cannot expand nodelist"),
    ],
)
def test_inconsistent_environment_is_a_user_error(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        cluster_spec(env(**overrides), PORTS)


def test_procid_missing() -> None:
    variables = env()
    del variables["SLURM_PROCID"]
    with pytest.raises(UserError, match="SLURM_PROCID is not set"):
        cluster_spec(variables, PORTS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("n[1-2]-ib,gpu7", ["n1-ib", "n2-ib", "gpu7"]),
        ("single", ["single"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_nodelist(text: str, expected: list[str]) -> None:
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3])],
)
def test_expand_tasks_per_node(text: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(text) == expected


@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=20))
def test_tasks_per_node_round_trip(counts: list[int]) -> None:
    text = ",".join(str(c) for c in counts)
    assert expand_tasks_per_node(text) == counts
    assert sum(expand_tasks_per_node(text)) == sum(counts)
