"""A real headless browser for the dashboard's tests: Debian's ``chromium``, driven through the
Chrome DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages ending in NUL
on file descriptors 3 and 4), so no driver, no websocket library and no port.

    with Browser(tmp_path) as browser:
        browser.open(url)
        browser.wait_for("document.querySelectorAll('tr.run').length > 0")
        browser.evaluate("document.title")
        browser.screenshot(tmp_path / "page.png")
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; a skip where none is installed (tests/system-packages.sh installs
    Debian's ``chromium``), a failure under HPCTF_REQUIRE_SLURM=1 (the full test command)."""
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("HPCTF_REQUIRE_SLURM") == "1":
        pytest.fail("chromium is not installed (tests/system-packages.sh)")
    pytest.skip("chromium is not installed (tests/system-packages.sh)")


class BrowserError(AssertionError):
    """The browser said no, or did not answer in time."""


class Browser:
    """One headless chromium with one page, for one test (or one module)."""

    def __init__(self, where: Path, width: int = 1280, height: int = 900) -> None:
        self.where = where
        self.size = (width, height)
        self.next_id = 0
        self.buffer = b""
        self.session = ""

    def __enter__(self) -> Browser:
        profile = self.where / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        # Chromium reads commands on its fd 3 and writes answers on its fd 4.
        command_read, command_write = os.pipe()
        answer_read, answer_write = os.pipe()
        self.log = (self.where / "chromium.log").open("wb")
        self.process = subprocess.Popen(
            [
                chromium(),
                "--headless=new",
                "--no-sandbox",  # as root in a container: chromium's sandbox needs user namespaces
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(3, 4),
            preexec_fn=_pipes_at(command_read, answer_write),
        )
        os.close(command_read)
        os.close(answer_write)
        self.to_browser, self.from_browser = command_write, answer_read
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t["targetId"] for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)
        self.log.close()

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """One DevTools command (on the page once attached); its result."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._message(deadline)
            if answer.get("id") != self.next_id:
                continue  # an event, or another command's late answer
            if "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            return dict(answer.get("result") or {})

    def _message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited: {self.process.poll()}")
            self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\0")
        return dict(json.loads(raw))

    def open(self, url: str) -> None:
        """Go to ``url`` and wait until its document has loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        """Wait until ``expression`` is truthy in the page; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"not true after {timeout} s: {expression}")
            time.sleep(0.1)

    def text(self, selector: str) -> str:
        """The text of the first element matching ``selector`` ("" when none)."""
        found = self.evaluate(
            f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''"
        )
        return str(found)

    def screenshot(self, path: Path) -> Path:
        """The page as a PNG at ``path`` (a test's artefact)."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def _pipes_at(command_read: int, answer_write: int) -> Any:
    """In the child before exec: the command pipe's read end as fd 3, the answers' write end
    as fd 4 (``--remote-debugging-pipe``'s contract)."""

    def place() -> None:
        # Out of the way first: either may already be 3 or 4.
        read, write = os.dup(command_read), os.dup(answer_write)
        os.dup2(read, 3)
        os.dup2(write, 4)

    return place
