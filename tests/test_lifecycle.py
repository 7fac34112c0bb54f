"""Life after submit: status over many runs (one squeue, one sacct), runs, logs across starts,
cancel, plot. Unit tests use fake Slurm commands at the subprocess boundary; the tests marked
slurm use the real test cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run import journal
from hpctf.core.run.history.runstate import starts_of
from hpctf.core.run.journal import (
    CANCELLED,
    ENDED,
    GAVE_UP,
    REQUEUED,
    SAVED_ON_WARNING,
    SIGNALLED,
    STARTED,
    SUBMITTED,
)
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm, slurm_queries
from hpctf.core.scheduler.slurm import SlurmError
from hpctf.core.scheduler.slurm_queries import JobRecord
from hpctf.login.reading import progress
from hpctf.login.reading.run_report import TABLE_COLUMNS
from hpctf.login.reading.runs import RunRecord, epoch_seconds
from hpctf.login.watching import plot
from tests.conftest import DIGITS, HPCTF, paced, submitted, wait_for_job, write
from tests.fake_slurm import FakeSlurm, new_run, sacct_line, squeue_line
from tests.journal_records import write_events
from tests.webhook_receiver import URL_SECRET, Receiver

# --- fake Slurm commands ---------------------------------------------------------------------


# --- run directories made without a cluster ---------------------------------------------------


# A start whose batch shell got SIGTERM and recorded its end: Slurm requeues such a job itself.
KILLED_START = (
    {"event": STARTED, "job_id": "4242", "step": 0},
    {"event": SIGNALLED, "job_id": "4242", "signal": "TERM"},
    {"event": ENDED, "job_id": "4242", "exit_code": 143, "reason": "node_fail", "step": 100},
)


def copies(template: Path, count: int) -> list[Path]:
    """``count`` copies of run ``template`` beside it, each with its own job (5000 + i)."""
    paths = []
    for i in range(count):
        path = template.parent / f"copy-{i:03d}"
        shutil.copytree(template, path)
        for file in (path / "journal").glob(journal.files_of(SUBMITTED)):
            file.unlink()
        write_events(path, {"event": SUBMITTED, "job_id": str(5000 + i)})
        paths.append(path)
    return paths


def table(output: str) -> dict[str, dict[str, str]]:
    """`hpctf status`'s table: by run, by column (columns are 2 or more spaces apart)."""
    header, *rows = [line for line in output.splitlines() if "  " in line]
    columns = re.split(r"\s{2,}", header)
    return {
        row.split()[0]: dict(zip(columns, re.split(r"\s{2,}", row), strict=False)) for row in rows
    }


def metrics(path: Path, *records: dict[str, object]) -> None:
    with (path / "metrics.jsonl").open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


# --- parsing: table-driven --------------------------------------------------------------------

SQUEUE_CASES = [
    (
        "pending with its reason",
        "950002|PENDING|BeginTime|2026-12-01T05:29:39|0:00|\n",
        {"950002": ("PENDING", "BeginTime", "")},
    ),
    ("running", squeue_line("7", "RUNNING"), {"7": ("RUNNING", "", "node[1-2]")}),
    (
        "reason None is no reason",
        squeue_line("8", "COMPLETED"),
        {"8": ("COMPLETED", "", "node[1-2]")},
    ),
    (
        "requeued and preempted",
        squeue_line("9", "REQUEUED") + squeue_line("10", "PREEMPTED", "Preemption"),
        {"9": ("REQUEUED", "", "node[1-2]"), "10": ("PREEMPTED", "Preemption", "node[1-2]")},
    ),
    ("blank and foreign lines", "\n  \nslurm_load_jobs error\n1|2|3\n", {}),
    ("no output", "", {}),
]


@pytest.mark.parametrize(
    ("out", "want"), [c[1:] for c in SQUEUE_CASES], ids=[c[0] for c in SQUEUE_CASES]
)
def test_parse_squeue(out: str, want: dict[str, tuple[str, str, str]]) -> None:
    got = slurm_queries.parse_squeue(out)
    assert {k: (v.state, v.reason, v.nodes) for k, v in got.items()} == want
    assert all(v.source == "squeue" for v in got.values())


SACCT_CASES = [
    ("completed", sacct_line("5", "COMPLETED"), {"5": ("COMPLETED", "0:0")}),
    (
        "cancelled by a uid keeps one word",
        sacct_line("6", "CANCELLED by 1000", "0:15"),
        {"6": ("CANCELLED", "0:15")},
    ),
    (
        "timeout, node_fail, failed",
        sacct_line("7", "TIMEOUT", "0:1")
        + sacct_line("8", "NODE_FAIL", "0:1")
        + sacct_line("9", "FAILED", "1:0"),
        {"7": ("TIMEOUT", "0:1"), "8": ("NODE_FAIL", "0:1"), "9": ("FAILED", "1:0")},
    ),
    (
        "a requeued job's newest record wins",
        sacct_line("10", "REQUEUED") + sacct_line("10", "RUNNING"),
        {"10": ("RUNNING", "0:0")},
    ),
    (
        "a trailing | (--parsable, not 2) is not ours",
        sacct_line("11", "FAILED").rstrip("\n") + "|\n",
        {},
    ),
]


@pytest.mark.parametrize(
    ("out", "want"), [c[1:] for c in SACCT_CASES], ids=[c[0] for c in SACCT_CASES]
)
def test_parse_sacct(out: str, want: dict[str, tuple[str, str]]) -> None:
    got = slurm_queries.parse_sacct(out)
    assert {k: (v.state, v.exit_code) for k, v in got.items()} == want
    assert all(v.source == "sacct" for v in got.values())


def test_queries_name_every_job_once_and_read_slurms_no_data_answers(
    fake_slurm: FakeSlurm,
) -> None:
    fake_slurm.answer("squeue", squeue_line("2", "RUNNING") + squeue_line("99", "RUNNING"))
    assert set(slurm_queries.squeue_jobs(["2", "1", "2"])) == {"2"}  # only what was asked
    (call,) = fake_slurm.calls("squeue")
    assert call.split() == [
        "--jobs=1,2",
        "--array",
        "--states=all",
        "--noheader",
        "--format=%i|%T|%r|%S|%M|%N",
    ]
    assert slurm_queries.squeue_jobs([]) == {} and len(fake_slurm.calls("squeue")) == 1  # no call
    # Every id forgotten: squeue exits 1. No accounting: sacct exits 1. Both mean "no data".
    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    assert slurm_queries.squeue_jobs(["3"]) == {}
    assert slurm_queries.sacct_jobs(["3"]) == {}
    (sacct_call,) = fake_slurm.calls("sacct")
    assert "--parsable2" in sacct_call and "--allocations" in sacct_call


