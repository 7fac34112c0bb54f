"""The index of a runs root (hpctf.core.run.run_index): a listing reads each run directory only
when it changed, writers add rows without losing any, a damaged index or journal still lists
every run with a clear state (real writers, no Slurm, no TensorFlow)."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run import journal, listing, run_index
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir
from hpctf.login.reading.runs import find_runs
from tests.conftest import made_run


def states(root: Path) -> dict[str, str]:
    return {facts.name: facts.state.state for facts in find_runs(root)}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every run directory the listing reads in full."""
    seen: list[Path] = []
    real = run_index.read_facts

    def counted(path: Path) -> listing.RunFacts:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(run_index, "read_facts", counted)
    monkeypatch.setattr(run_index, "SETTLE_NS", 0)  # rows settle at once: no clock to wait on
    return seen


def test_a_listing_reads_only_the_runs_that_changed(tmp_path: Path, reads: list[Path]) -> None:
    first, second = made_run(tmp_path, "a"), made_run(tmp_path, "b")
    assert states(tmp_path) == {"a": "queued", "b": "queued"}
    assert sorted(p.name for p in reads) == ["a", "b"]
    reads.clear()
    assert states(tmp_path) == {"a": "queued", "b": "queued"}
    assert reads == []  # from the index alone
    journal.record_started(first, "4242", "node1", "USR2")
    assert states(tmp_path) == {"a": "running", "b": "queued"}
    assert [p.name for p in reads] == ["a"]
    reads.clear()
    (second.path / "metrics.jsonl").write_text('{"step": 7, "loss": 0.5}\n')
    assert {f.name: f.last_logged_step for f in find_runs(tmp_path)} == {"a": None, "b": 7}
    assert [p.name for p in reads] == ["b"]


def test_a_row_made_in_the_same_tick_as_a_write_is_checked_against_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coarse file clock may give a record written just after a row was made the same time:
    until its times are SETTLE_NS old, a row is checked against the journal's listing too."""
    run = made_run(tmp_path, "a")
    assert states(tmp_path) == {"a": "queued"}
    index = run_index.Index(tmp_path)
    row = index.rows[str(run.path)]
    assert row.settled is False  # just written: not settled yet
    key = row.key
    journal.record_started(run, "4242", "node1", "USR2")
    # The same times as before the write, as a coarse clock could leave them.
    os.utime(run.journal, ns=(key[0], key[0]))
    assert run_index.key_of(str(run.path)) == key
    assert states(tmp_path) == {"a": "running"}


def test_writers_in_many_processes_lose_no_row(tmp_path: Path, reads: list[Path]) -> None:
    """Jobs ending at once each write their own pending row; the listing merges them all."""
    runs = [made_run(tmp_path, f"r{i}") for i in range(6)]
    assert len(states(tmp_path)) == 6
    reads.clear()
    for run in runs:
        journal.record_started(run, "4242", "node1", "USR2")
        journal.record_ended(run, "4242", 1, "failed")
    context = multiprocessing.get_context("fork")
    with context.Pool(6) as pool:
        pool.map(_note, [str(run.path) for run in runs])
    pending = list((tmp_path / run_index.INDEX_DIR / run_index.PENDING_DIR).iterdir())
    assert len(pending) == 6
    assert set(states(tmp_path).values()) == {"failed"}
    assert reads == []  # every row came from a writer
    assert not list((tmp_path / run_index.INDEX_DIR / run_index.PENDING_DIR).iterdir())


def _note(path: str) -> None:
    run = RunDir(Path(path))
    run_index.note(run, run.load_config(), read_history(run))


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b'{"version": 1, "rows": [1, 2]}',
        b'{"version": 1, "rows": {"x": {"key": 1}}}',
        b"\x00\xff" * 100,
    ],
)
def test_a_damaged_index_is_made_again(tmp_path: Path, damage: bytes) -> None:
    made_run(tmp_path, "a")
    journal.record_started(made_run(tmp_path, "b"), "4242", "node1", "USR2")
    assert states(tmp_path) == {"a": "queued", "b": "running"}
    (tmp_path / run_index.INDEX_DIR / run_index.INDEX_FILE).write_bytes(damage)
    assert states(tmp_path) == {"a": "queued", "b": "running"}
    data = json.loads((tmp_path / run_index.INDEX_DIR / run_index.INDEX_FILE).read_text())
    assert len(data["rows"]) == 2


