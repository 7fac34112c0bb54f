"""A lazy listing (`hpctf status` without RUN over a runs root its index has not seen): the
runs whose journals changed last are read at once, the others counted and read into the index
by the background indexer (hpctf.login.reading.background_index); no run is left out silently
or shown with a state that is not its journal's, also when runs change or appear after the
index was made (real writers, no Slurm, no TensorFlow)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.run import journal, run_index
from hpctf.core.run.listing import RunFacts, read_facts
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import write_atomic
from hpctf.login.reading import background_index
from hpctf.login.reading.runs import find_runs, scan_runs, unread_note
from hpctf.login.watching import status as status_command
from tests.conftest import made_run


def _done(run: RunDir) -> None:
    journal.record_started(run, "4242", "node1", "USR2")
    write_atomic(run.done, json.dumps({"step": 100}) + "\n")
    journal.record_ended(run, "4242", 0, "done")


def _failed(run: RunDir) -> None:
    journal.record_started(run, "4242", "node1", "USR2")
    journal.record_ended(run, "4242", 1, "failed")
    journal.record_gave_up(run, "4242", "failed without progress (checkpoint step 0 -> 0)")


def _running(run: RunDir) -> None:
    journal.record_started(run, "4242", "node1", "USR2")


WRITERS = {"done": _done, "gave_up": _failed, "running": _running, "queued": lambda run: None}


def runs_root(root: Path, count: int) -> dict[str, str]:
    """``count`` runs under ``root``, run ``r0`` changed longest ago (its journal's time a minute
    before the next one's); their states by name."""
    states = {}
    kinds = list(WRITERS)
    for number in range(count):
        kind = kinds[number % len(kinds)]
        run = made_run(root, f"r{number}")
        WRITERS[kind](run)
        stamp = time.time() - 60 * (count - number)
        os.utime(run.journal, (stamp, stamp))
        states[f"r{number}"] = kind
    return states


def shown(runs: list[RunFacts]) -> dict[str, str]:
    return {facts.name: str(facts.state.state) for facts in runs}


def table(stdout: str) -> dict[str, str]:
    """A status table's runs and states (the lines after it: a run's why, a legend, left out)."""
    rows = [line.split() for line in stdout.splitlines()[1:]]
    return {row[0]: row[3] for row in rows if len(row) > 3 and not row[0].endswith(":")}


def wait_for_indexer(root: Path) -> None:
    deadline = time.monotonic() + 120
    while background_index.running(root.resolve()):
        assert time.monotonic() < deadline, "the background indexer did not end"
        time.sleep(0.1)


def test_a_root_never_indexed_lists_the_newest_at_once_and_every_run_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_index, "SETTLE_NS", 0)
    states = runs_root(tmp_path, 7)
    scan = scan_runs(tmp_path, read_at_most=3)
    assert shown(scan.runs) == {n: states[n] for n in ("r4", "r5", "r6")}  # changed last
    assert scan.unread == 4
    assert scan.unread_since == os.stat(tmp_path / "r3" / "journal").st_mtime_ns / 1e9
    assert scan.indexing
    wait_for_indexer(tmp_path)
    whole = scan_runs(tmp_path, read_at_most=0)  # reads nothing: every run from its row
    assert (shown(whole.runs), whole.unread) == (states, 0)


def test_runs_changed_or_added_after_the_index_are_read_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_index, "SETTLE_NS", 0)
    states = runs_root(tmp_path, 6)
    assert shown(find_runs(tmp_path)) == states  # the whole index, made in this process
    queued = RunDir(tmp_path / "r3")  # an old journal, queued: now running
    journal.record_started(queued, "4242", "node1", "USR2")
    _done(made_run(tmp_path, "new"))
    scan = scan_runs(tmp_path, read_at_most=2)
    assert shown(scan.runs) == {**states, "r3": "running", "new": "done"}
    assert scan.unread == 0
    # More changed than a lazy listing reads: those it leaves are counted, never shown stale.
    for name in ("r0", "r1", "r2"):
        journal.record_cancelled(RunDir(tmp_path / name), ["4242"])
    scan = scan_runs(tmp_path, read_at_most=1)
    assert scan.unread == 2
    assert len(scan.runs) == 7 - 2
    for name, state in shown(scan.runs).items():
        assert state == str(read_facts(tmp_path / name).state.state), name
    wait_for_indexer(tmp_path)


def test_status_says_what_it_left_unread_and_all_reads_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_command, "READ_AT_MOST", 2)
    states = runs_root(tmp_path, 5)
    first = CliRunner().invoke(cli, ["status", "--root", str(tmp_path)])
    assert first.exit_code == 0, first.output
    assert "and 3 more runs under" in first.stderr
    assert "hpctf status --all reads them now" in first.stderr
    assert table(first.stdout) == {"r3": states["r3"], "r4": states["r4"]}
    every = CliRunner().invoke(cli, ["status", "--root", str(tmp_path), "--all", "--json"])
    assert every.exit_code == 0, every.output
    assert {d["run"]: d["state"] for d in json.loads(every.stdout)["runs"]} == states
    assert "more run" not in every.stderr
    wait_for_indexer(tmp_path)
    again = CliRunner().invoke(cli, ["status", "--root", str(tmp_path)])
    assert "more run" not in again.stderr
    assert table(again.stdout) == states


def test_where_no_index_may_be_kept_a_lazy_listing_says_so_and_starts_nothing(
    tmp_path: Path,
) -> None:
    states = runs_root(tmp_path, 3)
    (tmp_path / run_index.INDEX_DIR).mkdir(mode=0o777)
    os.chmod(tmp_path / run_index.INDEX_DIR, 0o777)  # writable by others: not trusted
    scan = scan_runs(tmp_path, read_at_most=1)
    assert (shown(scan.runs), scan.unread, scan.indexing) == ({"r2": states["r2"]}, 2, False)
    assert "no background indexer could start" in unread_note(scan)
    assert not background_index.lock_of(tmp_path.resolve()).exists()
    assert shown(scan_runs(tmp_path).runs) == states  # read in full, without an index


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    made_run(tmp_path, "a")
    find_runs(tmp_path)  # the index folder
    lock = background_index.lock_of(tmp_path.resolve())
    lock.write_text("999999999")  # no such process
    assert not background_index.running(tmp_path.resolve())
    assert not lock.exists()
    lock.write_text(str(os.getpid()))
    assert background_index.running(tmp_path.resolve())
    old = time.time() - background_index.STALE_S - 1
    os.utime(lock, (old, old))
    assert not background_index.running(tmp_path.resolve())


def test_the_index_row_is_the_facts_as_asdict_makes_them(tmp_path: Path) -> None:
    run = made_run(tmp_path, "a")
    _failed(run)
    facts = read_facts(run.path)
    assert run_index.plain(facts) == asdict(facts)
    assert json.dumps(run_index.plain(facts)) == json.dumps(facts.to_json())
