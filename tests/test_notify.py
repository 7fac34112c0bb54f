"""notify: a message when a run needs its owner: the settings (validated like every key, the
webhook a secret), Slurm's own mail in the script, and the webhook sent once per event, never
in the way (hpctf.core.run.notifications) -- against a real receiver on loopback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hpctf.core.run import journal, secret_store
from hpctf.core.run.notifications import event_of, notify_end, wanted
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.notify import Notify, mail_types
from tests.webhook_receiver import URL_SECRET, Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    yield served
    served.close()


def config_with(notify: Notify | None, site_notify: Notify | None = None) -> ResolvedConfig:
    return cast(
        ResolvedConfig,
        SimpleNamespace(
            experiment=SimpleNamespace(notify=notify), site=SimpleNamespace(notify=site_notify)
        ),
    )


def started_and_ended(run: RunDir, job: str, exit_code: int, reason: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    journal.record_ended(run, job, exit_code, reason)


def test_one_message_per_event_across_a_requeue_and_a_retried_job_end(
    tmp_path: Path, receiver: Receiver
) -> None:
    run = RunDir(tmp_path)
    config = config_with(Notify(webhook=receiver.url, on=["done", "gave_up"]))
    started_and_ended(run, "7", 75, "preempted")
    journal.record_requeued(run, "7", "preempted: requeue 1 of 3")
    assert notify_end(run, config, "7") is None  # requeued: nothing to tell
    started_and_ended(run, "7", 0, "done")
    assert notify_end(run, config, "7") == "done"
    assert notify_end(run, config, "7") is None  # job-end again: already told
    (sent,) = receiver.got
    assert sent["event"] == "done" and sent["run"] == tmp_path.name
    assert sent["text"] == f"hpctf: run {tmp_path.name} done"
    (notice,) = [e for e in run.events() if e["event"] == journal.NOTIFIED]
    assert (notice["notice"], notice["start"], notice["via"]) == ("done", 2, "webhook")
    assert URL_SECRET not in json.dumps(run.events())  # the journal never holds the URL


def test_only_the_events_asked_for_and_gave_up_covers_a_spent_budget(
    tmp_path: Path, receiver: Receiver
) -> None:
    run = RunDir(tmp_path)
    started_and_ended(run, "8", 1, "failed")
    only_done = config_with(Notify(webhook=receiver.url, on=["done"]))
    assert notify_end(run, only_done, "8") is None and not receiver.got
    journal.record_gave_up(run, "8", "failed (exit 1): 3 failure requeues used of 3")
    site_wide = config_with(None, Notify(webhook=receiver.url, on=["gave_up"]))
    assert notify_end(run, site_wide, "8") == "budget_exhausted"
    assert [m["event"] for m in receiver.got] == ["budget_exhausted"]
    assert event_of("gave_up", "a full disk; fix it and run hpctf resubmit") == "gave_up"
    assert event_of("failed", "exit 1") == "failed" and event_of("requeued", "") is None
    assert wanted("budget_exhausted", ["gave_up"]) and not wanted("gave_up", ["budget_exhausted"])


def test_a_receiver_that_is_down_or_hangs_costs_one_warning_line_and_no_wait(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path)
    started_and_ended(run, "9", 0, "done")
    with socket.socket() as closed:  # a port nobody listens on: connection refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    err = io.StringIO()
    began = time.monotonic()
    down = config_with(Notify(webhook=f"http://127.0.0.1:{port}/{URL_SECRET}"))
    assert notify_end(run, down, "9", err=err) is None
    assert time.monotonic() - began < 1.0
    (line,) = err.getvalue().splitlines()
    assert line.startswith("hpctf: warning: notify: done not sent to 127.0.0.1: ")
    assert URL_SECRET not in line
    # Accepts the connection and never answers: bounded by the timeout (5 s in a job).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        hung = config_with(Notify(webhook=f"http://127.0.0.1:{silent.getsockname()[1]}/x"))
        began = time.monotonic()
        assert notify_end(run, hung, "9", err=err, timeout=0.5) is None
        assert time.monotonic() - began < 2.0
    assert len(err.getvalue().splitlines()) == 2
    assert not [e for e in run.events() if e["event"] == journal.NOTIFIED]  # tried again later


def test_email_is_slurms_own_mail_for_the_events_asked() -> None:
    assert mail_types(Notify(email="alice@example.com", on=["done", "failed"])) == ["END", "FAIL"]
    assert mail_types(Notify(email="alice", on=["budget_exhausted"])) == ["FAIL"]
    assert mail_types(Notify(webhook="https://hooks.example.com/x")) == []


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"webhook": "ftp://hooks.example.com/x"}, "https:// (or http://) URL"),
        ({"webhook": "https:///no-host"}, "with a host"),
        ({"on": "done,exploded"}, "Input should be 'done'"),
        ({"on": []}, "at least 1 item"),
        ({"email": "not an address!"}, "a user name or mail address"),
    ],
)
def test_bad_notify_settings_are_refused(given: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        Notify.model_validate(given)


def test_the_webhook_is_a_secret_config_json_holds_it_redacted(tmp_path: Path) -> None:
    from hpctf.login.resolving.loader import load_config
    from tests.conftest import DIGITS

    url = f"https://hooks.example.com/services/{URL_SECRET}"
    sets = [f"notify.webhook={url}", "notify.on=done"]
    config = load_config(DIGITS, "local", sets, dict(os.environ)).config
    secret_store.write_frozen(tmp_path, config)
    frozen = (tmp_path / "config.json").read_text()
    assert URL_SECRET not in frozen and '"webhook": "***"' in frozen
    secrets = (tmp_path / "secrets.env").read_text()
    assert f"\nHPCTF_NOTIFY_WEBHOOK={url}\n" in secrets  # not exported to the job
    assert "export HPCTF_NOTIFY_WEBHOOK" not in secrets
    back = secret_store.restore(
        ResolvedConfig.model_validate_json(frozen), secret_store.read(tmp_path)
    )
    assert back.experiment.notify is not None and back.experiment.notify.webhook == url


def test_job_end_requeues_without_a_message_then_tells_done_once_and_a_down_receiver_waits_not(
    runs_root: Path, fake_sbatch: Path, receiver: Receiver
) -> None:
    """Through ``hpctf job-end`` (fake scontrol): the requeue goes out with no message; the
    end that finishes the run sends ``done`` once, a second job-end nothing; the same with
    the receiver down: exit 0 at once, one warning line."""
    from click.testing import CliRunner

    from hpctf.cli import cli
    from tests.conftest import DIGITS
    from tests.fake_slurm import fake_command

    fake_command(fake_sbatch.parent / "fakebin", "scontrol", ":")
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]"}
    for url in (receiver.url, "http://127.0.0.1:9/down"):  # port 9 (discard): nobody listens
        sets = ["--set", f"notify.webhook={url}", "--set", "notify.on=done,failed"]
        submitted = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm", *sets])
        assert submitted.exit_code == 0, submitted.output
        run_dir = max(runs_root.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        assert url not in (run_dir / "config.json").read_text()
        cli_runner = CliRunner()
        assert cli_runner.invoke(cli, ["job-start", str(run_dir)], env=env).exit_code == 0
        requeue = cli_runner.invoke(cli, ["job-end", str(run_dir), "--exit-code", "75"], env=env)
        assert requeue.exit_code == 0 and "requeued" in requeue.output, requeue.output
        assert len(receiver.got) == (0 if url == receiver.url else 1)  # the requeue: none
        assert cli_runner.invoke(cli, ["job-start", str(run_dir)], env=env).exit_code == 0
        (run_dir / "DONE").write_text('{"step": 300}')
        began = time.monotonic()
        for _ in range(2):  # a retried job-end
            done = cli_runner.invoke(cli, ["job-end", str(run_dir), "--exit-code", "0"], env=env)
            assert done.exit_code == 0, done.output
        took = time.monotonic() - began
        if url == receiver.url:
            assert [m["event"] for m in receiver.got] == ["done"]
            assert "warning" not in done.output
        else:
            assert took < 5.0, took
            warnings = [line for line in done.stderr.splitlines() if "notify" in line]
            assert warnings == [
                "hpctf: warning: notify: done not sent to 127.0.0.1: [Errno 111] Connection refused"
            ], done.stderr


def _serving(answer: Callable[[socket.socket], None]) -> tuple[str, threading.Thread]:
    """A loopback receiver that reads one request and answers it with ``answer``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        with server, server.accept()[0] as connection:
            connection.recv(65536)
            with contextlib.suppress(OSError):
                answer(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/{URL_SECRET}", thread


def test_a_dribbling_receiver_is_cut_at_the_deadline_in_all(tmp_path: Path) -> None:
    """One byte every 0.3 s never trips a per-read timeout of 1 s: the deadline is the whole
    send's (it held job-end, and the job's node, for 15 minutes)."""
    run = RunDir(tmp_path)
    started_and_ended(run, "9", 0, "done")

    def dribble(connection: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
            connection.sendall(bytes([byte]))
            time.sleep(0.3)

    url, _ = _serving(dribble)
    err = io.StringIO()
    began = time.monotonic()
    assert notify_end(run, config_with(Notify(webhook=url)), "9", err=err, timeout=1.0) is None
    assert time.monotonic() - began < 2.0
    (line,) = err.getvalue().splitlines()
    assert "done not sent to 127.0.0.1: TimeoutError" in line and URL_SECRET not in line
    assert not [e for e in run.events() if e["event"] == journal.NOTIFIED]


def test_a_redirect_is_not_a_delivery(tmp_path: Path) -> None:
    """A 302 was followed as a GET without the message, answered 200 there, and counted as
    sent."""
    run = RunDir(tmp_path)
    started_and_ended(run, "9", 0, "done")
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    elsewhere, _ = _serving(lambda c: c.sendall(ok))
    moved = f"HTTP/1.1 302 Found\r\nLocation: {elsewhere}\r\nContent-Length: 0\r\n\r\n"
    url, thread = _serving(lambda c: c.sendall(moved.encode()))
    err = io.StringIO()
    assert notify_end(run, config_with(Notify(webhook=url)), "9", err=err) is None
    thread.join(5)
    assert "redirected (302)" in err.getvalue()
    assert not [e for e in run.events() if e["event"] == journal.NOTIFIED]
