"""``hpctf ui`` (hpctf/login/dashboard): its server's guards over real HTTP (the token, the
Host header, loopback only, no secret in any answer), and its pages in a real headless chromium
(tests/browser.py) against real run directories: hostile names and log lines as text, a
search's trials read from its Optuna study, a local run training live then its curves, a Slurm
run pending with Slurm's reason. Screenshots are kept under each test's tmp_path."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from hpctf.core.run.rundir import RunDir
from hpctf.core.scheduler import slurm
from hpctf.login.calls.table import answer
from hpctf.login.dashboard.server import Dashboard, cookie_name
from tests.browser import Browser
from tests.conftest import DIGITS, HPCTF, made_run, submitted
from tests.fake_slurm import FakeSlurm

SECRET = "sk-live-7f3a9c2e1b"
URI_PASSWORD = "hunter2-uri-pass"
# Each would run script if it reached the page as markup (the CSP aside): it marks the body.
HOSTILE = [
    "<img src=x onerror=document.body.dataset.pwned=1>",
    "<svg onload=document.body.dataset.pwned=2>",
    '"><script>document.body.dataset.pwned=3<',
]


@pytest.fixture
def dashboard(runs_root: Path) -> Iterator[Dashboard]:
    """The server on a free loopback port, its calls answered in this process, for the runs
    under ``runs_root``."""
    runs_root.mkdir(parents=True, exist_ok=True)
    server = Dashboard(answer, 0, {"root": str(runs_root)})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with Browser(tmp_path_factory.mktemp("chromium")) as opened:
        yield opened


def get(
    server: Dashboard, path: str, token: str | None = None, host: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` with the cookie holding ``token`` (none: no cookie) and a Host header."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{server.port}"}
    if token is not None:
        headers["Cookie"] = f"{cookie_name(server.port)}={token}"
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def test_the_token_is_required_and_only_loopback_hosts_are_served(dashboard: Dashboard) -> None:
    token = dashboard.token
    for path in ("/", "/index.html", "/app.js", "/api/runs"):
        assert get(dashboard, path)[0] == 401, path
        assert get(dashboard, path, token="x" * len(token))[0] == 401, path
    # The printed URL: the token traded for a cookie, and sent on without it.
    status, headers, _ = get(dashboard, f"/?token={token}")
    assert status == 303 and headers["location"] == "/", headers
    assert headers["set-cookie"].startswith(f"{cookie_name(dashboard.port)}={token};")
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    status, headers, body = get(dashboard, "/", token=token)
    assert status == 200 and b"app.js" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert get(dashboard, "/api/runs", token=token)[0] == 200
    assert get(dashboard, "/../pyproject.toml", token=token)[0] == 404
    # A DNS name rebound to 127.0.0.1 is refused, with the token or not.
    for host in (f"evil.example:{dashboard.port}", "127.0.0.1.nip.io", "127.0.0.1:1"):
        assert get(dashboard, f"/?token={token}", token=token, host=host)[0] == 403, host
    # Loopback only: the server's address, and no answer on this host's other address.
    assert dashboard.server_address[0] == "127.0.0.1"
    other = _other_address()
    if other is not None:
        with pytest.raises(OSError):
            socket.create_connection((other, dashboard.port), timeout=2).close()
    # Read-only: no other method.
    connection = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=10)
    cookie = f"{cookie_name(dashboard.port)}={token}"
    connection.request("POST", "/api/runs", headers={"Cookie": cookie})
    assert connection.getresponse().status == 501


def _other_address() -> str | None:
    """This host's address on its default route (no packet sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_no_secret_reaches_any_page(dashboard: Dashboard, runs_root: Path) -> None:
    run = made_run(
        runs_root,
        "with-secrets",
        [f"env.API_TOKEN={SECRET}", f"env.DB_URL=postgres://me:{URI_PASSWORD}@db:5432/x"],
    )
    run.logs.mkdir(exist_ok=True)
    run.rank_log(0).write_text(f"connecting to postgres://me:{URI_PASSWORD}@db:5432/x\n")
    token = dashboard.token
    bodies = [
        get(dashboard, path, token=token)[2]
        for path in (
            "/",
            "/app.js",
            "/api/runs?hours=1",
            f"/api/run?path={quote(str(run.path))}&hours=1",
            f"/api/run?path={quote(str(run.path))}&rank=1",
        )
    ]
    for body in bodies:
        assert SECRET.encode() not in body and URI_PASSWORD.encode() not in body
    page = json.loads(bodies[3])
    assert page["config"]["experiment"]["env"]["API_TOKEN"] == "***"
    assert "connecting to postgres://" in page["log"]
    assert page["document"]["run"] == "with-secrets"


