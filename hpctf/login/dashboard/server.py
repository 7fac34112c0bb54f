"""The dashboard's web server: the standard library's threading HTTP server on the loopback
interface, read-only, behind a token.

- It binds 127.0.0.1 only: nobody on another host reaches it; another user of the same host
  (a shared login node) reaches the port but not the token.
- The token (``secrets.token_urlsafe``) is in the URL printed once, as Jupyter's is; the first
  visit trades it for a cookie (HttpOnly, SameSite=Strict) and is sent on without it, so the
  token leaves the address bar and the history. Every request, the page's own files included,
  shows the token (cookie, ``?token=``) or gets 401; compared with ``hmac.compare_digest``.
- A request whose Host header is not this loopback address and port gets 403 before anything
  else: a page elsewhere cannot reach it through a DNS name rebound to 127.0.0.1.
- GET and HEAD only; the page's data is JSON from the typed calls
  (:mod:`hpctf.login.calls.pages`), one call per request, through the :class:`Source` given
  (here, or the login host over SSH). Run data reaches the page as JSON and is put in the page
  as text (``textContent``), never as markup; the page's Content-Security-Policy allows no
  script but its own files.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import traceback
from collections.abc import Callable
from http import cookies
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hpctf.core.errors import EnvironmentProblem, UserError, environment_line
from hpctf.core.secrets import redact
from hpctf.login.calls.models import (
    Request,
    Result,
    RunPageRequest,
    RunsPageRequest,
    SweepPageRequest,
)

HOST = "127.0.0.1"
COOKIE = "hpctf_ui_token"


def cookie_name(port: int) -> str:
    """The token's cookie for the dashboard on ``port``: a browser sends a host's cookies to
    every port of it (RFC 6265, section 8.5), so two dashboards of one user on one host each
    keep their own."""
    return f"{COOKIE}_{port}"

# The page's own files, by name: nothing else is served from the package.
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}

Source = Callable[[Request], Result]


class Dashboard(ThreadingHTTPServer):
    """The server: its token and where its pages' data comes from (``source``: a typed call
    answered here, or on the login host over SSH)."""

    daemon_threads = True

    def __init__(
        self, source: Source, port: int = 0, defaults: dict[str, Any] | None = None
    ) -> None:
        super().__init__((HOST, port), Handler)
        self.source = source
        self.token = secrets.token_urlsafe(32)
        # What every runs page asks (the runs root or the site), from the command line.
        self.defaults = defaults or {}

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The address to open, token included."""
        return f"http://{HOST}:{self.port}/?token={self.token}"


class Handler(BaseHTTPRequestHandler):
    server: Dashboard
    server_version = "hpctf-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a refresh every few seconds is no news (and a URL may hold the token)."""

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._host_allowed():
            self._send(403, b"forbidden: not a loopback Host\n", "text/plain")
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        given = query.get("token")
        if given is not None and self._token_matches(given):
            # Traded for a cookie; the token leaves the address bar.
            self._redirect(url.path, f"{cookie_name(self.server.port)}={self.server.token}")
            return
        if not self._token_matches(self._cookie()):
            self._send(401, b"unauthorized: open the URL hpctf ui printed\n", "text/plain")
            return
        if url.path.startswith("/api/"):
            self._api(url.path[5:], query)
        else:
            self._static(url.path.lstrip("/") or "index.html")

    def _host_allowed(self) -> bool:
        host = self.headers.get("Host", "")
        return host in {f"{HOST}:{self.server.port}", f"localhost:{self.server.port}"}

    def _token_matches(self, given: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(given.encode(), self.server.token.encode())

    def _cookie(self) -> str | None:
        jar = cookies.SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except cookies.CookieError:
            return None
        morsel = jar.get(cookie_name(self.server.port))
        return None if morsel is None else morsel.value

    def _static(self, name: str) -> None:
        kind = STATIC.get(name)
        if kind is None:
            self._send(404, b"not found\n", "text/plain")
            return
        body = resources.files("hpctf.login.dashboard").joinpath("static", name).read_bytes()
        self._send(200, body, kind)

    def _api(self, name: str, query: dict[str, str]) -> None:
        try:
            request = page_request(name, query, self.server.defaults)
        except (ValueError, KeyError) as exc:
            self._json(400, {"error": f"bad request: {exc}"})
            return
        if request is None:
            self._json(404, {"error": f"no page {name!r}"})
            return
        try:
            result = self.server.source(request)
        except UserError as exc:
            self._json(400, {"error": redact(str(exc))})
        except EnvironmentProblem as exc:
            self._json(503, {"error": redact(environment_line(exc))})
        except Exception:  # ours: the traceback on the server's terminal, one line to the page
            traceback.print_exc(file=sys.stderr)
            self._json(500, {"error": "hpctf ui failed: see its terminal (a bug in hpctf)"})
        else:
            self._send(200, result.model_dump_json().encode(), "application/json")

    def _json(self, status: int, data: dict[str, Any]) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _redirect(self, path: str, cookie: str) -> None:
        self.send_response(303)
        self.send_header("Location", path or "/")
        self.send_header("Set-Cookie", f"{cookie}; HttpOnly; SameSite=Strict; Path=/")
        for key, value in HEADERS.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def page_request(name: str, query: dict[str, str], defaults: dict[str, Any]) -> Request | None:
    """The typed call of one page's refresh (``/api/NAME?...``), or None for no such page."""
    hours = query.get("hours") == "1"
    if name == "runs":
        return RunsPageRequest(hours=hours, **defaults)
    if name == "run":
        return RunPageRequest(run_dir=query["path"], rank=int(query.get("rank", "0")), hours=hours)
    if name == "sweep":
        return SweepPageRequest(sweep_dir=query["path"])
    return None
