"""``sweep.json`` through its one model (:class:`hpctf.login.sweeps.sweep_record.SweepRecord`):
written and read back equal, the files hpctf wrote before it had a ``version`` read as version
1, and a damaged or newer file one line naming it, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.login.sweeps.sweep_dir import SweepDir
from hpctf.login.sweeps.sweep_record import (
    SWEEP_VERSION,
    SweepArray,
    SweepPoint,
    SweepRecord,
)

GRID = SweepRecord(
    name="digits",
    created="2026-12-01T07:00:00+00:00",
    experiment="/home/user/digits/experiment.yaml",
    site="local-slurm",
    scheduler="slurm",
    grid=["train.seed=0,1"],
    range=[],
    random=None,
    seed=0,
    overrides=["train.steps=20"],
    max_running=None,
    points=[
        SweepPoint(0, {"train.seed": "0"}, "/runs/s/digits-seed0"),
        SweepPoint(1, {"train.seed": "1"}, "/runs/s/digits-seed1"),
    ],
    arrays=[SweepArray("4242", "/runs/s/array-0.sbatch", indices=[0, 1])],
)
SEARCH = SweepRecord(
    name="digits",
    created="2026-12-02T07:00:00+00:00",
    experiment="/home/user/digits/experiment.yaml",
    site="local-slurm",
    scheduler="slurm",
    overrides=[],
    search={"trials": 6, "parallel": 2, "sampler": "tpe"},
    trials=6,
    tasks=2,
    arrays=[SweepArray("77", "/runs/s/array-0.sbatch", tasks=2)],
)

# What hpctf wrote before sweep.json had a version: a grid (hpctf sweep, issue #12) and a
# search (issue #33), key for key.
OLD_GRID = {
    "name": "digits",
    "created": "2026-12-01T07:00:00+00:00",
    "experiment": "/home/user/digits/experiment.yaml",
    "site": "local-slurm",
    "scheduler": "slurm",
    "grid": ["train.seed=0,1"],
    "range": [],
    "random": None,
    "seed": 0,
    "set": ["train.steps=20"],
    "max_running": None,
    "points": [
        {"index": 0, "values": {"train.seed": "0"}, "run_dir": "/runs/s/digits-seed0"},
        {"index": 1, "values": {"train.seed": "1"}, "run_dir": "/runs/s/digits-seed1"},
    ],
    "arrays": [{"job_id": "4242", "indices": [0, 1], "script": "/runs/s/array-0.sbatch"}],
}
OLD_SEARCH = {
    "name": "digits",
    "created": "2026-12-02T07:00:00+00:00",
    "experiment": "/home/user/digits/experiment.yaml",
    "site": "local-slurm",
    "scheduler": "slurm",
    "set": [],
    "search": {"trials": 6, "parallel": 2, "sampler": "tpe"},
    "trials": 6,
    "tasks": 2,
    "points": [],
    "arrays": [{"job_id": "77", "tasks": 2, "script": "/runs/s/array-0.sbatch"}],
}


@pytest.mark.parametrize("record", [GRID, SEARCH], ids=["grid", "search"])
def test_a_record_written_reads_back_equal(tmp_path: Path, record: SweepRecord) -> None:
    SweepDir(tmp_path, record).write()
    read = SweepDir.read(tmp_path)
    assert read.record == record
    assert read.record.version == SWEEP_VERSION == 1
    SweepDir(tmp_path, read.record).write()  # and again: the same text
    assert SweepDir.read(tmp_path).record == record


@pytest.mark.parametrize(
    ("old", "expected"), [(OLD_GRID, GRID), (OLD_SEARCH, SEARCH)], ids=["grid", "search"]
)
def test_a_sweep_json_without_version_reads_as_version_1_and_keeps_its_keys(
    tmp_path: Path, old: dict[str, object], expected: SweepRecord
) -> None:
    (tmp_path / "sweep.json").write_text(json.dumps(old, indent=2))
    read = SweepDir.read(tmp_path)
    assert read.record.version == 1
    assert read.record == expected
    assert read.data == {"version": 1, **old}  # the file's keys, none renamed or added
    read.write()  # a resubmit writes it back: version added, every key as it was
    assert json.loads((tmp_path / "sweep.json").read_text()) == {"version": 1, **old}


def test_a_key_of_another_hpctf_is_kept(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text(json.dumps({**OLD_GRID, "note": {"by": "later"}}))
    read = SweepDir.read(tmp_path)
    read.write()
    assert json.loads((tmp_path / "sweep.json").read_text())["note"] == {"by": "later"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"name": "digits", "points": [', "damaged sweep record: Expecting value"),
        ("[1, 2]", "damaged sweep record: sweep.json: a mapping expected, got list"),
        ('{"name": "digits"}', "damaged sweep record: points: a list of points expected"),
        (
            json.dumps({**OLD_GRID, "points": [{"index": 0, "values": {}}]}),
            "damaged sweep record: points.0.run_dir: a path expected, got NoneType",
        ),
        (
            json.dumps({**OLD_GRID, "arrays": [{"job_id": None, "script": "/a"}]}),
            "damaged sweep record: arrays.0.job_id: a job id expected, got NoneType",
        ),
        (
            json.dumps({**OLD_GRID, "max_running": "2"}),
            "damaged sweep record: max_running: an integer expected, got str",
        ),
        (
            json.dumps({**OLD_GRID, "seed": True}),
            "damaged sweep record: seed: an integer expected, got True",
        ),
        (
            json.dumps({**OLD_GRID, "version": 2}),
            "written by a newer hpctf (sweep record version 2; this hpctf reads up to 1): "
            "upgrade hpctf",
        ),
    ],
    ids=["json", "list", "no points", "no run_dir", "job id", "count", "bool", "newer"],
)
def test_a_damaged_sweep_json_is_one_line_naming_it_exit_2(
    tmp_path: Path, text: str, why: str
) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(text)
    for command in (["status", str(sweep)], ["resubmit", str(sweep)], ["cancel", str(sweep)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"Error: {sweep / 'sweep.json'}: {why}"), line
