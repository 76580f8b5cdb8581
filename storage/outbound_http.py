"""An HTTP connection to addresses the URL policy checked, with one hard deadline: the API's image
fetches (`api.remote_images`) and the worker's webhook deliveries (`worker.webhook_http`).

A socket timeout bounds each operation, so a server that drips a byte every few seconds keeps a
request alive indefinitely. Here each connect gets the time left, and from the TLS handshake on a
timer shuts the socket down at the deadline, which ends whatever read or write is blocked on it.
The connection goes to the checked addresses, never to a fresh lookup of the name (no DNS
rebinding between check and connect); TLS still sends and verifies the URL's host name.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import SplitResult

from storage.url_policy import Address


def connect_to(addresses: list[Address], port: int, deadline: float) -> socket.socket:
    """A TCP connection to the first of `addresses` (checked ones) that answers, each try given the time left."""
    error: OSError = OSError("no address to connect to")
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        try:
            return socket.create_connection((str(address), port), timeout=remaining)
        except TimeoutError:
            raise
        except OSError as e:
            error = e
    raise error


class DeadlineConnection:
    """`connection` (http.client, already connected to one of `addresses`, TLS handshake done) until
    `deadline` (a time.monotonic() value). Use it as a context manager; `fired` says whether the deadline
    shut the socket down (then what failed or looked like the end of a body is a timeout)."""

    def __init__(self, parts: SplitResult, addresses: list[Address], deadline: float) -> None:
        assert parts.hostname is not None  # the policy refuses URLs without a host
        port = parts.port or (443 if parts.scheme == "https" else 80)
        sock = connect_to(addresses, port, deadline)
        self.connection: http.client.HTTPConnection
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(
                sock, server_hostname=parts.hostname, do_handshake_on_connect=False
            )
            self.connection = http.client.HTTPSConnection(parts.hostname, port)
        else:
            self.connection = http.client.HTTPConnection(parts.hostname, port)
        self.connection.sock = sock  # already connected: http.client does not look the name up again
        self.sock = sock
        self.fired = threading.Event()
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._shut_down)
        self.timer.daemon = True
        self.timer.start()
        try:
            if isinstance(sock, ssl.SSLSocket):
                sock.do_handshake()
        except BaseException as e:
            self.close()
            if self.fired.is_set():
                raise TimeoutError("deadline passed") from e
            raise

    def _shut_down(self) -> None:
        self.fired.set()
        try:
            # socket.socket's own shutdown, not SSLSocket's: that one also drops the TLS state a handshake
            # in progress on another thread is using
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.timer.cancel()
        self.connection.close()  # http.client drops connection.sock once a response says it closes the connection
        self.sock.close()

    def __enter__(self) -> DeadlineConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