def test_transient_failures_are_retried_a_couple_of_times_then_raised(
    fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []
    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Socket timed out on send/recv\n", 1)
    with pytest.raises(SlurmError, match="Socket timed out"):
        slurm_queries.query(["squeue"], sleep=pauses.append)
    assert len(fake_slurm.calls("squeue")) == 3 and pauses == [0.0, 0.0]
    fake_slurm.forget()
    # A failure that is not transient is raised at once.
    fake_slurm.answer("squeue", "", "squeue: error: invalid user\n", 1)
    with pytest.raises(SlurmError):
        slurm_queries.query(["squeue"], sleep=pauses.append)
    assert len(fake_slurm.calls("squeue")) == 1
    # The pauses are real by default: 1 s, then 3 s.
    monkeypatch.undo()
    assert slurm_queries.RETRY_PAUSES_S == (1.0, 3.0)


def test_a_slow_transient_failure_is_not_tried_again(
    fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable slurmctld: squeue itself retried for a while (18 s measured) first."""
    monkeypatch.setattr(slurm_queries, "SLOW_FAILURE_S", 0.5)
    (fake_slurm.bin / "squeue").write_text(
        f"#!/bin/sh\necho x >> {fake_slurm.calls_dir / 'squeue'}\nsleep 1\n"
        "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\n"
        "exit 1\n"
    )
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        slurm_queries.query(["squeue"])
    assert len(fake_slurm.calls("squeue")) == 1


def test_a_query_that_runs_out_of_time_is_not_tried_again(
    fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_slurm.bin / "squeue").write_text(
        f"#!/bin/sh\necho x >> {fake_slurm.calls_dir / 'squeue'}\nexec sleep 5\n"
    )
    start = time.monotonic()
    with pytest.raises(SlurmError, match="timed out"):
        slurm_queries.query(["squeue"], budget_s=1.0)
    assert time.monotonic() - start < 4 and len(fake_slurm.calls("squeue")) == 1


# --- small pure pieces --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0:00"), (65, "1:05"), (3725, "1:02:05"), (90061, "1d01:01:01")],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert progress.duration(seconds) == text


def test_sparkline_shows_a_falling_loss_on_a_log_scale() -> None:
    line = progress.sparkline([10.0, 1.0, 0.1, 0.01], width=40)
    assert line == "█▆▃▁"
    assert len(progress.sparkline([float(i) for i in range(1000)], width=40)) == 40
    assert progress.sparkline([]) == "" and progress.sparkline([1.0]) == "▁"
    assert progress.sparkline([-1.0, 0.0, 1.0]) == "▁▅█"  # not all positive: linear


def test_elapsed_counts_time_inside_starts_only() -> None:
    t = "2026-12-01T00:00:{:02d}+00:00"
    events = [
        {"event": SUBMITTED, "time": t.format(0)},
        {"event": STARTED, "time": t.format(10)},
        {"event": ENDED, "time": t.format(20)},
        {"event": REQUEUED, "time": t.format(21)},
        {"event": STARTED, "time": t.format(40)},
        {"event": SIGNALLED, "time": t.format(45)},  # killed: no end of its own
        {"event": STARTED, "time": t.format(50)},
    ]
    now = epoch_seconds(t.format(59))
    assert progress.elapsed_seconds(starts_of(events), running=True, now=now) == 10 + 5 + 9
    assert progress.elapsed_seconds(starts_of(events[:3]), running=False, now=now) == 10


# --- status ------------------------------------------------------------------------------------


def test_status_over_50_runs_makes_one_squeue_and_one_sacct_call(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    template = new_run(runs_root, fake_slurm)
    paths = copies(template, 50)
    shutil.rmtree(template)
    started = {"event": STARTED, "step": 0, "nodes": "node[1-2]"}
    for i, path in enumerate(paths):
        job = str(5000 + i)
        if i % 5 == 1:
            write_events(path, {**started, "job_id": job})
        elif i % 5 in (2, 3, 4):
            write_events(
                path,
                {**started, "job_id": job},
                {"event": ENDED, "job_id": job, "exit_code": 0, "reason": "done", "step": 3000},
            )
    # squeue knows the pending, running and one ended job; sacct the next; the journal the rest.
    fake_slurm.answer(
        "squeue",
        squeue_line("5000", "PENDING", "Resources", "")
        + squeue_line("5001", "RUNNING")
        + squeue_line("5002", "COMPLETED"),
    )
    fake_slurm.answer("sacct", sacct_line("5003", "COMPLETED"))
    fake_slurm.forget()
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["status"], catch_exceptions=False)
    took = time.monotonic() - start
    assert result.exit_code == 0, result.output
    assert len(fake_slurm.calls("squeue")) == 1 and len(fake_slurm.calls("sacct")) == 1
    assert not fake_slurm.calls("scontrol")
    (squeue_call,) = fake_slurm.calls("squeue")
    assert squeue_call.split()[0] == "--jobs=" + ",".join(str(5000 + i) for i in range(50))
    (sacct_call,) = fake_slurm.calls("sacct")  # only the jobs squeue no longer knows
    assert "5001" not in sacct_call and "5003" in sacct_call
    rows = table(result.stdout)
    assert list(rows["copy-000"]) == list(TABLE_COLUMNS)
    seen = {name: (row["JOB"], row["SLURM"], row["STATE"]) for name, row in rows.items()}
    assert seen["copy-000"] == ("5000", "PENDING (Resources)", "queued")
    assert seen["copy-001"] == ("5001", "RUNNING", "running")
    assert seen["copy-002"] == ("5002", "COMPLETED", "done")
    assert seen["copy-003"] == ("5003", "COMPLETED", "done")  # from sacct
    assert seen["copy-004"] == ("5004", "ENDED (done)", "done")  # forgotten: the journal
    assert seen["copy-005"] == ("5005", "UNKNOWN (gone from Slurm)", "queued")
    assert "ENDED (reason): Slurm no longer knows the job" in result.output
    assert len([name for name in rows if name.startswith("copy-")]) == 50
    print(f"status over 50 runs: 1 squeue, 1 sacct, {took:.2f} s")


def test_status_json_for_scripts(runs_root: Path, fake_slurm: FakeSlurm) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(path, {"event": STARTED, "job_id": "4242", "step": 0, "nodes": "node[1-2]"})
    metrics(
        path,
        {"step": 100, "loss": 0.5, "steps_per_s": 10.0},
        {"step": 200, "loss": 0.25, "steps_per_s": 20.0},
    )
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))
    result = CliRunner().invoke(cli, ["status", "--json", str(path), str(path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["notes"] == [] and len(document["runs"]) == 2
    run = document["runs"][0]
    total = json.loads((path / "config.json").read_text())["experiment"]["train"]["steps"]
    assert run["run"] == path.name and run["path"] == str(path)
    assert run["job"] == "4242" and run["state"] == "running"
    assert run["slurm"] == {"state": "RUNNING", "reason": "", "source": "squeue"}
    assert (run["step"], run["total_steps"], run["loss"], run["steps_per_s"]) == (
        200,
        total,
        0.25,
        20.0,
    )
    assert run["eta_s"] == round((total - 200) / 20.0)
    assert run["requeues"] == {"preemption": [0, 20], "failure": [0, 3]}
    assert run["starts"] == [
        {
            "job": "4242",
            "from_step": 0,
            "reason": None,
            "cause": None,
            "exit_code": None,
            "end_step": None,
            "nodes": "node[1-2]",
            "lost_nodes": [],
            "user_code": None,
        }
    ]
    assert run["code"] and run["code"][0]["source"] == str(DIGITS.parent)
    assert len(fake_slurm.calls("squeue")) == 1  # one call for both


def test_status_of_an_epoch_based_run_shows_its_total_and_eta(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    epochs = ["--set", "train.steps=null", "--set", "train.epochs=30"]
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", *epochs])
    assert result.exit_code == 0, result.output
    (path,) = runs_root.iterdir()
    write_events(path, {"event": STARTED, "job_id": "4242", "step": 0, "nodes": "node[1-2]"})
    metrics(path, {"step": 800, "loss": 0.5, "steps_per_s": 10.0, "total_steps": 9300})
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))
    shown = CliRunner().invoke(cli, ["status"])
    assert shown.exit_code == 0, shown.output
    row = table(shown.stdout)[path.name]
    assert (row["STEP"], row["ETA"]) == ("800/9300", progress.duration(850))
    full = CliRunner().invoke(cli, ["status", str(path)])
    assert "progress: step 800/9300, loss 0.5, 10 steps/s" in full.stdout
    assert "eta 14:10" in full.stdout


def test_status_of_one_run_keeps_its_lines_and_adds_slurm_progress_and_a_sparkline(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        {"event": STARTED, "job_id": "4242", "step": 0, "nodes": "node[1-2]"},
        {"event": SAVED_ON_WARNING, "job_id": "4242", "step": 300, "signal": "TERM"},
        {"event": ENDED, "job_id": "4242", "exit_code": 75, "reason": "preempted", "step": 300},
        {"event": REQUEUED, "job_id": "4242", "why": "preempted: requeue 1 of 20"},
    )
    metrics(path, *({"step": s, "loss": 2.0 / s, "steps_per_s": 30.0} for s in range(10, 310, 10)))
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))
    result = CliRunner().invoke(cli, ["status", str(path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith(
        "run: requeued (after preempted); requeues after preemption 1/20, after failures 0/3\n"
    )
    assert "slurm: job 4242 PENDING (BeginTime); may start 2026-12-01T04:29:39\n" in out
    assert "job 4242: PENDING (BeginTime) starts 1 nodes node[1-2]\n" in out
    assert "progress: step 300/" in out and "loss 0.006667, 30 steps/s" in out
    assert "start 1: job 4242 from step 0: preempted at step 300 (exit 75)\n" in out
    sparkline = next(line for line in out.splitlines() if line.startswith("loss: "))
    assert sparkline.startswith("loss: 0.2 █") and sparkline.endswith("0.006667 (steps 10-300)")
    assert "last logged step: 300\ndone: no\n" in out
    assert fake_slurm.calls("squeue") == [
        "--jobs=4242 --array --states=all --noheader --format=%i|%T|%r|%S|%M|%N"
    ]


def test_a_job_slurm_requeued_itself_shows_requeued_not_failed(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        *KILLED_START,
    )
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))
    (run,) = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["runs"]
    assert (run["state"], run["why"]) == ("requeued", "by Slurm after node_fail")
    assert run["requeues"]["failure"] == [1, 3]  # counted once requeued, not at the next start
    # Waiting: Slurm's reason and when it may start; the elapsed time stopped at the end.
    assert run["slurm"]["start"] == "2026-12-01T04:29:39"
    shown = CliRunner().invoke(cli, ["status", str(path)]).stdout
    assert "slurm: job 4242 PENDING (BeginTime); may start 2026-12-01T04:29:39" in shown
    elapsed = run["elapsed_s"]
    time.sleep(1.1)
    (run,) = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["runs"]
    assert run["elapsed_s"] == elapsed and run["eta_s"] is None
    fake_slurm.answer("squeue", squeue_line("4242", "NODE_FAIL"))
    (run,) = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["runs"]
    assert (run["state"], run["why"]) == ("failed", "node_fail (exit 143, SIGTERM)")
    # Killed before its batch shell could record the end: still running in the journal.
    write_events(path, {"event": STARTED, "job_id": "4242", "step": 100})
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))
    (run,) = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["runs"]
    assert (run["state"], run["why"]) == ("requeued", "by Slurm after node_fail")
    assert run["requeues"]["failure"] == [2, 3]
    shown = CliRunner().invoke(cli, ["status", str(path)]).stdout
    assert "start 2: job 4242 from step 100: ended; Slurm requeued its job (PENDING" in shown


def test_status_with_slurm_down_is_one_line_and_the_journals_view(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        {"event": STARTED, "job_id": "4242", "step": 0},
        {"event": ENDED, "job_id": "4242", "exit_code": 0, "reason": "done", "step": 3000},
    )
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
    fake_slurm.answer("squeue", "", down, 1)
    fake_slurm.answer(
        "sacct", "", "sacct: error: Problem talking to the database: Connection refused\n", 1
    )
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    (note,) = [line for line in result.stderr.splitlines()]
    assert note.startswith("hpctf: Slurm did not answer (squeue: squeue failed (exit 1): ")
    assert "sacct: sacct failed (exit 1)" in note
    assert note.endswith("showing what the run directories recorded")
    row = table(result.stdout)[path.name]
    assert (row["JOB"], row["SLURM"], row["STATE"]) == ("4242", "ENDED (done)", "done")
    # Retried (transient words), within one command: 3 tries each.
    assert len(fake_slurm.calls("squeue")) == 3 and len(fake_slurm.calls("sacct")) == 3
    single = CliRunner().invoke(cli, ["status", str(path)])
    assert single.exit_code == 0 and "job 4242: ENDED exit 0 starts 1" in single.stdout
    # A run requeued after its end, or running again, and Slurm does not answer: said so.
    again = new_run(runs_root, fake_slurm)
    write_events(
        again,
        {"event": STARTED, "job_id": "4242", "step": 0},
        {"event": ENDED, "job_id": "4242", "exit_code": 75, "reason": "preempted", "step": 300},
        {"event": REQUEUED, "job_id": "4242"},
    )
    single = CliRunner().invoke(cli, ["status", str(again)])
    assert "slurm: job 4242 UNKNOWN (Slurm did not answer)" in single.stdout
    write_events(
        path,
        {"event": REQUEUED, "job_id": "4242"},
        {"event": STARTED, "job_id": "4242", "step": 3000},
    )
    single = CliRunner().invoke(cli, ["status", str(path)])
    assert "slurm: job 4242 UNKNOWN (Slurm did not answer)" in single.stdout


def test_status_without_slurm_commands_says_so(
    runs_root: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = new_run(runs_root, fake_slurm)
    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(cli, ["status", "--json", str(path), str(path)])
    assert result.exit_code == 0, result.output
    (note,) = json.loads(result.stdout)["notes"]
    assert "squeue not found on PATH" in note and note in result.stderr


def test_status_shows_recent_and_active_runs_unless_all(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    old_done, old_running, fresh = (new_run(runs_root, fake_slurm) for _ in range(3))
    long_ago = "2020-01-01T00:00:00+00:00"
    for path in (old_done, old_running):
        for file in (path / "journal").iterdir():
            data = json.loads(file.read_text())
            data["time"] = long_ago
            file.write_text(json.dumps(data))
    write_events(
        old_done,
        {"event": STARTED, "job_id": "4242", "step": 0, "time": long_ago},
        {
            "event": ENDED,
            "job_id": "4242",
            "exit_code": 0,
            "reason": "done",
            "step": 9,
            "time": long_ago,
        },
    )
    write_events(old_running, {"event": STARTED, "job_id": "4242", "step": 0, "time": long_ago})
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))
    shown = CliRunner().invoke(cli, ["status", "--json"])
    names = [r["run"] for r in json.loads(shown.stdout)["runs"]]
    assert sorted(names) == sorted([old_running.name, fresh.name])
    every = CliRunner().invoke(cli, ["status", "--json", "--all"])
    assert len(json.loads(every.stdout)["runs"]) == 3


def test_status_and_runs_find_the_runs_root(
    tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--root, else $HPCTF_RUNS_ROOT, else the runs_root of --site, $HPCTF_SITE or local."""
    home, elsewhere, mine = tmp_path / "home", tmp_path / "elsewhere", tmp_path / "mine"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("HPCTF_RUNS_ROOT", raising=False)
    monkeypatch.setenv("HPCTF_SITE_PATH", str(tmp_path / "sites"))
    write(
        tmp_path / "sites" / "mysite.yaml",
        f"name: mysite\nextends: local-slurm\nruns_root: {mine}\n",
    )
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(elsewhere))
    run = new_run(elsewhere, fake_slurm)
    monkeypatch.delenv("HPCTF_RUNS_ROOT")
    shutil.copytree(run, home / "hpctf-runs" / "in-home")
    shutil.copytree(run, mine / "in-mine")

    def names(*args: str) -> list[str]:
        result = CliRunner().invoke(cli, ["runs", "--json", *args])
        assert result.exit_code == 0, result.output
        return [r["run"] for r in json.loads(result.stdout)["runs"]]

    assert names() == ["in-home"]  # the local site's ~/hpctf-runs
    assert names("--site", "mysite") == ["in-mine"]
    assert names("--root", str(elsewhere)) == [run.name]
    missing = CliRunner().invoke(cli, ["runs", "--site", "nosuchsite"])
    assert missing.exit_code == 2 and "nosuchsite" in missing.output
    monkeypatch.setenv("HPCTF_SITE", "mysite")
    assert names() == ["in-mine"]
    # As at submit, $HPCTF_RUNS_ROOT wins over every site's runs_root.
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(elsewhere))
    assert names() == names("--site", "mysite") == [run.name]
    status = CliRunner().invoke(cli, ["status", "--json", "--root", str(mine)])
    assert [r["run"] for r in json.loads(status.stdout)["runs"]] == ["in-mine"]
    empty = CliRunner().invoke(cli, ["status", "--root", str(tmp_path / "none")])
    assert empty.exit_code == 0 and f"no recent runs under {tmp_path / 'none'}" in empty.stderr


