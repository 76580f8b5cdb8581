"""One webhook POST under one hard deadline for the whole attempt: connect, send and read.

An HTTP client's timeout bounds each socket operation, so a receiver that answers one byte
every few seconds keeps an attempt alive indefinitely (a probe saw one "succeed" after 201 s
with a 10 s timeout). Here a timer shuts the socket down when the deadline passes, which ends
whatever read or write is blocked on it, and every socket operation is also bounded by the
deadline. Redirects are never followed (http.client does not follow them).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from urllib.parse import urlsplit


class AttemptDeadlineError(TimeoutError):
    """The receiver did not take the request and answer its status line and headers in time."""


class _Watchdog:
    """Shuts a connection's socket down at the deadline; `fired` says whether it did."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.connection = connection
        self.fired = threading.Event()
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired.set()
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def post_within(url: str, body: bytes, headers: dict[str, str], seconds: float) -> int:
    """POST `body` to `url`; return the response status. Raises AttemptDeadlineError when the
    whole attempt takes longer than `seconds`, OSError or http.client.HTTPException otherwise."""
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=seconds)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watchdog = _Watchdog(connection, seconds)
    started = time.monotonic()
    watchdog.timer.start()
    try:
        connection.connect()
        if watchdog.fired.is_set():  # connected just as the deadline passed, before the timer saw a socket
            raise AttemptDeadlineError(f"no answer within {seconds:g}s")
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()  # status line and headers; the body is not read
        return response.status
    except (OSError, http.client.HTTPException) as e:
        if watchdog.fired.is_set() or time.monotonic() - started >= seconds:
            raise AttemptDeadlineError(f"no answer within {seconds:g}s") from e
        raise
    finally:
        watchdog.timer.cancel()
        connection.close()
