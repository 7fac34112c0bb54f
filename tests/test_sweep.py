"""hpctf sweep without a cluster: planning the points (pure), bad grids refused before anything
is written, a 2,500-point sweep split into arrays under MaxArraySize 1,001 (dry run), and
submit, status, cancel and resubmit of a sweep directory against a fake Slurm."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run import journal
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.run.rundir import RunDir
from hpctf.login.resolving import readings
from hpctf.login.sweeps.plan import (
    Grid,
    Point,
    Range,
    chunks,
    parse_grid,
    parse_range,
    plan_points,
    run_names,
)
from tests.conftest import DIGITS, ENTRIES_PATH, require_tool, write
from tests.fake_slurm import FakeSlurm, squeue_line

# --- the points, pure ---------------------------------------------------------------------------


def test_grid_points_are_the_product_last_key_fastest() -> None:
    points = plan_points([parse_grid("train.args.lr=0.1,0.01"), parse_grid("train.args.w=8,16")])
    assert [dict(p.values) for p in points] == [
        {"train.args.lr": "0.1", "train.args.w": "8"},
        {"train.args.lr": "0.1", "train.args.w": "16"},
        {"train.args.lr": "0.01", "train.args.w": "8"},
        {"train.args.lr": "0.01", "train.args.w": "16"},
    ]
    assert [p.index for p in points] == [0, 1, 2, 3]
    assert points[1].sets() == ["train.args.lr=0.1", "train.args.w=16"]


def test_a_yaml_list_value_keeps_its_commas() -> None:
    assert parse_grid("train.python_path=[a,b],[c]").values == ("[a,b]", "[c]")


def test_random_draws_are_seeded_in_range_and_times_the_grid() -> None:
    ranges = [parse_range("train.args.lr=1e-4:1e-1:log"), parse_range("train.args.w=8:64")]
    grid = [Grid("train.seed", ("0", "1"))]
    first = plan_points(grid, ranges, draws=5, seed=7)
    assert len(first) == 10
    assert [dict(p.values) for p in first] == [
        dict(p.values) for p in plan_points(grid, ranges, 5, 7)
    ]
    assert [dict(p.values) for p in first] != [
        dict(p.values) for p in plan_points(grid, ranges, 5, 8)
    ]
    for point in first:
        assert 1e-4 <= float(point.values["train.args.lr"]) <= 1e-1
        assert re.fullmatch(r"\d+", point.values["train.args.w"])  # integer ends: integers
        assert 8 <= int(point.values["train.args.w"]) <= 64
    # The same draws for each grid value.
    assert [p.values["train.args.lr"] for p in first[:5]] == [
        p.values["train.args.lr"] for p in first[5:]
    ]


def test_run_names_are_safe_and_unique() -> None:
    points = [
        Point(0, {"train.args.lr": "0.01", "train.args.act": "re lu/x"}),
        Point(1, {"train.args.lr": "0.01", "train.args.act": "re:lu/x"}),
        Point(2, {"train.args.lr": "1e-3", "train.args.act": "../etc"}),
    ]
    names = run_names("digits", points)
    assert names == [
        "digits-lr0.01-actre_lu_x",
        "digits-lr0.01-actre_lu_x-1",
        "digits-lr1e-3-actetc",
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)


def test_chunks_count_from_zero_below_max_array_size() -> None:
    parts = chunks(range(2500), 1001)
    assert [len(c.indices) for c in parts] == [1001, 1001, 498]
    assert parts[1].indices[0] == 1001 and parts[2].indices[-1] == 2499
    assert [c.spec(4) for c in parts] == ["0-1000%4", "0-1000%4", "0-497%4"]
    assert chunks([7], 1001)[0].spec(None) == "0"


def test_a_range_needs_draws_and_draws_need_a_range() -> None:
    with pytest.raises(Exception, match="--range needs --random N"):
        plan_points([], [Range("train.args.lr", 0.1, 1.0, False, False)])
    with pytest.raises(Exception, match="--random N needs at least one --range"):
        plan_points([Grid("train.seed", ("1",))], [], draws=3)


# --- bad grids: one line each, exit 2, nothing written ---------------------------------------

BAD_GRIDS = [
    (
        "unknown key",
        ["--grid", "train.argz.lr=0.1,0.2"],
        "train.argz: unknown key (did you mean 'args'?); allowed: args,",
    ),
    (
        "a value the schema refuses",
        ["--grid", "train.steps=100,0"],
        "train.steps: value '0' refused: ",
    ),
    ("an empty grid", ["--grid", "train.steps="], "an empty value; give one or more"),
    ("an empty value", ["--grid", "train.steps=1,,2"], "an empty value"),
    (
        "a duplicate key",
        ["--grid", "train.steps=1,2", "--grid", "train.steps=3"],
        "train.steps: swept twice",
    ),
    ("a value twice", ["--grid", "train.seed=1,1"], "value '1' given twice"),
    (
        "swept and --set",
        ["--grid", "train.seed=1,2", "--set", "train.seed=3"],
        "train.seed: swept and also given by --set",
    ),
    (
        "more points than --max-points",
        ["--grid", "train.seed=1,2,3", "--grid", "train.steps=1,2", "--max-points", "5"],
        "6 points is more than --max-points 5",
    ),
    (
        "the default --max-points",
        [
            "--grid",
            "train.seed=" + ",".join(map(str, range(101))),
            "--grid",
            "train.steps=1,2,3,4,5,6,7,8,9,10",
        ],
        "1010 points is more than --max-points 1000",
    ),
    (
        "a key that changes the batch script",
        ["--grid", "resources.nodes=1,2"],
        "resources.nodes: changes the batch script",
    ),
    ("a bad range", ["--random", "2", "--range", "train.args.lr=1:0"], "must be below HI"),
    ("a log range from 0", ["--random", "2", "--range", "train.args.lr=0:1:log"], "LO > 0"),
    ("nothing to sweep", [], "nothing to sweep"),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in BAD_GRIDS], ids=[c[0] for c in BAD_GRIDS]
)
def test_bad_grids_are_refused_before_anything_is_written(
    runs_root: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, ["sweep", str(DIGITS), "--site", "local-slurm", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert not runs_root.exists() or not any(runs_root.iterdir())


# --- 2,500 points under MaxArraySize 1,001: three arrays, dry run ---------------------------


def test_2500_points_split_into_arrays_under_max_array_size_in_a_dry_run(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = tmp_path / "sites"
    write(
        sites / "small.yaml", "name: small\nextends: local-slurm\nsweep: {max_array_size: 1001}\n"
    )
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    # Planned once (issue #21): the experiment and the site are read and parsed once, not per
    # point.
    reads: list[str] = []
    for name in ("load_yaml", "read_site_file"):
        real = getattr(readings, name)
        monkeypatch.setattr(
            readings, name, lambda *a, _real=real, _name=name: reads.append(_name) or _real(*a)
        )
    began = time.monotonic()
    result = CliRunner().invoke(
        cli,
        [
            "sweep", str(DIGITS), "--site", "small", "--grid",
            "train.seed=" + ",".join(map(str, range(50))), "--grid",
            "train.log_every_steps=" + ",".join(map(str, range(1, 51))),
            "--max-running", "8", "--max-points", "2500", "--dry-run",
        ],
    )  # fmt: skip
    took = time.monotonic() - began
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "# 3 job array(s) of at most 1001 tasks (site small: sweep.max_array_size)" in out
    assert len(re.findall(r"^# point \d+: ", out, re.M)) == 2500
    scripts = re.split(r"^# ----- array-\d\.sbatch: points .*$", out, flags=re.M)[1:]
    assert [re.search(r"^#SBATCH --array=(\S+)$", s, re.M).group(1) for s in scripts] == [  # type: ignore[union-attr]
        "0-1000%8",
        "0-1000%8",
        "0-497%8",
    ]
    run_dirs = [re.findall(r"^  '(/[^']+)'$", s, re.M) for s in scripts]
    assert [len(d) for d in run_dirs] == [1001, 1001, 498]
    # Task 0 of the third array is point 2002 (seed 40, log_every_steps 3).
    assert run_dirs[2][0].endswith("/digits-seed40-log_every_steps3")
    assert len({d for part in run_dirs for d in part}) == 2500
    assert not runs_root.exists()  # nothing written
    assert sorted(reads) == ["load_yaml", "read_site_file"]
    print(f"2,500-point dry run took {took:.1f} s")


def test_the_array_script_passes_shellcheck_and_picks_its_run_dir(
    runs_root: Path, tmp_path: Path
) -> None:
    shellcheck = require_tool("shellcheck")
    result = CliRunner().invoke(
        cli,
        [
            "sweep",
            str(DIGITS),
            "--site",
            "local-slurm",
            "--grid",
            "train.args.out=a,it's",
            "--set",
            "train.entry=entries:compile_style",
            "--set",
            "train.args={}",
            "--set",
            f"train.python_path=[{', '.join(ENTRIES_PATH)}]",
            "--dry-run",
        ],
    )  # fmt: skip  (an entry whose `out` takes any str: train.args values are typed)
    assert result.exit_code == 0, result.output
    script = result.stdout[result.stdout.index("#!/bin/bash") :]
    path = write(tmp_path / "array.sh", script)
    check = subprocess.run([shellcheck, str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout
    # The RUN_DIR lines alone, under bash: task 1 gets the hostile name, quoted; task 2 none.
    head = script[: script.index("# The array's output")]
    for task, want in (("1", "digits-outit_s"), ("2", "")):
        proc = subprocess.run(
            ["bash", "-c", head + 'echo "RUN_DIR=$RUN_DIR"'],
            env={"SLURM_ARRAY_TASK_ID": task, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )
        if want:
            assert proc.stdout.strip().endswith(f"/{want}"), proc.stdout + proc.stderr
        else:
            assert proc.returncode == 1 and "has no point in this script" in proc.stderr


# --- submit, status, cancel, resubmit against a fake Slurm ------------------------------------


def _sweep(fake: FakeSlurm, *args: str) -> Path:
    result = CliRunner().invoke(
        cli,
        ["sweep", str(DIGITS), "--site", "local-slurm", "--grid", "train.seed=0,1,2", *args],
    )
    assert result.exit_code == 0, result.output
    return Path(re.search(r"^sweep directory: (\S+)$", result.output, re.M).group(1))  # type: ignore[union-attr]


def test_an_array_sweep_json_never_heard_of_is_cancelled_and_blocks_resubmit(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """A second sweep command killed while sbatch ran left array 5555 in Slurm, unrecorded:
    found by the sweep's comment, resubmit refuses a third array beside it in one line, and
    cancel stops it with the recorded one."""
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\nMaxJobCount = 10000\n")
    path = _sweep(fake_slurm)
    ours = slurm_comment(path)
    fake_slurm.answer("squeue", f"5555_0|{ours}\n5555_1|{ours}\n4242_0|{ours}\n77|other\n")
    refused = CliRunner().invoke(cli, ["resubmit", str(path)])
    assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert "job array 5555 of" in refused.output and "not in its sweep.json" in refused.output
    assert len(fake_slurm.calls("sbatch")) == 1
    cancelled = CliRunner().invoke(cli, ["cancel", str(path)])
    assert cancelled.exit_code == 0, cancelled.output
    (scancel,) = fake_slurm.calls("scancel")
    assert "5555" in scancel.split() and "77" not in scancel.split()


def test_sweep_submits_one_array_and_records_each_task_in_its_run(
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\nMaxJobCount = 10000\n")
    path = _sweep(fake_slurm, "--max-running", "2")
    (call,) = fake_slurm.calls("sbatch")
    assert call == f"--parsable --comment={slurm_comment(path)} {path}/array-0.sbatch"
    assert "#SBATCH --array=0-2%2" in (path / "array-0.sbatch").read_text()
    record = json.loads((path / "sweep.json").read_text())
    assert [p["values"] for p in record["points"]] == [{"train.seed": str(i)} for i in range(3)]
    assert record["arrays"] == [
        {"job_id": "4242", "indices": [0, 1, 2], "script": str(path / "array-0.sbatch")}
    ]
    for index, point in enumerate(record["points"]):
        run_dir = Path(point["run_dir"])
        assert run_dir.parent == path and run_dir.name == f"digits-seed{index}"
        assert (
            json.loads((run_dir / "config.json").read_text())["experiment"]["train"]["seed"]
            == index
        )
        submitted = RunDir(run_dir).events()[-1]
        assert submitted["event"] == "submitted" and submitted["job_id"] == f"4242_{index}"

    # status: one squeue call for every point, one line each.
    fake_slurm.answer(
        "squeue", squeue_line("4242_0", "RUNNING") + squeue_line("4242_1", "PENDING", "Priority")
    )
    result = CliRunner().invoke(cli, ["status", str(path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(p["index"], p["job"], p["slurm"]["state"]) for p in document["points"]] == [
        (0, "4242_0", "RUNNING"),
        (1, "4242_1", "PENDING"),
        (2, "4242_2", "UNKNOWN"),
    ]
    assert len(fake_slurm.calls("squeue")) == 1
    text = CliRunner().invoke(cli, ["status", str(path)]).stdout
    assert text.startswith(f"sweep {path.name}: 3 points: 3 queued\n")
    assert re.search(r"^1 +seed=1 +4242_1 +PENDING \(Priority\) +queued", text, re.M), text

    # A point finished; cancel stops the others in one scancel; resubmit resumes only them.
    runs = [Path(p["run_dir"]) for p in record["points"]]
    (runs[1] / "DONE").write_text('{"step": 300, "eval": {"accuracy": 0.9}}\n')
    ended = {"job_id": "4242_1", "exit_code": 0, "reason": "done", "step": 300}
    started = {"event": journal.STARTED, "job_id": "4242_1", "step": 0}
    write(runs[1] / "journal" / "99999999999999999999-1-started.json",
          json.dumps({**started, "time": "2026-12-01T00:00:00+00:00"}))  # fmt: skip
    write(runs[1] / "journal" / "99999999999999999999-2-ended.json",
          json.dumps({"event": journal.ENDED, "time": "2026-12-01T00:00:05+00:00",
                      **ended}))  # fmt: skip
    result = CliRunner().invoke(cli, ["cancel", str(path)])
    assert result.exit_code == 0, result.output
    assert fake_slurm.calls("scancel") == ["-- 4242_0 4242_2"]
    assert [e["event"] for e in RunDir(runs[0]).events()][-1] == "cancelled"
    assert [e["event"] for e in RunDir(runs[1]).events()][-1] == "ended"

    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    fake_slurm.answer("sbatch", "4300\n")
    result = CliRunner().invoke(cli, ["resubmit", str(path)])
    assert result.exit_code == 0, result.output
    comment = f"--comment={slurm_comment(path)}"
    assert fake_slurm.calls("sbatch")[-1] == f"--parsable {comment} {path}/array-1.sbatch"
    script = (path / "array-1.sbatch").read_text()
    assert "#SBATCH --array=0-1%2" in script
    assert re.findall(r"^  '(/[^']+)'$", script, re.M) == [str(runs[0]), str(runs[2])]
    assert RunDir(runs[2]).events()[-1]["job_id"] == "4300_1"
    assert json.loads((path / "sweep.json").read_text())["arrays"][-1]["indices"] == [0, 2]


def test_arrays_after_the_first_wait_for_the_one_before(
    runs_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_slurm: FakeSlurm,
) -> None:
    sites = tmp_path / "sites"
    write(sites / "tiny.yaml", "name: tiny\nextends: local-slurm\nsweep: {max_array_size: 2}\n")
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    result = CliRunner().invoke(
        cli,
        [
            "sweep",
            str(DIGITS),
            "--site",
            "tiny",
            "--grid",
            "train.seed=0,1,2",
            "--max-running",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    calls = fake_slurm.calls("sbatch")
    assert len(calls) == 2 and "--dependency=afterany:4242 " in calls[1]
    assert fake_slurm.calls("scontrol") == []  # the site's limit: Slurm not asked


# --- the points checked: the script's inputs, and forked checkers against one process --------


def test_the_script_reads_only_what_script_inputs_names(runs_root: Path) -> None:
    """A point whose script_inputs equal the first point's is not rendered (OneScript): that
    holds only while render reads nothing else of the config. Everything else changed here."""
    from hpctf.core.settings.tracking import Tracking, WandbTracking
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.render import render
    from hpctf.login.sweeps.points import script_inputs

    config = load_config(DIGITS, "local-slurm", [], {"HOME": "/home/x"}).config
    other = load_config(
        DIGITS, "local-slurm",
        ["train.steps=7", "train.seed=3", "train.args.hidden=8", "train.log_every_steps=1",
         "checkpoint.every_steps=2", "checkpoint.keep=9", "checkpoint.asynchronous=false",
         "train.python_path=[/tmp, .]", "site=local"],
        {"HOME": "/home/x"},
    ).config  # fmt: skip
    tracked = other.experiment.model_copy(
        update={"tracking": Tracking(wandb=WandbTracking(project="p", mode="offline"))}
    )
    other = other.model_copy(
        update={"experiment": tracked, "experiment_file": "/elsewhere/experiment.yaml"}
    )
    assert script_inputs(other) == script_inputs(config)
    assert render(other, Path("/r")) == render(config, Path("/r"))
    env = config.experiment.model_copy(update={"env": {"X": "1"}})
    assert script_inputs(config.model_copy(update={"experiment": env})) != script_inputs(config)


def _steps_or_epochs(tmp_path: Path) -> Path:
    """The digits experiment with neither train.steps nor train.epochs: each alone is valid,
    both together are not (a point's problem, not a value's)."""
    folder = tmp_path / "digits"
    folder.mkdir()
    (folder / "digits.py").write_text((DIGITS.parent / "digits.py").read_text())
    text = DIGITS.read_text().replace("  steps: 300\n", "")
    return write(folder / "experiment.yaml", text)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (  # every point valid
            ["--set", "train.steps=5", "--grid", "train.seed=0,1,2,3,4,5",
             "--grid", "train.log_every_steps=1,2"],
            None,
        ),
        (  # every point refused as a point: the first 10 said, in point order
            ["--grid", "train.steps=5,6,7,8,9,10", "--grid", "train.epochs=1,2"],
            r"point 0 \(steps=5 epochs=1\): .*give exactly one of train.steps or train.epochs"
            r"(.|\n)*point 9 \(steps=9 epochs=2\)(.|\n)*\.\.\. and 2 more$",
        ),
        (  # the script changes at point 1 (env is in the script)
            ["--set", "train.steps=5", "--grid", "train.seed=0,1,2", "--grid", "env.FOO=a,b"],
            r"^--grid/--range env.FOO: changes the batch script",
        ),
    ],
    ids=["valid", "points-refused", "script-changes"],
)  # fmt: skip
def test_forked_checkers_find_what_one_process_finds(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
    expected: str | None,
) -> None:  # fmt: skip
    from hpctf.login.sweeps import points

    experiment = _steps_or_epochs(tmp_path)
    argv = ["sweep", str(experiment), "--site", "local-slurm", "--dry-run", *args]
    outputs = []
    for parallel_from in (10**9, 2):  # one process, then forked checkers (2 of them)
        monkeypatch.setattr(points, "PARALLEL_FROM", parallel_from)
        monkeypatch.setattr(points, "_processes", lambda: 2)
        result = CliRunner().invoke(cli, argv)
        outputs.append((result.exit_code, re.sub(r"sweep-\d{8}-\d{6}", "sweep-T", result.output)))
    assert outputs[0] == outputs[1]
    code, text = outputs[0]
    if expected is None:
        assert code == 0 and text.count("# point ") == 12, text
    else:
        assert code == 2 and re.search(expected, text.removeprefix("Error: ").strip()), text


# --- a sweep's points at filesystem speed ---------------------------------------------------------


def test_each_points_script_is_the_one_render_would_write_for_it(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep renders its points' scripts once (points.point_scripts): each one is still
    what rendering that point alone gives, its run directory and job name its own; a path
    that quoting would change is rendered on its own, and a template that uses the path in
    another way (checked against the first and last points) makes every script rendered."""
    from hpctf.login.submitting.render import render
    from hpctf.login.sweeps import points as point_checks
    from hpctf.login.sweeps.start import plan

    planned = plan(DIGITS, ["train.seed=0,1,2,3"], [], None, 0, 100, "local-slurm", [])
    paths = [runs_root / "s" / f"digits-seed{i}" for i in range(3)] + [tmp_path / "odd(1)"]
    store = runs_root / "s" / "code"
    expected = [render(c, p, code_store=store) for c, p in zip(planned.configs, paths, strict=True)]
    rendered: list[Path] = []
    real = point_checks.render

    def counted(config: object, path: Path, **kwargs: Any) -> str:
        rendered.append(path)
        return real(config, path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(point_checks, "render", counted)
    assert point_checks.point_scripts(planned.configs, paths, store) == expected
    assert "--job-name=digits-seed2" in expected[2] and str(paths[2]) in expected[2]
    # The stand-in, the odd path, then the first and last again to check: not every point.
    assert len(rendered) == 4 and rendered[1] == paths[3]

    def lengths(config: object, path: Path, **kwargs: Any) -> str:  # uses the path otherwise
        return real(config, path, **kwargs) + f"# {len(str(path))}\n"  # type: ignore[arg-type]

    monkeypatch.setattr(point_checks, "render", lengths)
    assert point_checks.point_scripts(planned.configs[:3], paths[:3], store) == [
        e + f"# {len(str(p))}\n" for e, p in zip(expected[:3], paths[:3], strict=True)
    ]


def test_a_submitted_record_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    """The sweep's `submitted` records (bulk_create.record_unsynced) open the journal without
    following a link: one planted for it is refused and nothing lands where it points."""
    from hpctf.core.errors import UserError
    from hpctf.core.run.bulk_create import record_unsynced

    run = RunDir(tmp_path / "run")
    run.journal.mkdir(parents=True)
    record_unsynced(run, *journal.submitted("7_0", array_job_id="7", array_task_id=0))
    (entry,) = run.events()
    assert (entry["event"], entry["job_id"], entry["array_task_id"]) == ("submitted", "7_0", 0)
    assert [p.name for p in run.journal.iterdir() if not p.name.endswith(".json")] == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = RunDir(tmp_path / "planted")
    planted.path.mkdir()
    planted.journal.symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        record_unsynced(planted, *journal.submitted("7_1"))
    assert list(elsewhere.iterdir()) == []


def test_plot_of_a_grid_sweep_draws_every_point(tmp_path: Path) -> None:
    """``hpctf plot SWEEP`` of a grid (not a search): every point's loss and eval curve, in
    one PNG beside sweep.json; a grid whose points logged nothing says so in one line."""
    pytest.importorskip("matplotlib")
    from hpctf.login.sweeps.sweep_dir import SweepDir
    from hpctf.login.sweeps.sweep_record import SweepRecord

    sweep = tmp_path / "grid"
    sweep.mkdir()
    points = []
    for index, rate in enumerate((0.1, 0.01)):
        run_dir = sweep / f"point-{index}"
        run_dir.mkdir()
        lines = [json.dumps({"step": step, "loss": rate * 100 / step}) for step in (10, 20, 30)] + [
            json.dumps({"step": 30, "eval": {"accuracy": 0.5 + rate}})
        ]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        points.append({"index": index, "values": {"train.args.learning_rate": rate},
                       "run_dir": str(run_dir)})  # fmt: skip
    SweepDir(sweep, SweepRecord.from_json({"name": "grid", "points": points})).write()
    result = CliRunner().invoke(cli, ["plot", str(sweep)])
    assert result.exit_code == 0, result.output
    out = sweep / "sweep.png"
    assert result.output == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    for point in points:
        (Path(point["run_dir"]) / "metrics.jsonl").write_text("")
    empty = CliRunner().invoke(cli, ["plot", str(sweep)])
    assert empty.exit_code == 2 and "no point has logged a loss yet" in empty.output
