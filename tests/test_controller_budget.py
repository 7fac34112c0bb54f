"""The controller section's sdiag parser (benchmarks/bench_controller.py), on an output that
Slurm 22.05's sdiag printed for the test cluster (tests/slurm/sdiag-22.05.txt: an sbatch of
`srun true` after an squeue or two)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_controller import burst_gaps, parse_sdiag, rpc_delta, split_own  # noqa: E402

RECORDED = (REPO / "tests" / "slurm" / "sdiag-22.05.txt").read_text()


def test_parses_both_tables_and_the_job_counters_of_a_recorded_sdiag() -> None:
    found = parse_sdiag(RECORDED)
    assert found.types == {
        "REQUEST_STATS_INFO": 4,
        "REQUEST_PARTITION_INFO": 2,
        "MESSAGE_NODE_REGISTRATION_STATUS": 2,
        "REQUEST_FED_INFO": 2,
        "REQUEST_JOB_INFO_SINGLE": 2,
        "REQUEST_NODE_INFO": 1,
        "REQUEST_JOB_INFO": 1,
        "REQUEST_SUBMIT_BATCH_JOB": 1,
        "REQUEST_HET_JOB_ALLOC_INFO": 1,
        "REQUEST_JOB_STEP_CREATE": 1,
        "REQUEST_STEP_COMPLETE": 1,
        "REQUEST_COMPLETE_BATCH_SCRIPT": 1,
    }
    assert found.users == {"root": 19} == {"root": sum(found.types.values())}
    assert found.jobs == {
        "submitted": 1, "started": 1, "completed": 1, "canceled": 0, "failed": 0,
        "pending": 0, "running": 1,
    }  # fmt: skip


def test_the_delta_leaves_sdiag_out_and_splits_slurms_own_traffic() -> None:
    before = parse_sdiag(RECORDED)
    after = parse_sdiag(
        RECORDED.replace("count:4      ave_time:122", "count:9      ave_time:122")
        .replace("REQUEST_JOB_INFO                        ( 2003) count:1 ",
                 "REQUEST_JOB_INFO                        ( 2003) count:4 ")
        .replace("REQUEST_STEP_COMPLETE                   ( 5016) count:1 ",
                 "REQUEST_STEP_COMPLETE                   ( 5016) count:3 ")
    )  # fmt: skip
    delta = rpc_delta(before, after)
    assert delta == {"REQUEST_JOB_INFO": 3, "REQUEST_STEP_COMPLETE": 2}
    assert list(delta) == ["REQUEST_JOB_INFO", "REQUEST_STEP_COMPLETE"]  # most first
    assert split_own(delta) == ({"REQUEST_JOB_INFO": 3}, {"REQUEST_STEP_COMPLETE": 2})


def test_several_users_and_no_rpc_at_all() -> None:
    text = (
        "Remote Procedure Call statistics by message type\n"
        "\tREQUEST_JOB_INFO                        ( 2003) count:7      ave_time:82  "
        "   total_time:574\n\n"
        "Remote Procedure Call statistics by user\n"
        "\troot            (       0) count:2      ave_time:163    total_time:326\n"
        "\talice           (    1001) count:5      ave_time:10     total_time:50\n\n"
        "Pending RPC statistics\n"
        "\tREQUEST_TERMINATE_JOB                   ( 6011) count:1\n"
    )
    found = parse_sdiag(text)
    assert found.types == {"REQUEST_JOB_INFO": 7}  # the pending table is not counted
    assert found.users == {"root": 2, "alice": 5}
    assert parse_sdiag("") == parse_sdiag("sdiag output at ...\n")


def test_gaps_between_the_bursts_of_a_poll_loop() -> None:
    fixed = [(float(t), 1 + t // 10) for t in range(0, 41)]  # a poll every 10 s
    assert burst_gaps(fixed) == [10.0, 10.0, 10.0]
    growing = [(0.0, 0), (1.0, 1), (5.0, 1), (11.0, 2), (30.0, 3)]
    assert burst_gaps(growing) == [10.0, 19.0]
    assert burst_gaps([(0.0, 3), (1.0, 3)]) == []
