"""``hpctf ui --site NAME`` from a laptop, a site whose ``login:`` is a real sshd
(tests/sshd.py): the page runs here, every refresh is ONE ``hpctf _call`` on the login host
through the one multiplexed SSH connection (counted there by a wrapper around its hpctf), and
the browser shows the runs that live there."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from hpctf.login.dashboard.server import cookie_name
from tests import sshd as harness
from tests.browser import Browser
from tests.conftest import HPCTF, made_run


@pytest.fixture(scope="module")
def laptop(checkout_for_others: Path) -> Iterator[tuple[harness.SetUp, Path]]:
    """The sshd in front of this machine, a site ``counted`` behind it whose hpctf writes one
    line per command it runs to the file returned, and one run in that site's runs root."""
    why = harness.usable()
    if why:
        pytest.skip(why)
    setup = harness.set_up(None, checkout_for_others)
    try:
        calls = setup.base / "calls.log"
        calls.write_text("")
        calls.chmod(0o666)
        cluster = yaml.safe_load((setup.base / "sites" / "cluster.yaml").read_text())
        counted = setup.base / "bin" / "hpctf-counted"
        counted.write_text(
            f'#!/bin/sh\necho "$1" >> {calls}\nexec {cluster["login"]["hpctf"]} "$@"\n'
        )
        counted.chmod(0o755)
        cluster.update(name="counted", login={**cluster["login"], "hpctf": str(counted)})
        (setup.base / "sites" / "counted.yaml").write_text(yaml.safe_dump(cluster))
        run = made_run(setup.runs, "on-the-cluster")
        user = harness.ensure_user()
        for path in [run.path, *run.path.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
        yield setup, calls
    finally:
        setup.stop()


def test_each_refresh_is_one_round_trip_through_the_one_connection(
    laptop: tuple[harness.SetUp, Path], tmp_path: Path
) -> None:
    setup, calls = laptop
    before = setup.login.accepted()
    server = subprocess.Popen(
        [*HPCTF, "ui", "--site", "counted"], env=setup.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "read over SSH; open http://127.0.0.1:" in line, (line, server.stderr)
        url = line.split("open ", 1)[1].strip()
        port, token = int(url.split(":")[2].split("/")[0]), url.split("token=", 1)[1]
        run_dir = str(setup.runs / "on-the-cluster")
        pages = ["/api/runs?hours=1", "/api/runs", f"/api/run?path={quote(run_dir)}"]
        answers = []
        for page in pages:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("GET", page, headers={"Cookie": f"{cookie_name(port)}={token}"})
            response = connection.getresponse()
            answers.append((response.status, json.loads(response.read())))
        assert [status for status, _ in answers] == [200] * len(pages), answers[-1]
        # hpctf's version asked once, at connection; then one call per page, nothing else.
        assert calls.read_text().split() == ["--version", *["_call"] * len(pages)]
        assert [d["run"] for d in answers[0][1]["runs"]] == ["on-the-cluster"]
        assert answers[0][1]["root"] == str(setup.runs)
        assert answers[-1][1]["document"]["path"] == run_dir
        # The page in a browser: its first look and each refresh after it, one call each.
        with Browser(tmp_path) as browser:
            browser.open(url)
            browser.wait_for("document.querySelectorAll('#runs tr.run').length === 1", 60)
            refreshes = browser.wait_for("Number(document.body.dataset.refreshes) >= 2 && "
                                         "Number(document.body.dataset.refreshes)", 60)  # fmt: skip
            assert browser.text("#runs td.name") == "on-the-cluster"
            browser.screenshot(tmp_path / "remote-runs.png")
            made = len(calls.read_text().split()) - 1 - len(pages)
        assert made in (refreshes, refreshes + 1)  # one more may be on its way
        # One login for all of it: the multiplexed connection.
        assert setup.login.accepted() - before == 1, setup.login.log.read_text()[-2000:]
    finally:
        server.terminate()
        server.wait(timeout=10)
