"""A webhook receiver for tests: an HTTP server in a thread that records every delivery.

A path ending in `/fail-N` answers 500 to its first N deliveries, then 204; a path ending in
`/redirect` answers 302 to `redirect_to`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.waiting import wait_for


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]  # lowercased names
    body: bytes
    status: int  # what the receiver answered
    received_at: float = 0.0  # time.monotonic() on arrival

    @property
    def payload(self) -> dict:
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, redirect_to: str | None = None) -> None:
        self.host = host
        self.redirect_to = redirect_to
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver._status_for(self.path)
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(
                            self.path, {k.lower(): v for k, v in self.headers.items()}, body, status, time.monotonic()
                        )
                    )
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", receiver.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _status_for(self, path: str) -> int:
        if path.endswith("/redirect"):
            return 302
        match = re.search(r"/fail-(\d+)$", path)
        if match is None:
            return 204
        with self._lock:
            num_seen = sum(1 for d in self.deliveries if d.path == path)
        return 500 if num_seen < int(match.group(1)) else 204

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.server.server_port}{path}"

    def received(self, path: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def wait_for(self, path: str, predicate, timeout: float = 60.0) -> list[Delivery]:
        """Wait until predicate(deliveries to path) holds; fail with what arrived after `timeout`."""

        def arrived() -> list[Delivery] | None:
            got = self.received(path)
            return got if predicate(got) else None

        return wait_for(
            arrived,
            timeout,
            lambda: f"webhook deliveries to {path}: {[(d.status, d.body[:200]) for d in self.received(path)]}",
            interval=0.05,
        )

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