def test_hostile_names_and_log_lines_are_shown_as_text(
    dashboard: Dashboard, runs_root: Path, browser: Browser, tmp_path: Path
) -> None:
    # A run's name is its directory's: planted (renamed) ones, as sbatch would take none.
    runs = [RunDir(made_run(runs_root, f"plain-{n}").path.rename(runs_root / name))
            for n, name in enumerate(HOSTILE)]  # fmt: skip
    runs[0].logs.mkdir(exist_ok=True)
    runs[0].rank_log(0).write_text("".join(f"{name}\n" for name in HOSTILE))
    browser.open(dashboard.url)
    browser.wait_for("document.querySelectorAll('#runs tr.run').length === 3")
    shown = browser.evaluate(
        "[...document.querySelectorAll('#runs td.name')].map(e => e.textContent)"
    )
    assert sorted(shown) == sorted(HOSTILE)
    browser.screenshot(tmp_path / "hostile-runs.png")
    browser.open(f"http://127.0.0.1:{dashboard.port}/#/run?path={quote(str(runs[0].path))}")
    browser.wait_for("document.body.dataset.loaded === 'run'")
    assert browser.text("#run-name") == HOSTILE[0]
    assert all(name in browser.text("#log") for name in HOSTILE)
    browser.screenshot(tmp_path / "hostile-run.png")
    # Not one element made of the data, not one script run.
    assert (
        browser.evaluate("document.querySelectorAll('main img, main svg, main script').length") == 0
    )
    assert browser.evaluate("document.body.dataset.pwned") is None