def test_status_without_arguments_covers_every_sites_runs_root_and_sweeps(
    tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$HPCTF_RUNS_ROOT's runs, another site's and the local site's (under ~), and a sweep as
    one row with its points' states counted."""
    env_root, other = tmp_path / "env-root", tmp_path / "other-root"
    monkeypatch.setenv("HPCTF_SITE_PATH", str(tmp_path / "sites"))
    write(
        tmp_path / "sites" / "other.yaml",
        f"name: other\nextends: local-slurm\nruns_root: {other}\n",
    )
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(env_root))
    in_env = new_run(env_root, fake_slurm)
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\n")
    result = CliRunner().invoke(
        cli, ["sweep", str(DIGITS), "--site", "local-slurm", "--grid", "train.seed=0,1,2"]
    )
    assert result.exit_code == 0, result.output
    sweep = Path(re.search(r"^sweep directory: (\S+)$", result.output, re.M).group(1))  # type: ignore[union-attr]
    points = sorted(p for p in sweep.iterdir() if (p / "config.json").is_file())
    write_events(points[0], {"event": STARTED, "job_id": "4242_0", "step": 0})
    write_events(points[0], {"event": ENDED, "job_id": "4242_0", "exit_code": 0, "reason": "done"})
    write_events(points[1], {"event": STARTED, "job_id": "4242_1", "step": 0})
    shutil.copytree(in_env, other / "in-other")
    shutil.copytree(in_env, tmp_path / "home" / "hpctf-runs" / "in-home")  # the local site's

    shown = CliRunner().invoke(cli, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert sorted(r["run"] for r in document["runs"]) == sorted(
        [in_env.name, "in-other", "in-home"]
    )
    (row,) = document["sweeps"]
    assert row["sweep"] == sweep.name and row["points"] == 3 and row["job"] == "4242"
    assert row["states"] == {"done": 1, "queued": 1, "running": 1}
    table = CliRunner().invoke(cli, ["status"])
    (line,) = [line for line in table.stdout.splitlines() if line.startswith(sweep.name)]
    assert "sweep of 3: 1 done, 1 queued, 1 running" in line
    # --root (or --site) still means one runs root.
    one = CliRunner().invoke(cli, ["status", "--json", "--root", str(other)])
    assert [r["run"] for r in json.loads(one.stdout)["runs"]] == ["in-other"]


def test_runs_lists_newest_first_without_asking_slurm(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    first = new_run(runs_root, fake_slurm)
    time.sleep(1.1)  # created records have 1 s resolution
    second = new_run(runs_root, fake_slurm)
    write_events(first, {"event": STARTED, "job_id": "4242", "step": 0})
    metrics(first, {"step": 120, "loss": 1.0})
    (runs_root / "not-a-run").mkdir()
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split() == ["RUN", "CREATED", "SITE", "STATE", "LAST", "STEP", "NODE-H", "GPU-H"]
    assert [row.split()[0] for row in rows] == [second.name, first.name]
    # The fake cluster keeps no accounting: no hours, said in one word.
    assert rows[0].split()[2:] == ["local-slurm", "queued", "-", "unaccounted", "-"]
    assert rows[1].split()[2:] == ["local-slurm", "running", "120", "unaccounted", "-"]
    document = json.loads(CliRunner().invoke(cli, ["runs", "--json"]).stdout)
    assert document["root"] == str(runs_root)
    assert [r["run"] for r in document["runs"]] == [second.name, first.name]
    keys = {"run", "path", "created", "site", "state", "last_step", "hours"}
    assert set(document["runs"][0]) == keys and document["runs"][0]["hours"] == "unaccounted"
    # One sacct call for the hours of every run (two commands: two calls), no squeue.
    assert not fake_slurm.calls("squeue")
    assert len(fake_slurm.calls("sacct")) == 2 and "--duplicates" in fake_slurm.calls("sacct")[0]


@pytest.mark.parametrize("command", [["status"], ["runs"], ["logs", "--rank", "0"]])
def test_after_submit_commands_never_import_tensorflow(
    command: list[str], runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    path = new_run(runs_root, fake_slurm)
    (path / "logs" / "rank-0.log").write_text("x\n")
    args = [*command, str(path)] if command[0] == "logs" else command
    code = (
        "import sys\nfrom hpctf.cli import cli\n"
        f"try:\n    cli({args!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'tensorflow' not in sys.modules and 'matplotlib' not in sys.modules\n"
        "print('NO_TF')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=os.environ
    )
    assert "NO_TF" in proc.stdout, proc.stderr


# --- logs --------------------------------------------------------------------------------------


def header(rank: int, pid: int) -> str:
    return (
        f"04:30:0{rank} rank {rank}: host node1 pid {pid} (SLURMD_NODENAME node1) "
        f"SLURM_PROCID {rank}: worker {rank} of 2\n"
    )


def three_starts(path: Path) -> None:
    """Job 4242 preempted and requeued, then job 4343 (a resubmit) after a gave_up start."""
    write_events(
        path,
        {"event": STARTED, "job_id": "4242", "step": 0},
        {"event": ENDED, "job_id": "4242", "exit_code": 75, "reason": "preempted", "step": 100},
        {"event": REQUEUED, "job_id": "4242"},
        {"event": STARTED, "job_id": "4242", "step": 100},
        {"event": ENDED, "job_id": "4242", "exit_code": 1, "reason": "failed", "step": 100},
        {"event": STARTED, "job_id": "4242", "step": 100},
        {"event": GAVE_UP, "job_id": "4242", "why": "failed without progress"},
        {"event": SUBMITTED, "job_id": "4343"},
        {"event": STARTED, "job_id": "4343", "step": 100},
    )
    (path / "logs" / "rank-1.log").write_text(
        "noise before any start\n"
        + header(1, 11) + "first start\n"
        + header(1, 12) + "second start\nTraceback: boom\n"
        + header(1, 13) + "after the resubmit\n"
    )  # fmt: skip


def test_logs_separate_every_start_and_pick_one_job(runs_root: Path, fake_slurm: FakeSlurm) -> None:
    path = new_run(runs_root, fake_slurm)
    three_starts(path)
    result = CliRunner().invoke(cli, ["logs", str(path), "--rank", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    separators = [line for line in lines if line.startswith("=====")]
    assert [s.split(",")[0] for s in separators] == [
        "===== start 1: job 4242",
        "===== start 2: job 4242",
        "===== start 4: job 4343",  # start 3 stopped in job-start: it wrote no log
    ]
    assert separators[1].endswith(", rank 1, started " + separators[1].split("started ")[1])
    assert "from step 100 =====" in separators[1]
    assert lines[0] == "noise before any start"
    assert lines.index(separators[1]) == lines.index("first start") + 1
    assert lines[-1] == "after the resubmit"

    one = CliRunner().invoke(cli, ["logs", str(path), "--rank", "1", "--job", "4343"])
    assert one.exit_code == 0 and one.output.splitlines()[1:] == [
        header(1, 13).rstrip("\n"),
        "after the resubmit",
    ]
    assert one.output.startswith("===== start 4: job 4343")
    # The job's own output, appended across its starts (--open-mode=append), follows its part.
    starts = "===== hpctf: job 4242 start (restart 0)\nrequeued\n===== hpctf: job 4242 start (1)\n"
    (path / "logs" / "slurm-4242.out").write_text(starts)
    both = CliRunner().invoke(cli, ["logs", str(path), "--rank", "1", "--job", "4242"])
    assert both.exit_code == 0 and both.output.endswith(
        f"===== job 4242: its own output, every start ({path}/logs/slurm-4242.out) =====\n" + starts
    )
    unknown = CliRunner().invoke(cli, ["logs", str(path), "--rank", "1", "--job", "99"])
    assert unknown.exit_code == 2 and "no job 99; its jobs: 4242, 4343" in unknown.output
    no_rank = CliRunner().invoke(cli, ["logs", str(path), "--rank", "7"])
    assert no_rank.exit_code == 2 and "no log for rank 7; ranks with logs: 1" in no_rank.output


def test_logs_follow_across_a_requeue_and_stop_when_the_run_ends(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    log = path / "logs" / "rank-0.log"
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))

    def job() -> None:
        """What the batch script and the worker write, a requeue in the middle."""
        time.sleep(0.5)
        write_events(path, {"event": STARTED, "job_id": "4242", "step": 0})
        with log.open("a") as handle:
            handle.write(header(0, 1) + "step 100/300\n")
        time.sleep(1.5)
        write_events(
            path,
            {"event": ENDED, "job_id": "4242", "exit_code": 75, "reason": "preempted", "step": 100},
            {"event": REQUEUED, "job_id": "4242"},
        )
        time.sleep(1.5)
        write_events(path, {"event": STARTED, "job_id": "4242", "step": 100})
        with log.open("a") as handle:
            handle.write(header(0, 2) + "step 300/300\ntraining comp")
            handle.flush()
            time.sleep(1.5)
            handle.write("lete\n")
        (path / "DONE").write_text('{"step": 300}\n')
        write_events(
            path,
            {"event": ENDED, "job_id": "4242", "exit_code": 0, "reason": "done", "step": 300},
        )

    writer = threading.Thread(target=job)
    writer.start()
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["logs", str(path), "-f"])
    writer.join()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - start < 15
    lines = result.output.splitlines()
    assert [line.split(",")[0] for line in lines if line.startswith("=====")] == [
        "===== start 1: job 4242",
        "===== start 2: job 4242",
    ]
    assert lines[-1] == "training complete"  # a line is printed once whole
    assert lines[2] == "step 100/300" and lines[-2] == "step 300/300"
    # Slurm was asked only while the journal could not tell (once at the start: queued).
    assert len(fake_slurm.calls("squeue")) <= 2


def test_logs_follow_stops_when_slurm_has_ended_a_failed_job_and_waits_for_one_it_requeued(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        {"event": STARTED, "job_id": "4242", "step": 0},
        {"event": ENDED, "job_id": "4242", "exit_code": 143, "reason": "node_fail", "step": 50},
    )
    (path / "logs" / "rank-0.log").write_text(header(0, 1) + "step 50\n")
    fake_slurm.answer("squeue", squeue_line("4242", "FAILED"))
    ended = CliRunner().invoke(cli, ["logs", str(path), "-f"])
    assert ended.exit_code == 0 and ended.output.endswith("step 50\n")
    # Slurm requeued it itself (a node failure): -f waits for the next start.
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))

    def next_start() -> None:
        time.sleep(1.5)
        write_events(path, {"event": STARTED, "job_id": "4242", "step": 50})
        with (path / "logs" / "rank-0.log").open("a") as handle:
            handle.write(header(0, 2) + "resumed\n")
        write_events(path, {"event": GAVE_UP, "job_id": "4242", "why": "test"})

    writer = threading.Thread(target=next_start)
    writer.start()
    followed = CliRunner().invoke(cli, ["logs", str(path), "-f"])
    writer.join()
    assert followed.exit_code == 0 and followed.output.endswith("resumed\n"), followed.output


def test_logs_follow_of_a_local_run_stops_once_it_ended(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    out = runs_root.parent / "job.sbatch"
    rendered = CliRunner().invoke(cli, ["render", str(DIGITS), "--site", "local", "-o", str(out)])
    assert rendered.exit_code == 0
    (path,) = runs_root.iterdir()
    (path / "logs" / "rank-0.log").write_text("step 1\n")
    write_events(
        path,
        {"event": STARTED, "job_id": "77", "step": 0},
        {"event": ENDED, "job_id": "77", "exit_code": 1, "reason": "failed", "step": 0},
    )
    result = CliRunner().invoke(cli, ["logs", str(path), "-f"])
    assert result.exit_code == 0 and result.output == "step 1\n"
    assert not fake_slurm.calls("squeue")  # a local run: Slurm is not asked


def test_logs_follow_waits_for_a_log_not_written_yet(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "Priority", ""))

    def later() -> None:
        time.sleep(1.5)
        write_events(path, {"event": STARTED, "job_id": "4242", "step": 0})
        (path / "logs" / "rank-0.log").write_text(header(0, 1) + "hello\n")
        write_events(path, {"event": CANCELLED, "jobs": ["4242"]})

    writer = threading.Thread(target=later)
    writer.start()
    result = CliRunner().invoke(cli, ["logs", str(path), "-f"])
    writer.join()
    assert result.exit_code == 0 and result.output.endswith("hello\n"), result.output


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_records_the_end_status_shows_it_and_resubmit_still_works(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(path, {"event": STARTED, "job_id": "4242", "step": 0})
    result = CliRunner().invoke(cli, ["cancel", str(path)])
    assert result.exit_code == 0 and result.output == "cancelled: 4242\n"
    assert fake_slurm.calls("scancel") == ["-- 4242"]
    # Slurm has forgotten the job: status shows it ended, from the journal.
    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    status = CliRunner().invoke(cli, ["status", str(path)])
    assert status.stdout.startswith("run: cancelled (cancelled by the user)")
    assert "job 4242: ENDED (cancelled) starts 1" in status.stdout
    assert "start 1: job 4242 from step 0: not ended\n" in status.stdout  # nobody knows more
    fake_slurm.answer("squeue", squeue_line("4242", "CANCELLED"))
    status = CliRunner().invoke(cli, ["status", str(path)])
    assert "job 4242: CANCELLED starts 1" in status.stdout
    assert (
        "start 1: job 4242 from step 0: ended without a record of its own (Slurm: CANCELLED)\n"
        in status.stdout
    )
    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    listed = CliRunner().invoke(cli, ["status"])
    row = table(listed.stdout)[path.name]
    assert (row["SLURM"], row["STATE"]) == ("ENDED (cancelled)", "cancelled")
    # Nothing left to cancel.
    again = CliRunner().invoke(cli, ["cancel", str(path)])
    assert again.exit_code == 0 and "nothing to cancel" in again.output
    assert fake_slurm.calls("scancel") == ["-- 4242"]

    fake_slurm.answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    fake_slurm.answer("sbatch", "4343\n")
    resubmitted = CliRunner().invoke(cli, ["resubmit", str(path)])
    assert resubmitted.exit_code == 0, resubmitted.output
    assert "submitted job 4343" in resubmitted.output
    fake_slurm.answer("squeue", squeue_line("4343", "PENDING", "Priority", ""))
    status = CliRunner().invoke(cli, ["status", "--json", str(path)])
    run = json.loads(status.stdout)["runs"][0]
    assert run["state"] == "queued" and run["job"] == "4343"
    assert run["slurm"] == {
        "state": "PENDING",
        "reason": "Priority",
        "source": "squeue",
        "start": "2026-12-01T04:29:39",
    }
    # The second cancel cancels the new job only.
    CliRunner().invoke(cli, ["cancel", str(path)])
    assert fake_slurm.calls("scancel") == ["-- 4242", "-- 4343"]


def test_cancel_of_a_local_run_without_a_launcher_says_so(tmp_path: Path, runs_root: Path) -> None:
    # A running one: tests/test_local_control.py.
    out = tmp_path / "job.sbatch"
    rendered = CliRunner().invoke(cli, ["render", str(DIGITS), "--site", "local", "-o", str(out)])
    assert rendered.exit_code == 0
    (run_dir,) = runs_root.iterdir()
    result = CliRunner().invoke(cli, ["cancel", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert f"nothing to cancel: no launcher of {run_dir} runs on this host" in result.output


# --- plot --------------------------------------------------------------------------------------


def preempted_once(path: Path) -> None:
    write_events(
        path,
        {"event": STARTED, "job_id": "4242", "step": 0},
        {"event": ENDED, "job_id": "4242", "exit_code": 75, "reason": "preempted", "step": 150},
        {"event": REQUEUED, "job_id": "4242"},
        {"event": STARTED, "job_id": "4242", "step": 150},
        {"event": ENDED, "job_id": "4242", "exit_code": 0, "reason": "done", "step": 300},
    )
    metrics(
        path,
        *({"step": s, "loss": 2.0 / s, "steps_per_s": 30.0} for s in range(10, 310, 10)),
        {"step": 300, "eval": {"loss": 0.03, "accuracy": 0.97}},
    )


def test_plot_without_matplotlib_names_the_extra(
    runs_root: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = new_run(runs_root, fake_slurm)
    preempted_once(path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = CliRunner().invoke(cli, ["plot", str(path)])
    assert result.exit_code == 2
    assert result.output == (
        "Error: hpctf plot needs matplotlib, which is not installed: pip install matplotlib "
        "(into the environment that runs hpctf)\n"
    )


def test_plot_writes_a_png_marking_the_restart(
    runs_root: Path, fake_slurm: FakeSlurm, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    path = new_run(runs_root, fake_slurm)
    preempted_once(path)
    out = tmp_path / "loss.png"
    result = CliRunner().invoke(cli, ["plot", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    default = CliRunner().invoke(cli, ["plot", str(path)])
    assert default.exit_code == 0 and (path / "loss.png").exists()


def test_plot_titles_a_run_with_the_state_status_shows(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """The journal says the start failed; Slurm has requeued the job: both say requeued."""
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        *KILLED_START,
    )
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))
    (run,) = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["runs"]
    assert run["state"] == "requeued"
    assert plot.title(RunRecord.read(path)) == f"{path.name}: requeued, 1 start(s)"


def test_plot_of_a_run_without_metrics_says_so(runs_root: Path, fake_slurm: FakeSlurm) -> None:
    pytest.importorskip("matplotlib")
    path = new_run(runs_root, fake_slurm)
    result = CliRunner().invoke(cli, ["plot", str(path)])
    assert result.exit_code == 2 and "no loss logged yet" in result.output


# --- on the real test cluster -------------------------------------------------------------------


@pytest.fixture
def counted_squeue(
    tmp_path: Path, slurm_cluster: dict[str, str]
) -> Iterator[tuple[dict[str, str], Path]]:
    """An environment whose squeue and sacct are the real ones, each call counted."""
    shim = tmp_path / "shim"
    shim.mkdir()
    calls = tmp_path / "slurm-calls"
    for name in ("squeue", "sacct"):
        real = shutil.which(name)
        assert real
        script = shim / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexec {real} "$@"\n')
        script.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **slurm_cluster,
        "PATH": f"{shim}{os.pathsep}{slurm_cluster['PATH']}",
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        # `hpctf status` without RUN looks in every site's runs_root too, ~/hpctf-runs among
        # them: the machine's own runs (`make demo`'s) are not this test's.
        "HOME": str(home),
    }
    yield env, calls


def hpctf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)


def real_submit(env: dict[str, str], *sets: str) -> tuple[str, Path]:
    args = ["submit", str(DIGITS), "--site", "local-slurm"]
    for item in sets:
        args += ["--set", item]
    proc = hpctf(env, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job, path = submitted(proc.stdout)
    assert job
    return job, path


def until(check: object, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


@pytest.mark.slurm
@pytest.mark.tf
def test_real_status_of_two_runs_one_squeue_call(
    counted_squeue: tuple[dict[str, str], Path],
) -> None:
    env, calls = counted_squeue
    # One node each: these tests are about status, logs and cancel (a start of TensorFlow on
    # the shared test machine per rank); the forgotten job's test keeps two (its node list).
    short, short_dir = real_submit(env, "resources.nodes=1", "train.steps=100")
    info = wait_for_job(short)
    assert info["JobState"] == "COMPLETED", (short_dir / "logs" / "rank-0.log").read_text()
    long, long_dir = real_submit(
        env, "resources.nodes=1", *paced(), "train.steps=100000", "checkpoint.every_steps=1000"
    )  # trains until cancelled
    until(
        # A step's record, not the file: each start writes its resumed_from marker first.
        lambda: '"loss"' in _text(long_dir / "metrics.jsonl"),
        "the long run never logged a step",
    )
    calls.unlink(missing_ok=True)
    result = hpctf(env, "status")
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert (rows[short_dir.name]["SLURM"], rows[short_dir.name]["STATE"]) == ("COMPLETED", "done")
    assert (rows[long_dir.name]["SLURM"], rows[long_dir.name]["STATE"]) == ("RUNNING", "running")
    assert calls.read_text().splitlines() == [
        f"squeue --jobs={','.join(sorted([short, long]))} --array --states=all --noheader "
        "--format=%i|%T|%r|%S|%M|%N"
    ]  # both known to slurmctld: no sacct call
    document = json.loads(hpctf(env, "status", "--json").stdout)
    by_run = {r["run"]: r for r in document["runs"]}
    assert by_run[long_dir.name]["slurm"]["state"] == "RUNNING"
    assert by_run[long_dir.name]["step"] >= 1 and by_run[long_dir.name]["steps_per_s"] > 0
    assert by_run[short_dir.name]["step"] == 100

    # Cancelled: Slurm and the journal agree it ended; resubmit starts it again.
    cancelled = hpctf(env, "cancel", str(long_dir))
    assert cancelled.returncode == 0 and cancelled.stdout == f"cancelled: {long}\n"
    assert wait_for_job(long)["JobState"] == "CANCELLED"
    shown = hpctf(env, "status", str(long_dir))
    assert shown.stdout.startswith("run: cancelled (cancelled by the user)"), shown.stdout
    # Ended either way: recorded by its batch script, or (killed first) said by Slurm.
    job_line = next(line for line in shown.stdout.splitlines() if line.startswith(f"job {long}: "))
    assert job_line.split()[2] in ("ENDED", "CANCELLED"), shown.stdout
    assert (
        ": cancelled at step " in shown.stdout
        or "ended without a record of its own (Slurm: CANCELLED)" in shown.stdout
    ), shown.stdout
    again = hpctf(env, "resubmit", str(long_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    second, _ = submitted(again.stdout)
    assert second and second != long
    until(
        lambda: (
            json.loads(hpctf(env, "status", "--json", str(long_dir)).stdout)["runs"][0]["state"]
            == "running"
        ),
        "the resubmitted job never started",
    )
    assert hpctf(env, "cancel", str(long_dir)).stdout == f"cancelled: {second}\n"
    wait_for_job(second)


@pytest.mark.slurm
@pytest.mark.tf
def test_real_logs_follow_a_run_across_a_requeue_until_it_ends(
    counted_squeue: tuple[dict[str, str], Path],
) -> None:
    env, _ = counted_squeue
    job, path = real_submit(
        env, "resources.nodes=1", "train.steps=3000", "checkpoint.every_steps=100"
    )
    follower = subprocess.Popen(
        [*HPCTF, "logs", str(path), "-f"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        until(lambda: any((path / "checkpoints").glob("ckpt-*.index")), "no checkpoint")
        subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True)
        assert wait_for_job(job)["JobState"] == "COMPLETED"
        out, _ = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0
    separators = [line for line in out.splitlines() if line.startswith("===== start ")]
    assert [s.split(",")[0] for s in separators] == [
        f"===== start 1: job {job}",
        f"===== start 2: job {job}",
    ], out[-3000:]
    assert "training complete" in out.split(separators[1])[1]


@pytest.mark.slurm
@pytest.mark.tf
def test_real_status_of_a_job_slurmctld_has_forgotten(
    counted_squeue: tuple[dict[str, str], Path],
) -> None:
    """After MinJobAge (30 s on the test cluster) squeue no longer knows the job: sacct does
    (with HPCTF_SLURM_ACCOUNTING=1), else status shows the end the run directory recorded."""
    env, calls = counted_squeue
    job, path = real_submit(env, "train.steps=100")
    assert wait_for_job(job)["JobState"] == "COMPLETED"
    until(lambda: slurm.job_info(job) is None, "slurmctld still knows the job", timeout=600)
    calls.unlink(missing_ok=True)
    result = hpctf(env, "status", "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    (run,) = json.loads(result.stdout)["runs"]
    if accounting():  # the accounting database still knows it
        assert run["slurm"] == {"state": "COMPLETED", "reason": "", "source": "sacct"}
    else:
        assert run["slurm"] == {"state": "ENDED", "reason": "done", "source": "journal"}
    assert (run["state"], run["step"], run["job"]) == ("done", 100, job)
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["squeue", "sacct"]
    single = hpctf(env, "status", str(path))
    assert f"job {job}: ENDED exit 0 starts 1 nodes node[1-2]" in single.stdout


def accounting() -> bool:
    """Whether the test cluster keeps accounting (HPCTF_SLURM_ACCOUNTING, cluster.sh)."""
    return os.environ.get("HPCTF_SLURM_ACCOUNTING", "0") == "1"


def status_of(env: dict[str, str], path: Path) -> dict[str, object]:
    result = hpctf(env, "status", "--json", str(path))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    run: dict[str, object] = json.loads(result.stdout)["runs"][0]
    return run


@pytest.mark.slurm
@pytest.mark.tf
def test_real_status_follows_a_run_through_pending_running_a_requeue_and_completion(
    counted_squeue: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, calls = counted_squeue
    # Both nodes taken: the run waits, PENDING with Slurm's reason.
    blocker = subprocess.run(
        [
            *("sbatch", "--parsable", "-N2", "--ntasks-per-node=2"),
            *(f"--output={tmp_path}/b.out", "--wrap", "sleep 300"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    until(lambda: (slurm.job_info(blocker) or {}).get("JobState") == "RUNNING", "blocker")
    # notify: a webhook on loopback (the test cluster's nodes are this machine), every event.
    receiver = Receiver()
    job, path = real_submit(
        env,
        "resources.nodes=1",
        "train.steps=3000",
        "checkpoint.every_steps=100",
        f"notify.webhook={receiver.url}",
        "notify.on=done,failed,gave_up,budget_exhausted",
    )
    # Right after sbatch the reason is None until the scheduler has looked at the job.
    until(
        lambda: (status_of(env, path)["slurm"] or {}).get("reason") == "Resources",  # type: ignore[attr-defined]
        "the run never showed PENDING (Resources)",
        timeout=30,
    )
    seen = status_of(env, path)
    assert seen["state"] == "queued" and seen["job"] == job
    slurm_said = {k: seen["slurm"][k] for k in ("state", "reason", "source")}  # type: ignore[index]
    assert slurm_said == {"state": "PENDING", "reason": "Resources", "source": "squeue"}
    subprocess.run(["scancel", blocker], env=env, check=True)

    until(lambda: status_of(env, path)["state"] == "running", "the run never started")
    seen = status_of(env, path)
    assert seen["slurm"] == {"state": "RUNNING", "reason": "", "source": "squeue"}
    until(lambda: any((path / "checkpoints").glob("ckpt-*.index")), "no checkpoint")

    # Slurm requeues the job itself (as after a node failure).
    subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True)
    until(
        lambda: (status_of(env, path)["slurm"] or {}).get("state") == "PENDING",  # type: ignore[attr-defined]
        "not back in the queue",
    )
    seen = status_of(env, path)
    # Held after the requeue: Slurm's reason, and when it may start (squeue's StartTime).
    slurm_said = {k: seen["slurm"][k] for k in ("state", "reason", "source")}  # type: ignore[index]
    assert slurm_said == {"state": "PENDING", "reason": "BeginTime", "source": "squeue"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", seen["slurm"]["start"])  # type: ignore[index]
    assert seen["state"] == "requeued", seen
    assert wait_for_job(job)["JobState"] == "COMPLETED"
    # Across the requeue, one message: done, sent by job-end, recorded once; the URL (a
    # secret) is in no file but secrets.env.
    receiver.close()
    assert [m["event"] for m in receiver.got] == ["done"], receiver.got
    notices = [e for e in RunDir(path).events() if e["event"] == journal.NOTIFIED]
    assert [(e["notice"], e["start"]) for e in notices] == [("done", 2)], notices
    assert URL_SECRET not in (path / "config.json").read_text()
    seen = status_of(env, path)
    assert seen["slurm"] == {"state": "COMPLETED", "reason": "", "source": "squeue"}
    assert seen["state"] == "done" and seen["step"] == 3000
    # The first start: killed by the requeue, or saved first on its SIGTERM (timing decides).
    reasons = [s["reason"] for s in seen["starts"]]  # type: ignore[attr-defined,index]
    assert reasons in (["node_fail", "done"], ["preempted", "done"]), reasons
    calls.unlink()
    seen = status_of(env, path)
    # squeue for the state; one sacct for the hours (which asks every start: --duplicates).
    said = calls.read_text().splitlines()
    assert [line.split()[0] for line in said] == ["squeue", "sacct"], said
    assert "--duplicates" in said[1] and f"--jobs={job}" in said[1], said
    if not accounting():
        assert seen["hours"] == "unaccounted", seen
        return
    # sacct -D keeps every run of the job: the requeued one, then the last.
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", f"-j{job}", "--format=JobIDRaw,State,ElapsedRaw,NNodes"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line.split("|") for line in out.splitlines()]
    assert [(f[0], f[1]) for f in lines] == [(job, "REQUEUED"), (job, "COMPLETED")], out
    # The run's node-hours are what sacct says both starts held, summed here from its text.
    node_hours = sum(int(f[2]) * int(f[3]) for f in lines) / 3600
    assert node_hours > 0, out
    assert seen["hours"] == {
        "node_hours": round(node_hours, 6),
        "gpu_hours": 0.0,  # the digits run asks for no GPU
        "starts": 2,
    }, (seen["hours"], out)
    print(f"run hours: {seen['hours']}; sacct's sum {node_hours:.6f} node-h")


def test_job_record_final() -> None:
    assert JobRecord("1", "COMPLETED").final and not JobRecord("1", "PENDING").final


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
