"""A run directory is data anyone who can write it controls: what hpctf reads from it is checked
before it reaches a Slurm command, one damaged entry or run is said in one line and never breaks
a listing of many, and the files hpctf reads (YAML, JSON) are bounded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core import slurm, slurm_queries
from hpctf.core.errors import UserError
from hpctf.core.rundir import RunDir
from hpctf.core.runstate import journal_problem
from tests.test_lifecycle import FakeSlurm, fake_slurm, journal, new_run  # noqa: F401

# --- job ids from the journal -----------------------------------------------------------------


def raw_entry(path: Path, name: str, data: bytes) -> Path:
    """A journal file written by someone other than hpctf, sorted after every real one."""
    file = path / "journal" / f"99999999999999999999-1-{name}.json"
    file.write_bytes(data)
    return file


def test_a_journal_job_id_that_is_an_option_reaches_no_slurm_command(
    runs_root: Path,
    fake_slurm: FakeSlurm,  # noqa: F811
) -> None:
    path = new_run(runs_root, fake_slurm)
    entry = raw_entry(
        path,
        "submitted",
        json.dumps(
            {"event": "submitted", "time": "2026-12-01T00:00:00+00:00", "job_id": "--user=root"}
        ).encode(),
    )
    result = CliRunner().invoke(cli, ["cancel", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: damaged journal entry {entry}: job_id '--user=root' is not a job id: hpctf did "
        "not write it; move it out of the journal directory and run the command again\n"
    )
    resubmitted = CliRunner().invoke(cli, ["resubmit", str(path)])
    assert resubmitted.exit_code == 2 and "damaged journal entry" in resubmitted.output
    assert fake_slurm.calls("scancel") == [] and fake_slurm.calls("scontrol") == []

    # The wrapper refuses such an id whoever hands it over: one place, before any command.
    for bad in ("--user=root", "-u", "1 2", "1,2", "", "12_", "_3", "1.0", "12\n", "\uff11\uff12"):
        with pytest.raises(UserError, match="is not a Slurm job id"):
            slurm.cancel(["4242", bad])
        with pytest.raises(UserError, match="is not a Slurm job id"):
            slurm.job_info(bad)
        with pytest.raises(UserError, match="is not a Slurm job id"):
            slurm_queries.squeue_jobs([bad])
    assert fake_slurm.calls("scancel") == [] and fake_slurm.calls("squeue") == []
    slurm.cancel(["4242", "4243_7"])
    assert fake_slurm.calls("scancel") == ["-- 4242 4243_7"]  # `--`: no id is taken as an option


DAMAGED_ENTRIES = [
    (b"[]", "not an object but list"),
    (b"null", "not an object but NoneType"),
    (b'{"time": "2026-12-01T00:00:00+00:00"}', "no 'event' string"),
    (b'{"event": "started", "job_id": "7"}', "no 'time' string"),
    (b'{"event": "started", "time": "t", "step": "x"}', "step 'x' is not a whole number"),
    (bytes(range(256)) * 4, "not a JSON document"),
]


def test_one_damaged_run_never_breaks_a_listing_of_ten(
    runs_root: Path,
    fake_slurm: FakeSlurm,  # noqa: F811
) -> None:
    template = new_run(runs_root, fake_slurm)
    paths = [template]
    for i in range(9):
        paths.append(template.parent / f"copy-{i}")
        shutil.copytree(template, paths[-1])
    damaged = paths[3]
    files = [raw_entry(damaged, f"bad{i}", data) for i, (data, _) in enumerate(DAMAGED_ENTRIES)]
    for file, (_, why) in zip(files, DAMAGED_ENTRIES, strict=True):
        assert f"{file}: {why}" in RunDir(damaged).read_journal()[1]
    # An eleventh with a config.json of random bytes: left out, in one line.
    broken = template.parent / "broken"
    shutil.copytree(template, broken)
    (broken / "config.json").write_bytes(bytes(range(256)) * 4)

    listed = CliRunner().invoke(cli, ["runs", "--json"])
    assert listed.exit_code == 0, listed.output
    names = sorted(r["run"] for r in json.loads(listed.stdout)["runs"])
    assert names == sorted(p.name for p in paths)
    assert f"hpctf: {damaged}: 6 damaged journal entries left out, the first: {files[0]}" in (
        listed.stderr
    )
    assert f"hpctf: left out: {broken / 'config.json'}: damaged run config: Invalid JSON" in (
        listed.stderr
    )
    fake_slurm.answer("squeue", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    every = CliRunner().invoke(cli, ["status", "--all", "--json"])
    assert every.exit_code == 0, every.output
    assert len(json.loads(every.stdout)["runs"]) == 10
    # The damaged run on its own: its good entries still make its state.
    one = CliRunner().invoke(cli, ["status", str(damaged)])
    assert one.exit_code == 0 and one.stdout.startswith("run: queued")
    bad_config = CliRunner().invoke(cli, ["status", str(broken)])
    assert bad_config.exit_code == 2 and "damaged run config" in bad_config.output


def test_journal_entries_hpctf_writes_pass_the_check(
    runs_root: Path,
    fake_slurm: FakeSlurm,  # noqa: F811
) -> None:
    path = new_run(runs_root, fake_slurm)
    journal(
        path,
        {"event": "started", "job_id": "4242_3", "step": 0, "nodes": "node[1-2]"},
        {"event": "ended", "job_id": "4242_3", "exit_code": 0, "reason": "done", "step": 300},
    )
    events, damaged = RunDir(path).read_journal()
    assert damaged == [] and [e["event"] for e in events][-2:] == ["started", "ended"]
    assert journal_problem({"event": "x", "time": "t", "job_id": 12345}) is None
    assert journal_problem({"event": "x", "time": "t", "exit_code": True}) is not None


# --- bounded YAML ------------------------------------------------------------------------------


def alias_bomb(levels: int = 10, aliases: int = 9) -> str:
    """``aliases ** levels`` strings in a few hundred bytes, under train.args."""
    lines = ["name: bomb", "train:", "  args:"]
    lines.append(f"    a0: &a0 [{', '.join(['lol'] * aliases)}]")
    for level in range(1, levels + 1):
        lines.append(f"    a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * aliases)}]")
    return "\n".join(lines) + "\n"


MEASURE = """
import resource, sys, time
from pathlib import Path
from hpctf.core.errors import UserError
from hpctf.core.sources import load_yaml
began = time.perf_counter()
try:
    load_yaml(Path(sys.argv[1]))
    said = "loaded"
