"""Node-hours and GPU-hours from sacct's own text (hpctf.core.run.hours), and the one sacct
call that asks for them (hpctf.core.scheduler.slurm_queries.sacct_usage)."""

from __future__ import annotations

import pytest

from hpctf.core.run.hours import (
    UNACCOUNTED,
    Hours,
    gpus_in_tres,
    hours_json,
    hours_text,
    parse_usage,
    run_hours,
    summed,
)
from hpctf.core.scheduler import slurm_queries
from tests.fake_slurm import FakeSlurm

# Recorded on the test cluster (Slurm 22.05, AccountingStorageTRES=gres/gpu): a 2-node job with
# 2 GPUs per node requeued after 1 s and pending again, and a 2-task array of 1 GPU each:
# sacct --allocations --duplicates --noheader --parsable2
#       --format=JobID,State,ElapsedRaw,NNodes,AllocTRES
RECORDED = """\
7000001|REQUEUED|1|2|billing=2,cpu=2,gres/gpu=4,node=2
7000002_1|COMPLETED|2|1|billing=1,cpu=1,gres/gpu=1,node=1
7000002_2|COMPLETED|2|1|billing=1,cpu=1,gres/gpu=1,node=1
7000001|PENDING|0|2|
"""


def test_each_start_of_a_requeued_job_counts_and_a_pending_one_holds_nothing() -> None:
    usage = parse_usage(RECORDED)
    assert [u.job_id for u in usage] == ["7000001", "7000002_1", "7000002_2", "7000001"]
    assert run_hours(["7000001"], usage) == Hours(2 / 3600, 4 / 3600, 1)
    # An array task is a run of its own: only its line.
    assert run_hours(["7000002_2"], usage) == Hours(2 / 3600, 2 / 3600, 1)
    # Restarted later for 1 h on its 2 nodes: both starts, summed.
    again = parse_usage(
        RECORDED.replace("7000001|PENDING|0|2|", "7000001|COMPLETED|3600|2|gres/gpu=4,node=2")
    )
    assert run_hours(["7000001"], again) == Hours(2 + 2 / 3600, 4 + 4 / 3600, 2)


def test_a_sweep_sums_its_points_and_no_accounting_is_one_word_not_zero() -> None:
    usage = parse_usage(RECORDED)
    points = [run_hours([f"7000002_{i}"], usage) for i in (1, 2)]
    assert summed(points) == Hours(4 / 3600, 4 / 3600, 2)
    assert summed([None, None]) is None and summed([None, points[0]]) == points[0]
    assert hours_json(None) == UNACCOUNTED == hours_text(None) == "unaccounted"
    assert hours_json(Hours(1.5, 12.0, 3)) == {"node_hours": 1.5, "gpu_hours": 12.0, "starts": 3}
    assert hours_text(Hours(1.5, 12.0, 3)) == "1.50 node-h, 12.00 GPU-h"
    assert hours_json(Hours()) == {"node_hours": 0.0, "gpu_hours": 0.0, "starts": 0}


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("billing=2,cpu=2,gres/gpu=4,mem=8G,node=2", 4),
        ("cpu=8,gres/gpu:a100=2,gres/gpu:v100=1,node=1", 3),  # typed only: their sum
        ("cpu=8,gres/gpu=3,gres/gpu:a100=3,node=1", 3),  # both: the untyped total
        ("cpu=2,node=1", 0),
        ("", 0),
    ],
)
def test_gpus_of_an_allocation(tres: str, gpus: int) -> None:
    assert gpus_in_tres(tres) == gpus


def test_lines_of_another_shape_are_left_out() -> None:
    assert parse_usage("garbage\n1|2\n\n|COMPLETED|1|1|node=1\n") == []
    assert parse_usage("5|RUNNING|x|1|node=1\n")[0].elapsed_s == 0


def test_one_sacct_call_asks_an_array_once_and_no_accounting_is_none(
    fake_slurm: FakeSlurm,
) -> None:
    fake_slurm.answer("sacct", RECORDED)
    text = slurm_queries.sacct_usage(["7000002_1", "7000001", "7000002_2"])
    assert text == RECORDED
    (call,) = fake_slurm.calls("sacct")
    assert call.split() == [
        "--jobs=7000001,7000002",
        "--allocations",
        "--duplicates",
        "--noheader",
        "--parsable2",
        "--format=JobID,State,ElapsedRaw,NNodes,AllocTRES",
    ]
    fake_slurm.answer("sacct", "", "Slurm accounting storage is disabled\n", 1)
    assert slurm_queries.sacct_usage(["7000001"]) is None