def test_a_searchs_trials_table_and_curves(
    fake_slurm: FakeSlurm, tmp_path: Path, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trials from the study (Optuna, through core/search): two done with their values, one
    failed, one asked and not started; the best marked; the objective and each trial's curve
    drawn."""
    pytest.importorskip("optuna")
    from hpctf.batch.search_agent import ArrayTask, next_run
    from tests.search_trials import end_run, make_search

    sweep = make_search(tmp_path, trials=4)
    monkeypatch.setenv("HPCTF_RUNS_ROOT", str(tmp_path / "runs"))
    task = ArrayTask(sweep, 0, "77_0", "77")
    for reason, loss in (("done", 0.5), ("failed", None), ("done", 0.25)):
        run = next_run(task, True, lambda _: None)  # type: ignore[arg-type]
        assert run is not None
        end_run(run, "77_0", reason, loss)
    assert next_run(task, True, lambda _: None) is not None  # type: ignore[arg-type]
    server = Dashboard(answer, 0, {"root": str(tmp_path / "runs")})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        browser.open(server.url)
        browser.wait_for("document.querySelectorAll('#sweeps tr.sweep').length === 1")
        browser.evaluate("document.querySelector('#sweeps tr.sweep a').click()")
        browser.wait_for("document.body.dataset.loaded === 'sweep'")
        rows = browser.evaluate(
            "[...document.querySelectorAll('#trials tr.trial')].map(r => "
            "[...r.cells].slice(0, 4).map(c => c.textContent).concat(r.className))"
        )
        charts = browser.evaluate(
            "['objective-chart', 'curves-chart'].map(id => document.getElementById(id).dataset)"
            ".map(d => [d.series, d.points])"
        )
        browser.screenshot(tmp_path / "search.png")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("0", "done", "0.5"), ("1", "failed", "-"), ("2", "done", "0.25"), ("3", "pending", "-"),
    ]  # fmt: skip
    assert all("learning_rate=" in r[1] and "hidden=" in r[1] for r in rows)
    assert [r[4] for r in rows].count("trial best") == 1 and rows[2][4] == "trial best"
    # The objective of the two done trials and the best so far; the two trials' eval curves.
    assert charts == [["2", "4"], ["2", "2"]]


@pytest.mark.tf
def test_a_local_run_training_live_then_its_curves(
    dashboard: Dashboard, runs_root: Path, browser: Browser, tmp_path: Path
) -> None:
    """The run page of a local run while it trains: its step advances on the page; once done,
    its training and evaluation curves are drawn."""
    proc = subprocess.Popen(
        [*HPCTF, "submit", str(DIGITS), "--site", "local",
         *("--set", "resources.nodes=1", "--set", "train.steps=30000"),
         *("--set", "train.log_every_steps=250", "--set", "train.eval_every_steps=7500"),
         *("--set", "checkpoint.every_steps=100000")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "HPCTF_RUNS_ROOT": str(runs_root)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (
            found := [p for p in runs_root.glob("digits-*") if (p / "config.json").is_file()]
        ):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout
            time.sleep(0.2)
        browser.open(f"{dashboard.url}")
        browser.open(f"http://127.0.0.1:{dashboard.port}/#/run?path={quote(str(found[0]))}")
        step = (
            "Number((document.querySelector('[data-fact=step]') || {})"
            ".textContent?.split('/')[0]) || 0"
        )
        first = browser.wait_for(step, timeout=120)
        browser.screenshot(tmp_path / "training.png")
        assert browser.wait_for(f"({step}) > {first} && ({step})", timeout=60) > first
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert submitted(out)[1] == found[0]
    browser.wait_for("document.querySelector('[data-fact=state]').textContent === 'done'", 30)
    assert browser.text("[data-fact=step]") == "30000/30000"
    assert int(browser.wait_for("document.querySelector('#train-chart').dataset.points")) >= 100
    assert int(browser.evaluate("document.querySelector('#eval-chart').dataset.series")) >= 1
    assert browser.evaluate("document.querySelectorAll('#train-chart canvas').length") == 1
    assert "rank 0" in browser.text("#log") or "training complete" in browser.text("#log")
    browser.screenshot(tmp_path / "done.png")


@pytest.mark.slurm
def test_a_slurm_run_pending_shows_slurms_reason(
    slurm_cluster: dict[str, str], tmp_path: Path, browser: Browser
) -> None:
    """Both nodes of the test cluster taken: the run's job pends, and the runs page says why
    in Slurm's words (squeue's %r) through the shared queue view."""
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--exclusive", f"--output={tmp_path}/b.out",
         "--wrap", "sleep 300"],
        env=env, capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    job = None
    try:
        deadline = time.monotonic() + 60  # both nodes taken before the run is submitted
        while (slurm.job_info(blocker) or {}).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, slurm.job_info(blocker)
            time.sleep(0.5)
        proc = subprocess.run(
            [*HPCTF, "submit", str(DIGITS), "--site", "local-slurm", "--set", "resources.nodes=1"],
            env=env, capture_output=True, text=True, check=True, cwd=tmp_path,
        )  # fmt: skip
        job, run_dir = submitted(proc.stdout)
        assert job is not None
        # Until the scheduler has looked at it, a job pends for no reason yet ("None").
        deadline = time.monotonic() + 60
        while (slurm.job_info(job) or {}).get("Reason") not in ("Resources", "Priority"):
            assert time.monotonic() < deadline, slurm.job_info(job)
            time.sleep(0.5)
        server = Dashboard(answer, 0, {"root": str(tmp_path / "runs")})
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
        thread.start()
        try:
            browser.open(server.url)
            try:
                reason = browser.wait_for(
                    "(document.querySelector('#runs tr.run td.pending') || {}).textContent", 90
                )
            finally:
                browser.screenshot(tmp_path / "pending.png")
            word = browser.text("#runs tr.run td.slurm")
            browser.screenshot(tmp_path / "pending.png")
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
    finally:
        subprocess.run(["scancel", blocker, *([job] if job else [])], env=env, check=False)
    assert word.startswith("PENDING (") and reason.split(";")[0] in ("Resources", "Priority")
    assert run_dir.name in browser.text("#runs tr.run td.name")


def test_the_ui_path_imports_no_tensorflow(runs_root: Path) -> None:
    """``hpctf ui``'s modules and a refresh of each page import neither TensorFlow nor Keras."""
    run = made_run(runs_root, "plain")
    code = (
        "import sys\n"
        "from hpctf.cli import cli\n"
        "from hpctf.login.dashboard import server, ui_command\n"
        "from hpctf.login.calls.models import RunsPageRequest, RunPageRequest\n"
        "from hpctf.login.calls.table import answer\n"
        f"answer(RunsPageRequest(root={str(runs_root)!r}, hours=True))\n"
        f"answer(RunPageRequest(run_dir={str(run.path)!r}, hours=True))\n"
        "bad = [m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('NO_TF')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False,
        env={**os.environ, "HPCTF_RUNS_ROOT": str(runs_root)},
    )  # fmt: skip
    assert "NO_TF" in proc.stdout, proc.stderr


