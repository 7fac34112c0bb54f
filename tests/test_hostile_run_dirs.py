"""A run directory is data anyone who can write it controls: what hpctf reads from it is checked
before it reaches a Slurm command, one damaged entry or run is said in one line and never breaks
a listing of many; its code snapshot is read-only, and a copy of it starts or cancels nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.errors import DamagedRecord
from hpctf.core.run import journal
from hpctf.core.run.journal_entries import problem as journal_problem
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm, slurm_queries
from tests.conftest import DIGITS
from tests.fake_slurm import FakeSlurm, new_run
from tests.journal_records import write_events

# --- job ids from the journal -----------------------------------------------------------------


def raw_entry(path: Path, name: str, data: bytes) -> Path:
    """A journal file written by someone other than hpctf, sorted after every real one."""
    file = path / "journal" / f"99999999999999999999-1-{name}.json"
    file.write_bytes(data)
    return file


def test_a_journal_job_id_that_is_an_option_reaches_no_slurm_command(
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    path = new_run(runs_root, fake_slurm)
    entry = raw_entry(
        path,
        "submitted",
        json.dumps(
            {
                "event": journal.SUBMITTED,
                "time": "2026-12-01T00:00:00+00:00",
                "job_id": "--user=root",
            }
        ).encode(),
    )
    result = CliRunner().invoke(cli, ["cancel", str(path)])
    assert result.exit_code == 3, result.output  # hpctf's own record is damaged: no user input
    assert result.output == (
        f"Error: damaged journal entry {entry}: job_id '--user=root' is not a job id: hpctf did "
        "not write it; move it out of the journal directory and run the command again\n"
    )
    resubmitted = CliRunner().invoke(cli, ["resubmit", str(path)])
    assert resubmitted.exit_code == 3 and "damaged journal entry" in resubmitted.output
    assert fake_slurm.calls("scancel") == [] and fake_slurm.calls("scontrol") == []

    # The wrapper refuses such an id whoever hands it over: one place, before any command.
    for bad in ("--user=root", "-u", "1 2", "1,2", "", "12_", "_3", "1.0", "12\n", "\uff11\uff12"):
        with pytest.raises(DamagedRecord, match="is not a Slurm job id"):
            slurm.cancel(["4242", bad])
        with pytest.raises(DamagedRecord, match="is not a Slurm job id"):
            slurm.job_info(bad)
        with pytest.raises(DamagedRecord, match="is not a Slurm job id"):
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
    fake_slurm: FakeSlurm,
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
    fake_slurm: FakeSlurm,
) -> None:
    path = new_run(runs_root, fake_slurm)
    write_events(
        path,
        {"event": journal.STARTED, "job_id": "4242_3", "step": 0, "nodes": "node[1-2]"},
        {"event": journal.ENDED, "job_id": "4242_3", "exit_code": 0, "reason": "done", "step": 300},
    )
    events, damaged = RunDir(path).read_journal()
    assert damaged == [] and [e["event"] for e in events][-2:] == ["started", "ended"]
    assert journal_problem({"event": "x", "time": "t", "job_id": 12345}) is None
    assert journal_problem({"event": "x", "time": "t", "exit_code": True}) is not None


# --- a read-only code snapshot -----------------------------------------------------------------


def test_the_code_snapshot_is_read_only_and_a_shared_run_dir_is_warned_of(
    tmp_path: Path,
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    import os
    import stat

    import yaml

    code = tmp_path / "src"
    (code / "helpers").mkdir(parents=True)
    shutil.copy(DIGITS.parent / "digits.py", code / "digits.py")
    (code / "helpers" / "util.py").write_text("X = 1\n")
    for path in (code / "digits.py", code / "helpers" / "util.py"):
        path.chmod(0o666)  # world-writable at the source
    (code / "helpers").chmod(0o777)
    experiment = yaml.safe_load(DIGITS.read_text())
    experiment["train"]["python_path"] = [str(code)]
    experiment_file = tmp_path / "e.yaml"
    experiment_file.write_text(yaml.safe_dump(experiment))

    old = os.umask(0o002)  # usual for group project directories
    try:
        result = CliRunner().invoke(cli, ["submit", str(experiment_file), "--site", "local-slurm"])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    (run_dir,) = runs_root.iterdir()
    assert (
        f"warning: {run_dir} is group-writable (mode 775; umask 002): whoever can write it runs "
        f"code as you at its next start; chmod go-w {run_dir}, and set umask 022 before hpctf "
        "submit\n"
    ) in result.stderr

    def modes() -> dict[str, int]:
        return {
            str(p.relative_to(run_dir / "code")): stat.S_IMODE(p.stat().st_mode)
            for p in (run_dir / "code").rglob("*")
        }

    copied = modes()
    assert copied["0-src/digits.py"] == copied["0-src/helpers/util.py"] == 0o444
    assert copied["SNAPSHOT.json"] & 0o222 == 0
    assert copied["0-src/helpers"] == 0o755  # the owner may replace the copy, nobody else

    # --update-code replaces a read-only copy; the new one is read-only too.
    (code / "helpers" / "util.py").write_text("X = 2\n")
    fake_slurm.answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1)
    updated = CliRunner().invoke(cli, ["resubmit", "--update-code", str(run_dir)])
    assert updated.exit_code == 0, updated.output
    assert (run_dir / "code" / "0-src" / "helpers" / "util.py").read_text() == "X = 2\n"
    assert modes() == copied
    shutil.rmtree(run_dir)  # what tests and users do with a run: read-only files are no obstacle
    # No plain umask, no warning.
    again = CliRunner().invoke(cli, ["submit", str(experiment_file), "--site", "local-slurm"])
    assert again.exit_code == 0 and "writable" not in again.output


def test_a_sweep_that_loses_its_name_to_another_takes_the_next(
    runs_root: Path,
    fake_slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two sweeps of one experiment in the same second plan one name; the one whose mkdir loses
    plans again (it failed with `File exists`)."""
    from hpctf.login.sweeps import sweep_commands

    plan = sweep_commands._sweep_path
    taken: list[Path] = []

    def racing(config: object) -> Path:
        path = plan(config)  # type: ignore[arg-type]
        if not taken:  # the other sweep creates it right after we planned it
            path.mkdir(parents=True)
            taken.append(path)
        return path

    monkeypatch.setattr(sweep_commands, "_sweep_path", racing)
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\n")
    args = ["sweep", str(DIGITS), "--site", "local-slurm", "--grid", "train.seed=0,1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (other,) = taken
    assert f"sweep directory: {other}-1\n" in result.output
    assert list(other.iterdir()) == []  # the other sweep's directory is left alone
    runs = json.loads((Path(f"{other}-1") / "sweep.json").read_text())["points"]
    assert all(p["run_dir"].startswith(f"{other}-1/") for p in runs)


def test_a_runs_root_with_a_percent_sign_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch expands %u in --output: the job failed to launch and status said queued."""
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(tmp_path / "runs-%u"))
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "holds '%'" in result.output
    assert not (tmp_path / "runs-%u").exists()


# --- a copied run directory --------------------------------------------------------------------


def test_a_copied_run_directory_neither_runs_nor_cancels_the_original(
    runs_root: Path,
    fake_slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cp -a RUN copy; hpctf resubmit copy` submitted copy/job.sbatch, whose RUN_DIR named RUN:
    the job trained and journalled in the original, and the copy said queued for ever."""
    original = new_run(runs_root, fake_slurm)
    write_events(original, {"event": journal.STARTED, "job_id": "4242", "step": 0})
    copy = runs_root / "copy"
    shutil.copytree(original, copy, symlinks=True)
    said = (
        f"Error: {copy} is a copy of the run directory {original} (or was moved from there): "
        "its script, config and journal name that one, so it cannot run or be cancelled as it "
        f"is; continue the original with hpctf resubmit {original}, or start a new run with "
        "hpctf submit EXPERIMENT\n"
    )
    for command in (["resubmit", str(copy)], ["cancel", str(copy)]):
        result = CliRunner().invoke(cli, command)
        assert (result.exit_code, result.output) == (2, said), command
    monkeypatch.setenv("SLURM_JOB_ID", "4343")
    for command in (["job-start", str(copy)], ["worker", str(copy)]):
        result = CliRunner().invoke(cli, command)
        assert (result.exit_code, result.output) == (2, said), command
    assert fake_slurm.calls("sbatch") == [
        f"--parsable --comment={slurm_comment(original)} {original}/job.sbatch"
    ]
    assert fake_slurm.calls("scancel") == [] and fake_slurm.calls("scontrol") == []
    assert [e["event"] for e in RunDir(original).events()][-1] == "started"  # nothing written
    # A moved run directory is refused alike; the original itself is not.
    moved = runs_root / "moved"
    copy.rename(moved)
    assert (
        "is a copy of the run directory" in CliRunner().invoke(cli, ["cancel", str(moved)]).output
    )
    assert CliRunner().invoke(cli, ["cancel", str(original)]).exit_code == 0
    assert fake_slurm.calls("scancel") == ["-- 4242"]