def test_a_row_of_another_shape_is_made_again(tmp_path: Path) -> None:
    run = made_run(tmp_path, "a")
    assert states(tmp_path) == {"a": "queued"}
    file = tmp_path / run_index.INDEX_DIR / run_index.INDEX_FILE
    data = json.loads(file.read_text())
    data["rows"][str(run.path)]["facts"]["state"] = {"state": "done"}
    data["rows"][str(run.path)]["settled"] = True
    file.write_text(json.dumps(data))
    assert states(tmp_path) == {"a": "queued"}


@pytest.mark.parametrize(
    "content", [b"", b'{"event": "started", "time": "2026-12-01T00:00:00+00:00", "job', b"\xff"]
)
def test_a_damaged_journal_entry_lists_with_a_clear_state(tmp_path: Path, content: bytes) -> None:
    """An empty entry, a truncated last line, garbage: the run is listed, the entry named."""
    run = made_run(tmp_path, "a")
    journal.record_started(run, "4242", "node1", "USR2")
    (run.journal / "99999999999999999999-1-ended.json").write_bytes(content)
    result = CliRunner().invoke(cli, ["status", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.exception is None
    assert "a  " in result.stdout and "running" in result.stdout
    assert "1 damaged journal entry left out, the first" in result.stderr
    assert states(tmp_path) == {"a": "running"}


def test_an_index_that_cannot_be_written_still_lists(tmp_path: Path) -> None:
    made_run(tmp_path, "a")
    (tmp_path / run_index.INDEX_DIR).write_text("a file where the index folder goes")
    assert states(tmp_path) == {"a": "queued"}
    assert states(tmp_path) == {"a": "queued"}


def test_an_index_folder_planted_as_a_link_is_neither_read_nor_written_through(
    tmp_path: Path, reads: list[Path]
) -> None:
    """A runs root where someone made ``.hpctf-index`` a link to a folder of yours: listing
    it writes nothing there and trusts no row found there; the runs are read themselves."""
    root, yours = tmp_path / "root", tmp_path / "yours"
    yours.mkdir(mode=0o700)
    made_run(root, "a")
    (yours / run_index.INDEX_FILE).write_text("your file")
    (root / run_index.INDEX_DIR).symlink_to(yours)
    for _ in range(2):
        assert states(root) == {"a": "queued"}
    assert (yours / run_index.INDEX_FILE).read_text() == "your file"
    assert sorted(p.name for p in yours.iterdir()) == [run_index.INDEX_FILE]
    assert [p.name for p in reads] == ["a", "a"]  # no index used: read each time


def test_an_index_folder_others_may_write_is_not_trusted(tmp_path: Path, reads: list[Path]) -> None:
    made_run(tmp_path, "a")
    assert states(tmp_path) == {"a": "queued"}  # makes the index
    folder = tmp_path / run_index.INDEX_DIR
    assert (folder.stat().st_mode & 0o777) == 0o700
    reads.clear()
    folder.chmod(0o777)  # a row planted there could say anything of a run
    assert states(tmp_path) == {"a": "queued"}
    assert [p.name for p in reads] == ["a"]


def test_an_ended_runs_row_is_checked_by_its_journal_alone(
    tmp_path: Path, reads: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settled row of a run that ended (done, failed, gave up) is checked by one stat, its
    journal's: nothing writes its metrics before a new journal entry, and a new entry (a
    resubmit) makes the row again. A running or queued run's row is checked by its metrics
    too."""
    done, running = made_run(tmp_path, "done"), made_run(tmp_path, "running")
    queued = made_run(tmp_path, "queued")
    for run in (done, running):
        journal.record_started(run, "4242", "node1", "USR2")
        (run.path / "metrics.jsonl").write_text('{"step": 100, "loss": 0.5}\n')
    done.done.write_text('{"step": 100}\n')
    journal.record_ended(done, "4242", 0, "done")
    expected = {"done": "done", "running": "running", "queued": "queued"}
    assert states(tmp_path) == expected
    assert states(tmp_path) == expected  # the rows settled
    stats: list[str] = []
    real_stat = os.stat

    def counted(path: str, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    reads.clear()
    monkeypatch.setattr(run_index.os, "stat", counted)
    steps = {f.name: f.last_logged_step for f in find_runs(tmp_path)}
    assert steps == {"done": 100, "running": 100, "queued": None}
    assert reads == []
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in stats if "/journal" in p
                  or "metrics" in p) == ["done/journal", "queued/journal",
                                         "queued/metrics.jsonl", "running/journal",
                                         "running/metrics.jsonl"]  # fmt: skip
    journal.record_submitted(done, "4300")  # a resubmit (--set train.steps=...): a new entry
    journal.record_started(queued, "4242", "node1", "USR2")
    assert states(tmp_path)["queued"] == "running"
    assert sorted(p.name for p in reads) == ["done", "queued"]  # read again
