"""Watchers share one view of their user's queue (issue #45's controller budget): a thousand
`hpctf logs -f` or Run.wait loops of one user ask slurmctld once per WATCH_SHARE_S (one
`squeue --me`), not once each; a job the view does not hold, and another user's run, are
asked of squeue as before. Fake Slurm commands at the subprocess boundary; the RPCs
themselves are counted on the real cluster by benchmarks/bench_controller.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import hpctf
from hpctf.core.scheduler import slurm_queries
from hpctf.login.reading import slurm_view
from hpctf.python_api.run_api import statuses
from tests.fake_slurm import FakeSlurm, new_run, squeue_line


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hpctf" / "queue"


def test_watchers_of_one_user_share_one_squeue_me(
    runs_root: Path, fake_slurm: FakeSlurm, cache: Path
) -> None:
    run = new_run(runs_root, fake_slurm)
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))
    fake_slurm.forget()
    for _ in range(5):  # five looks by watchers within WATCH_SHARE_S
        (document,) = statuses([hpctf.run(run)])
        assert document["slurm"]["state"] == "RUNNING"
    with pytest.raises(TimeoutError):  # Run.wait looks the same way
        hpctf.run(run).wait(timeout=0.05, poll=0.01)
    calls = fake_slurm.calls("squeue")
    assert len(calls) == 1 and "--me" in calls[0], calls
    assert (cache / slurm_queries.shared_queue_file()).stat().st_mode & 0o077 == 0


def test_an_old_view_is_asked_again_and_a_job_it_lacks_is_asked_alone(
    runs_root: Path, fake_slurm: FakeSlurm, cache: Path
) -> None:
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING"))
    view = slurm_view.slurm_records(["4242"], shared_s=30.0)
    assert view.records["4242"].state == "PENDING"
    snapshot = cache / slurm_queries.shared_queue_file()
    data = json.loads(snapshot.read_text())
    snapshot.write_text(json.dumps({**data, "time": time.time() - 31}))
    fake_slurm.forget()
    slurm_view.slurm_records(["4242"], shared_s=30.0)
    assert [c for c in fake_slurm.calls("squeue") if "--me" in c], "an old view was trusted"
    fake_slurm.forget()
    slurm_view.slurm_records(["4242", "5555"], shared_s=30.0)  # 5555: not in the view
    (alone,) = fake_slurm.calls("squeue")
    assert "--jobs=5555" in alone and "--me" not in alone


def test_another_users_run_is_not_watched_through_the_callers_queue(
    runs_root: Path, fake_slurm: FakeSlurm, cache: Path
) -> None:
    run = new_run(runs_root, fake_slurm)
    assert slurm_view.watch_share([run]) == slurm_view.WATCH_SHARE_S
    os.chown(run, 65534, 65534)  # nobody's: squeue --me would not list its jobs
    try:
        assert slurm_view.watch_share([run]) is None
    finally:
        os.chown(run, os.getuid(), os.getgid())


def test_a_job_the_view_says_ended_is_asked_again_before_a_watcher_acts_on_it(
    runs_root: Path, fake_slurm: FakeSlurm, cache: Path
) -> None:
    """A watcher stops on an ended job: that word must be Slurm's now, not the view's (Slurm
    may have requeued the job since: a node failure)."""
    fake_slurm.answer("squeue", squeue_line("4242", "FAILED"))
    slurm_view.slurm_records(["4242"], shared_s=30.0)
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "BeginTime", ""))
    fake_slurm.forget()
    view = slurm_view.slurm_records(["4242"], shared_s=30.0)
    assert view.records["4242"].state == "PENDING"
    assert any("--jobs=4242" in call for call in fake_slurm.calls("squeue"))


def test_two_clusters_of_one_user_keep_two_views(
    runs_root: Path, fake_slurm: FakeSlurm, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login node that reaches two clusters (another SLURM_CONF): their job ids overlap,
    so each keeps a view of its own."""
    fake_slurm.answer("squeue", squeue_line("4242", "RUNNING"))
    slurm_view.slurm_records(["4242"], shared_s=30.0)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-other/slurm.conf")
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING"))
    fake_slurm.forget()
    view = slurm_view.slurm_records(["4242"], shared_s=30.0)
    assert view.records["4242"].state == "PENDING"
    assert [c for c in fake_slurm.calls("squeue") if "--me" in c]
    assert len(list(cache.glob("squeue-me-*.json"))) == 2
