"""One webhook POST under one hard deadline for the whole attempt: connect, send and read.

An HTTP client's timeout bounds each socket operation, so a receiver that answers one byte
every few seconds keeps an attempt alive indefinitely (a probe saw one "succeed" after 201 s
with a 10 s timeout). Here a timer shuts the socket down when the deadline passes, which ends
whatever read or write is blocked on it, and every socket operation is also bounded by the
deadline. The connection goes to the addresses the URL policy checked for this attempt
(`storage.url_policy.webhook_addresses`), never to a fresh lookup of the name, so a name
cannot re-resolve to a refused address between check and connect. Redirects are never
followed (http.client does not follow them).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from storage.url_policy import Address, connect_to


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


def post_within(
    url: str, addresses: list[Address], body: bytes, headers: dict[str, str], seconds: float, *, deadline: float
) -> int:
    """POST `body` to `url` at the first of `addresses` that answers; return the response status. Raises
    AttemptDeadlineError when the attempt is not done by `deadline` (a time.monotonic() value, the end of the
    attempt's `seconds`), OSError or http.client.HTTPException otherwise."""
    parts = urlsplit(url)
    assert parts.hostname is not None  # the policy refuses URLs without a host
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, port)  # for the Host header: it never connects on its own
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watchdog = _Watchdog(connection, max(0.0, deadline - time.monotonic()))
    watchdog.timer.start()
    try:
        connection.sock = connect_to(addresses, port, deadline)  # each operation bounded by the time left
        if watchdog.fired.is_set():  # connected just as the deadline passed, before the timer saw a socket
            raise AttemptDeadlineError(f"no answer within {seconds:g}s")
        if parts.scheme == "https":  # the handshake runs on connection.sock, which the timer shuts down
            connection.sock = ssl.create_default_context().wrap_socket(connection.sock, server_hostname=parts.hostname)
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()  # status line and headers; the body is not read
        return response.status
    except (OSError, http.client.HTTPException) as e:
        if watchdog.fired.is_set() or time.monotonic() >= deadline:
            raise AttemptDeadlineError(f"no answer within {seconds:g}s") from e
        raise
    finally:
        watchdog.timer.cancel()
        connection.close()