def test_the_ui_command_prints_its_url_and_serves(runs_root: Path, tmp_path: Path) -> None:
    """``hpctf ui --root DIR``: the URL with its token on stdout, the page behind it."""
    made_run(runs_root, "listed")
    proc = subprocess.Popen(
        [*HPCTF, "ui", "--root", str(runs_root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "open http://127.0.0.1:" in line, line
        url = line.split("open ", 1)[1].strip()
        port = int(url.split(":")[2].split("/")[0])
        token = url.split("token=", 1)[1]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/api/runs", headers={"Cookie": f"{cookie_name(port)}={token}"})
        page = json.loads(connection.getresponse().read())
        assert [d["run"] for d in page["runs"]] == ["listed"]
        assert page["root"] == str(runs_root.resolve())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_run_page_of_no_run_is_one_line(dashboard: Dashboard, tmp_path: Path) -> None:
    status, _, body = get(dashboard, f"/api/run?path={quote(str(tmp_path))}", dashboard.token)
    assert status == 400 and "not a run directory" in json.loads(body)["error"]
    status, _, body = get(dashboard, "/api/run?path=x&rank=-1", dashboard.token)
    assert status == 400


def test_marks_and_thinned_curves() -> None:
    """A run's curves as the page gets them: each start after the first marked where it
    resumed, with how the one before it ended, a prune where it stopped; training rows thinned
    to about the bound asked, every evaluation kept."""
    from hpctf.login.calls.pages import marks_of, thinned

    def start(step: int, reason: str | None, end: int | None) -> dict[str, object]:
        return {"from_step": step, "reason": reason, "end_step": end}

    marks = marks_of(
        [start(0, "preempted", 100), start(100, None, None), start(100, "pruned", 150)]
    )
    assert [(m.step, m.kind) for m in marks] == [
        (100, "restart"),
        (100, "restart"),
        (150, "pruned"),
    ]
    assert (
        marks[0].text.startswith("restart 2 (after ")
        and marks[1].text == "restart 3 (after killed)"
    )
    assert marks_of([start(0, "done", 10)]) == []
    rows = [{"step": n, "loss": 1.0 / n} for n in range(1, 10_001)]
    rows += [{"step": n, "eval": {"loss": 0.5}} for n in range(1000, 10_001, 1000)]
    kept = thinned(sorted(rows, key=lambda r: int(r["step"])), 500)
    plain = [r for r in kept if "eval" not in r]
    assert 500 <= len(plain) <= 501 and plain[-1]["step"] == 10_000
    assert sum(1 for r in kept if "eval" in r) == 10
    assert thinned(rows[:100], 500) == rows[:100]


def test_a_log_tail_names_the_starts_it_shows(runs_root: Path) -> None:
    """The run page's log is the tail of ``hpctf logs`` (LogReader with a smaller bound): the
    start whose header is in the tail keeps its number, counted from the log's beginning."""
    from hpctf.core.run import journal
    from hpctf.core.run.history import read_history
    from hpctf.login.watching.logs import LogReader

    run = made_run(runs_root, "two-starts")
    run.logs.mkdir(exist_ok=True)
    lines = []
    for number, job in enumerate(("4242", "4243"), 1):
        journal.record_started(run, job, "node1", "USR2")
        lines.append(
            f"12:00:0{number} rank 0: host node1 pid 1 (SLURMD_NODENAME node1) SLURM_PROCID 0\n"
        )
        lines += [f"start {number} step {n}\n" for n in range(2000 if number == 1 else 200)]
        if number == 1:
            journal.record_ended(run, job, 75, "preempted")
    run.rank_log(0).write_text("".join(lines))
    tail = "".join(LogReader(run, 0, None, shown_bytes=8 << 10).read(read_history(run), True))
    said = tail.splitlines()
    assert said[0].endswith("bytes: its last 8 KiB follow")
    assert said[-1] == "start 2 step 199" and len(tail) < 9 << 10
    (separator,) = [line for line in said if line.startswith("=====")]
    assert separator.startswith("===== start 2: job 4243, rank 0")


def test_a_pending_jobs_expected_start_is_shown(
    fake_slurm: FakeSlurm, runs_root: Path, browser: Browser
) -> None:
    """Where Slurm gives a pending job's expected start (squeue's %S; the test cluster's
    scheduler gives none), the runs page and the run's page say it beside the reason."""
    from tests.fake_slurm import new_run, squeue_line

    path = new_run(runs_root, fake_slurm)
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "Priority"))
    server = Dashboard(answer, 0, {"root": str(runs_root)})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        browser.open(server.url)
        shown = browser.wait_for("(document.querySelector('#runs td.pending') || {}).textContent")
        browser.open(f"http://127.0.0.1:{server.port}/#/run?path={quote(str(path))}")
        browser.wait_for("document.body.dataset.loaded === 'run'")
        fact = browser.text("[data-fact=pending]")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert shown == fact == "Priority; may start 2026-12-01T04:29:39"


def test_a_port_taken_is_one_line_exit_3(dashboard: Dashboard, tmp_path: Path) -> None:
    proc = subprocess.run(
        [*HPCTF, "ui", "--root", str(tmp_path), "--port", str(dashboard.port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{dashboard.port}: ")
    assert "choose another --port" in proc.stderr and "Traceback" not in proc.stderr
