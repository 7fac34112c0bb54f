"""A webhook receiver on loopback for notify:'s tests (tests/test_notify.py, the real-Slurm
run of tests/test_lifecycle.py): http.server in a thread, every JSON body it got."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

URL_SECRET = "T000/B000/XXXXSECRETXXXX"


class Receiver:
    """A webhook receiver on loopback, in a thread: every JSON body it got."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                got.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{URL_SECRET}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