except UserError as exc:
    said = str(exc)
print(time.perf_counter() - began)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
print(said)
"""


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (alias_bomb(), 9, "more than 100,000 values once its aliases (*name) are expanded"),
        # The same under a key the schema does not know: refused before the schema looks.
        (alias_bomb().replace("train:\n  args:", "unknown:\n  more:"), 9, "more than 100,000"),
        ("name: deep\nx: " + "[" * 100_000 + "]" * 100_000 + "\n", 2, "nested deeper than 100"),
        ("[" * 100_000, 1, "nested deeper than 100 levels"),
        ("a: &a [*a]\n", 1, "an alias refers to a value that holds it"),
    ],
    ids=["alias-bomb", "alias-bomb-unknown-key", "deep-nesting", "deep-unclosed", "recursive"],
)
def test_hostile_yaml_is_one_line_fast_and_small(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    import subprocess
    import sys

    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=True
    )
    seconds, peak_mb, said = proc.stdout.splitlines()
    assert said.startswith(f"{path}:{line}: invalid YAML: {problem}"), said
    assert float(seconds) < 1.0 and int(peak_mb) < 200, (seconds, peak_mb)
    # Through the CLI: one line, exit 2 (a bug would be exit 70 with a traceback).
    result = CliRunner().invoke(cli, ["validate", str(path), "--site", "local"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def test_aliases_within_the_bound_still_work(tmp_path: Path) -> None:
    from hpctf.core.sources import load_yaml

    path = tmp_path / "e.yaml"
    path.write_text(
        "base: &base {lr: 0.1, steps: 10}\ntrain:\n  args:\n    <<: *base\n    b: *base\n"
    )
    data, lines = load_yaml(path)
    assert data["train"]["args"] == {"lr": 0.1, "steps": 10, "b": {"lr": 0.1, "steps": 10}}
    assert lines[("train", "args", "b")] == 5 and lines[("base", "lr")] == 1
